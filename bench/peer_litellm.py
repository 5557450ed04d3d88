"""LiteLLM's proxy with its response cache on, run as its own process, as a user would: the peer
`bench_cache --litellm` stands the edge's HIT beside.

LiteLLM is not a dependency of the project, and never goes in its venv: install it in one of its
own (`python3 -m venv litellm-venv && litellm-venv/bin/pip install 'litellm[proxy]'`) and pass
`--litellm litellm-venv/bin/litellm` or set `EDGELLM_LITELLM`. Without it the bench says so and
skips that row, never a made-up figure. It runs offline: the model cost map is the packaged one
(`LITELLM_LOCAL_MODEL_COST_MAP`), telemetry is off, and its one upstream is a loopback URL.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

from bench.edge_process import free_port, running_process

ENV_VAR = "EDGELLM_LITELLM"
HIT_HEADER = "x-litellm-cache-key"  # LiteLLM's proxy names the cache key on an answer from its cache

# In-memory response cache ("local"), no database, no master key: the edge beside it runs in open
# mode on loopback too, so neither pays for a key check the other skips.
CONFIG = """\
model_list:
  - model_name: "{model}"
    litellm_params:
      model: "openai/{model}"
      api_base: "{upstream}/v1"
      api_key: unused
litellm_settings:
  cache: true
  cache_params:
    type: local
  telemetry: false
general_settings:
  dangerously_permit_weak_or_unset_master_key: true
"""

OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the cost map packaged with it, not fetched
    "LITELLM_TELEMETRY": "False",
    "LITELLM_MODE": "PRODUCTION",  # no .env loading from the working directory
    "NO_DOCS": "True",
}


def find_litellm(flag: str | None) -> Path | None:
    """The `--litellm` flag, else $EDGELLM_LITELLM, else None (with the reason printed)."""
    chosen = flag or os.environ.get(ENV_VAR)
    if not chosen:
        print(f"LiteLLM: not given (--litellm PATH or ${ENV_VAR}, the `litellm` script of a venv with 'litellm[proxy]'): "
              "its rows are skipped")
        return None
    path = Path(chosen)
    if not (path.is_file() and os.access(path, os.X_OK)):
        print(f"LiteLLM: {path} is not an executable file: its rows are skipped")
        return None
    return path


def version(binary: Path) -> str:
    """The installed litellm's version, read from its venv's metadata (no network)."""
    python = binary.parent / "python"
    try:
        out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


@contextlib.contextmanager
def running_litellm(binary: Path, upstream: str, model: str, pids: dict[str, int] | None = None) -> Iterator[str]:
    """LiteLLM's proxy on a free loopback port in front of `upstream` (an OpenAI-compatible URL),
    serving `model` under the same name; yields its URL and stops it whatever happens."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="edgellm-litellm-") as scratch:
        config = Path(scratch) / "config.yaml"
        config.write_text(CONFIG.format(model=model, upstream=upstream))
        env = {**os.environ, **OFFLINE_ENV}
        for name in ("LITELLM_MASTER_KEY", "DATABASE_URL"):  # the caller's own proxy settings stay out of it
            env.pop(name, None)
        command = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
        url = f"http://127.0.0.1:{port}"
        with running_process("LiteLLM", command, url + "/health/liveliness", ready_within=180, stop_within=15, env=env,
                             cwd=scratch, log=Path(scratch) / "litellm.log", pids=pids, url=url):
            yield url
