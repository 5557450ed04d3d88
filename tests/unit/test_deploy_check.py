"""`edgellm deploy-check` and `make deploy`: what a deploy needs is checked before wrangler deploys.

The account checks run against a stub `wrangler` on PATH (it answers like wrangler 4.86 does and
logs every call); one test runs the real wrangler, offline and not logged in, to hold the stub to
what wrangler says and to run the real dry run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm_local.deploy_check import check_ids, load_config

ROOT = Path(__file__).resolve().parents[2]
REAL_KV_ID = "0f2ac74b498b48028cb68387df89fa4b"

STUB = r'''#!{python}
"""A stand-in wrangler: answers from $STUB_* and appends each call to $STUB_LOG."""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if args[:1] == ["whoami"]:
    if os.environ.get("STUB_LOGGED_IN") == "1":
        print("You are logged in with an OAuth Token, associated with the email dev@example.com.")
    else:  # wrangler 4.86 exits 0 here
        print("You are not authenticated. Please run `wrangler login`.")
elif args[:2] == ["secret", "list"] and os.environ.get("STUB_NO_WORKER") == "1":
    sys.stderr.write("\x1b[31m\u2718 \x1b[41;31m[\x1b[41;97mERROR\x1b[41;31m]\x1b[0m \x1b[1mThis Worker does not exist on your account. [code: 10007]\x1b[0m\n\n")
    sys.stderr.write('\U0001fab5  Logs were written to "/root/.config/.wrangler/logs/wrangler.log"\n')
    sys.exit(1)
elif args[:2] == ["secret", "list"]:
    print(json.dumps([{{"name": n, "type": "secret_text"}} for n in os.environ.get("STUB_SECRETS", "").split(",") if n]))
elif args[:3] == ["kv", "key", "list"]:
    print(json.dumps([{{"name": "access/keys/k1"}}] if os.environ.get("STUB_KEYS") == "1" else []))
elif args[:2] == ["vectorize", "get"] and os.environ.get("STUB_NO_INDEX") == "1":
    sys.stderr.write("\x1b[31m\u2718 [ERROR]\x1b[0m A request to the Cloudflare API failed. vectorize.not_found [code: 3000]\n")
    sys.exit(1)
elif args[:2] == ["vectorize", "get"]:  # wrangler 4.86 `vectorize get NAME --json`: the index as the API gives it
    print(json.dumps({{"name": args[2], "config": {{"dimensions": int(os.environ.get("STUB_INDEX_DIMENSIONS", "384")),
                                                  "metric": "cosine"}}, "created_on": "2026-01-01T00:00:00Z"}}))
elif args[:1] == ["deploy"]:
    if "--dry-run" in args:
        print("--dry-run: exiting now.")
    else:
        print("Deployed edgellm")
sys.exit(0)
'''


def config_copy(tmp_path: Path, **replace: str) -> Path:
    text = (ROOT / "wrangler.toml").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "wrangler.toml"
    path.write_text(text)
    return path


def with_real_ids(tmp_path: Path) -> Path:
    return config_copy(tmp_path, **{'id = "00000000000000000000000000000000"': f'id = "{REAL_KV_ID}"'})


@pytest.fixture
def stub(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "wrangler"
    script.write_text(STUB.format(python=sys.executable))
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUB_", "EDGELLM_WRANGLER"))}
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "STUB_LOG": str(tmp_path / "calls.log")}


def calls(env: dict[str, str]) -> list[list[str]]:
    log = Path(env["STUB_LOG"])
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def deploy_check(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgellm_local.deploy_check", "--config", str(config)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=60)


def test_zero_and_placeholder_ids_fail_with_the_command_that_fixes_them(tmp_path: Path) -> None:
    zero = {c.name: c for c in check_ids(load_config(config_copy(tmp_path)))}
    assert not zero["KV namespace CACHE"].ok
    assert "npx wrangler kv namespace create CACHE" in zero["KV namespace CACHE"].fix
    assert zero["rate limiter RATE_LIMITER"].ok and zero["R2 bucket ARTIFACTS"].ok
    placeholder = config_copy(tmp_path, **{'id = "00000000000000000000000000000000"': 'id = "<your-kv-id>"',
                                           'namespace_id = "1001"': 'namespace_id = "0"',
                                           'bucket_name = "edgellm-artifacts"': 'bucket_name = ""'})
    found = {c.name: c for c in check_ids(load_config(placeholder))}
    assert [n for n, c in found.items() if not c.ok] == ["KV namespace CACHE", "R2 bucket ARTIFACTS", "rate limiter RATE_LIMITER"]
    assert all(c.ok for c in check_ids(load_config(with_real_ids(tmp_path))))


def test_not_logged_in_fails_and_skips_the_account_checks(tmp_path: Path, stub: dict[str, str]) -> None:
    done = deploy_check(with_real_ids(tmp_path), stub)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[FAIL] wrangler login" in done.stdout and "npx wrangler login" in done.stdout
    assert "Nothing was deployed" in done.stdout
    made = calls(stub)
    assert ["whoami"] in made
    assert not any(c[:2] == ["secret", "list"] for c in made)
    assert [c for c in made if c[0] == "deploy"] == [["deploy", "--dry-run", "--outdir", "dist"]]


def test_logged_in_without_secret_or_key_says_what_to_run(tmp_path: Path, stub: dict[str, str]) -> None:
    done = deploy_check(with_real_ids(tmp_path), {**stub, "STUB_LOGGED_IN": "1"})
    assert done.returncode == 1
    assert "[ok  ] wrangler login" in done.stdout
    assert "[FAIL] secret ADMIN_TOKEN" in done.stdout and "npx wrangler secret put ADMIN_TOKEN" in done.stdout
    assert "[FAIL] API key" in done.stdout and "edgellm keys create" in done.stdout
    assert "[ok  ] dry run" in done.stdout


def test_a_worker_not_yet_created_says_what_wrangler_said(tmp_path: Path, stub: dict[str, str]) -> None:
    done = deploy_check(with_real_ids(tmp_path), {**stub, "STUB_LOGGED_IN": "1", "STUB_NO_WORKER": "1", "STUB_KEYS": "1"})
    assert done.returncode == 1
    line = next(x for x in done.stdout.splitlines() if x.startswith("[FAIL] secret ADMIN_TOKEN"))
    assert "This Worker does not exist on your account. [code: 10007]" in line and "\x1b" not in line, line
    assert "creates the Worker if it does not exist yet" in done.stdout


def test_usage_account_asks_for_its_token_secret(tmp_path: Path, stub: dict[str, str]) -> None:
    config = config_copy(tmp_path, **{'id = "00000000000000000000000000000000"': f'id = "{REAL_KV_ID}"',
                                      '[vars]\n': '[vars]\nANALYTICS_ACCOUNT_ID = "abc123"\n'})
    done = deploy_check(config, {**stub, "STUB_LOGGED_IN": "1", "STUB_SECRETS": "ADMIN_TOKEN", "STUB_KEYS": "1"})
    assert done.returncode == 1
    assert "[ok  ] secret ADMIN_TOKEN" in done.stdout
    assert "[FAIL] secret ANALYTICS_API_TOKEN" in done.stdout


def test_everything_in_place_passes(tmp_path: Path, stub: dict[str, str]) -> None:
    done = deploy_check(with_real_ids(tmp_path), {**stub, "STUB_LOGGED_IN": "1", "STUB_SECRETS": "ADMIN_TOKEN", "STUB_KEYS": "1"})
    assert done.returncode == 0, done.stdout
    assert "FAIL" not in done.stdout and "all checks passed" in done.stdout


def make_deploy(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`make deploy` from a copy of the Makefile, the installs it depends on taken as done."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    return subprocess.run(["make", "-s", "deploy", f"BIN={Path(sys.executable).parent}",
                           "-o", ".venv/.installed-local", "-o", "node_modules/.installed"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_make_deploy_stops_before_deploying_when_a_check_fails(tmp_path: Path, stub: dict[str, str]) -> None:
    config_copy(tmp_path)  # zero KV id
    done = make_deploy(tmp_path, {**stub, "STUB_LOGGED_IN": "1", "STUB_SECRETS": "ADMIN_TOKEN"})
    assert done.returncode != 0
    assert "[FAIL] KV namespace CACHE" in done.stdout
    assert ["deploy"] not in calls(stub)


def test_make_deploy_deploys_once_every_check_passes(tmp_path: Path, stub: dict[str, str]) -> None:
    with_real_ids(tmp_path)
    done = make_deploy(tmp_path, {**stub, "STUB_LOGGED_IN": "1", "STUB_SECRETS": "ADMIN_TOKEN", "STUB_KEYS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls(stub)[-1] == ["deploy"]


def test_the_real_wrangler_offline_not_logged_in(tmp_path: Path) -> None:
    """The real wrangler 4.86: whoami exits 0 yet says "not authenticated" (read as a failure),
    and the real dry run of the project's wrangler.toml builds the bundle offline."""
    assert (ROOT / "node_modules" / ".bin" / "wrangler").exists(), "run `make setup-test` (npm install) first"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOUDFLARE_", "EDGELLM_WRANGLER"))}
    env.update(WRANGLER_SEND_METRICS="false", CI="true", HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / ".config"))
    env["PATH"] = f"{ROOT / 'node_modules' / '.bin'}:{env['PATH']}"
    done = subprocess.run([sys.executable, "-c", "import sys; from edgellm_local import deploy_check as d; "
                           "cs = d.run_checks(d.Path('wrangler.toml'), ['wrangler']); "
                           "print('\\n'.join(c.line() for c in cs))"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "[FAIL] wrangler login" in done.stdout, done.stdout
    assert "[FAIL] KV namespace CACHE" in done.stdout
    assert "[ok  ] dry run" in done.stdout, done.stdout


@pytest.mark.parametrize(("stub_env", "line"), [
    ({"STUB_INDEX_DIMENSIONS": "384"}, "[ok  ] semantic index VECTORIZE: edgellm-semantic holds 384 dimensions, as @cf/baai/bge-small-en-v1.5 makes"),
    ({"STUB_INDEX_DIMENSIONS": "768"}, "[FAIL] semantic index VECTORIZE: the semantic cache's embedding model @cf/baai/bge-small-en-v1.5"),
    ({"STUB_NO_INDEX": "1"}, "[FAIL] semantic index VECTORIZE: cannot read the index edgellm-semantic"),
], ids=["same-width", "other-width", "no-index"])
def test_the_vectorize_index_is_held_to_the_embedding_models_width(tmp_path: Path, stub: dict[str, str], stub_env: dict[str, str],
                                                                   line: str) -> None:
    """The index's dimension is fixed when it is made and known to the Worker only from its first
    query; the deploy check reads it from the account (`wrangler vectorize get --json`) and holds
    it to the width Cloudflare's catalog gives the first of EMBEDDING_MODELS."""
    done = deploy_check(with_real_ids(tmp_path), {**stub, "STUB_LOGGED_IN": "1", "STUB_SECRETS": "ADMIN_TOKEN", "STUB_KEYS": "1",
                                                  **stub_env})
    assert any(x.startswith(line) for x in done.stdout.splitlines()), done.stdout
    assert done.returncode == (0 if line.startswith("[ok") else 1), done.stdout
    assert ["vectorize", "get", "edgellm-semantic", "--json"] in calls(stub)
    if "768" in stub_env.values():
        assert "holds 768" in done.stdout and "--dimensions=384" in done.stdout  # and the command that makes a fitting one


def test_an_embedding_model_of_unknown_width_is_said_to_be_unchecked(tmp_path: Path, stub: dict[str, str]) -> None:
    config = config_copy(tmp_path, **{'id = "00000000000000000000000000000000"': f'id = "{REAL_KV_ID}"',
                                      'EMBEDDING_MODELS = "@cf/baai/bge-small-en-v1.5"': 'EMBEDDING_MODELS = "@cf/example/embedder"'})
    done = deploy_check(config, {**stub, "STUB_LOGGED_IN": "1", "STUB_SECRETS": "ADMIN_TOKEN", "STUB_KEYS": "1"})
    line = next(x for x in done.stdout.splitlines() if x.startswith("[ok  ] semantic index VECTORIZE"))
    assert "not checked" in line and "first" in line, line
