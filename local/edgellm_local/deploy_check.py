"""`edgellm deploy-check`: what must be true before `wrangler deploy` can end with a working edge.

Wrangler itself accepts a wrangler.toml whose KV id is all zeros and deploys a Worker whose every
call is a 401, so these checks say, one line each, what is still missing and the command that
fixes it: logged in (`wrangler whoami`, which exits 0 even when it is not, so its words are read),
the ids in wrangler.toml, the secrets, a key in the deployed KV, and the dry run. `make deploy`
runs them and deploys only when none failed. Each check is a function of the config text and a
`run` callable with `subprocess.run`'s signature, so the tests drive them with a stub wrangler.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from edgellm.guardrails.policy import PolicyError, parse_policy
from edgellm.vars import check_vars as vars_problems

Runner = Callable[..., "subprocess.CompletedProcess[str]"]
_PLACEHOLDER = re.compile(r"^(0+|<.*>|x+|todo|changeme|your[-_].*|)$", re.IGNORECASE)
_KV_ID = re.compile(r"^[0-9a-f]{32}$")
WRANGLER_TIMEOUT_S = 180


@dataclass(frozen=True)
class Check:
    """One finding: `ok` False means a real deploy would not end working; `fix` says what to do."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        text = f"[{mark}] {self.name}: {self.detail}"
        return text + (f"\n       -> {self.fix}" if self.fix and not self.ok else "")


def load_config(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def check_vars(config: dict[str, Any]) -> list[Check]:
    """The [vars] as the Worker will read them: an unknown name (a typo the Worker would ignore,
    leaving the default in force), a TOML value of a type it cannot read, a secret written into
    the file, a value the config refuses. Each would deploy fine and then misbehave (or answer
    `worker_misconfigured` to every request), so each stops the deploy here."""
    values = config.get("vars", {})
    if not isinstance(values, dict):
        return [Check("[vars]", False, "is not a table", "write [vars] as a TOML table of NAME = \"value\" lines")]
    problems = vars_problems(values)
    if not problems:
        return [Check("[vars]", True, f"{len(values)} value(s), each known and readable")]
    return [Check("[vars]", False, problem, "fix it in wrangler.toml (docs/operations.md lists every name and its values)")
            for problem in problems]


def check_guardrails(config: dict[str, Any]) -> list[Check]:
    """GUARDRAILS, parsed as the Worker will parse it at start: an unknown category, detector or
    action would make every request fail there, so it stops the deploy here, named."""
    values = config.get("vars", {})
    if not isinstance(values, dict) or "GUARDRAILS" not in values:
        return []
    try:
        policy = parse_policy(values["GUARDRAILS"])
    except PolicyError as exc:
        return [Check("GUARDRAILS", False, str(exc), "fix it in wrangler.toml (docs/guardrails.md gives the format)")]
    rules = len(policy.prompt) + len(policy.answer) + len(policy.dlp)
    return [Check("GUARDRAILS", True, f"{rules} rule(s), each a known category or detector and action")]


def check_ids(config: dict[str, Any]) -> list[Check]:
    """The KV namespace ids (made by `wrangler kv namespace create`) and the rate limiter's
    namespace id (any positive integer you choose, unique in the account)."""
    checks = []
    for ns in config.get("kv_namespaces", []):
        binding, ns_id = ns.get("binding", "?"), str(ns.get("id", ""))
        if _PLACEHOLDER.match(ns_id) or not _KV_ID.match(ns_id):
            checks.append(Check(f"KV namespace {binding}", False, f"id is {ns_id!r}, not a namespace's id",
                                f"npx wrangler kv namespace create {binding}, then put the id it prints in wrangler.toml"))
        else:
            checks.append(Check(f"KV namespace {binding}", True, f"id {ns_id}"))
    for bucket in config.get("r2_buckets", []):
        name = str(bucket.get("bucket_name", ""))
        ok = not _PLACEHOLDER.match(name)
        checks.append(Check(f"R2 bucket {bucket.get('binding', '?')}", ok, f"bucket_name {name!r}",
                            "npx wrangler r2 bucket create <name>, and that name as bucket_name in wrangler.toml"))
    for limiter in config.get("ratelimits", []):
        ns_id = str(limiter.get("namespace_id", ""))
        ok = ns_id.isdigit() and int(ns_id) > 0
        checks.append(Check(f"rate limiter {limiter.get('name', '?')}", ok, f"namespace_id {ns_id!r}",
                            "set namespace_id to a positive integer no other Worker of the account uses"))
    return checks


def _output(done: "subprocess.CompletedProcess[str]") -> str:
    return f"{done.stdout or ''}\n{done.stderr or ''}"


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _last_line(text: str) -> str:
    """What wrangler said went wrong: its `[ERROR]` line if any, else its last line, without the
    colours and the "Logs were written to" line it ends every failure with."""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line and "Logs were written to" not in line]
    errors = [line.split("[ERROR]", 1)[1].strip() for line in lines if "[ERROR]" in line]
    return (errors or lines or ["no output"])[-1]


def check_login(wrangler: Sequence[str], run: Runner) -> Check:
    done = run([*wrangler, "whoami"], capture_output=True, text=True, timeout=WRANGLER_TIMEOUT_S)
    out = _output(done)
    if done.returncode != 0 or "not authenticated" in out.lower() or "logged in" not in out.lower():
        return Check("wrangler login", False, _last_line(out),
                     "npx wrangler login (or set CLOUDFLARE_API_TOKEN and CLOUDFLARE_ACCOUNT_ID)")
    who = next((line.strip() for line in out.splitlines() if "logged in" in line.lower()), "logged in")
    return Check("wrangler login", True, who)


def required_secrets(config: dict[str, Any]) -> list[str]:
    """ADMIN_TOKEN turns on /admin/* and /usage; ANALYTICS_API_TOKEN is needed once the usage page
    is pointed at an account (ANALYTICS_ACCOUNT_ID), and each origin's token_secret."""
    names = ["ADMIN_TOKEN"]
    env_vars = config.get("vars", {})
    if env_vars.get("ANALYTICS_ACCOUNT_ID"):
        names.append("ANALYTICS_API_TOKEN")
    try:
        origins = json.loads(env_vars.get("ORIGINS", "[]"))
    except ValueError:
        origins = []
    names += [o["token_secret"] for o in origins if isinstance(o, dict) and o.get("token_secret")]
    return names


def check_secrets(config: dict[str, Any], wrangler: Sequence[str], run: Runner) -> list[Check]:
    wanted = required_secrets(config)
    done = run([*wrangler, "secret", "list", "--format", "json"], capture_output=True, text=True, timeout=WRANGLER_TIMEOUT_S)
    have: set[str] = set()
    if done.returncode == 0:
        try:
            have = {s.get("name") for s in json.loads(done.stdout or "[]") if isinstance(s, dict)}
        except ValueError:
            pass
    checks = []
    for name in wanted:
        if name in have:
            checks.append(Check(f"secret {name}", True, "set"))
        else:
            why = "not set" if done.returncode == 0 else f"cannot list secrets ({_last_line(_output(done))})"
            checks.append(Check(f"secret {name}", False, why,
                                f"npx wrangler secret put {name} (creates the Worker if it does not exist yet)"))
    return checks


def check_analytics(config: dict[str, Any]) -> Check:
    account = config.get("vars", {}).get("ANALYTICS_ACCOUNT_ID", "")
    if account:
        return Check("usage page", True, f"ANALYTICS_ACCOUNT_ID {account}")
    return Check("usage page", True, "ANALYTICS_ACCOUNT_ID not set: /usage and /admin/usage answer usage_not_queryable "
                 "(optional; set it in [vars] and the ANALYTICS_API_TOKEN secret to turn them on)")


def check_key(config: dict[str, Any], wrangler: Sequence[str], run: Runner) -> Check:
    """With OPEN_ACCESS false every call is a 401 until a key's record is in the deployed KV."""
    if str(config.get("vars", {}).get("OPEN_ACCESS", "false")).lower() in ("true", "1", "yes"):
        return Check("API key", True, "OPEN_ACCESS is true: calls need no key")
    done = run([*wrangler, "kv", "key", "list", "--binding", "CACHE", "--remote", "--prefix", "access/keys/"],
               capture_output=True, text=True, timeout=WRANGLER_TIMEOUT_S)
    fix = ("edgellm keys create --tenant <name>, then run the `npx wrangler kv key put ... --remote` line it prints "
           "(keep the el-... key it shows once)")
    if done.returncode != 0:
        return Check("API key", False, f"cannot list keys in KV ({_last_line(_output(done))})", fix)
    try:
        keys = json.loads(done.stdout or "[]")
    except ValueError:
        keys = []
    if not keys:
        return Check("API key", False, "no key in the deployed CACHE namespace: every call would be a 401", fix)
    return Check("API key", True, f"{len(keys)} key record(s) in KV")


def check_index(config: dict[str, Any], wrangler: Sequence[str], run: Runner) -> list[Check]:
    """The semantic index's dimension against the embedding model's width. Vectorize fixes the
    dimension when the index is made, and the Worker learns it only from its first query (which
    then fails, as every later one would); so it is read from the account here and held to the
    width Cloudflare's catalog gives the first of EMBEDDING_MODELS (a model the catalog lacks is
    known only from its first answer: said, not checked)."""
    from edgellm.config import Config, embedding_width, index_width_problem

    indexes = [i for i in config.get("vectorize", []) if isinstance(i, dict) and i.get("index_name")]
    try:
        settings = Config.from_env({k: str(v) for k, v in config.get("vars", {}).items()})
    except ValueError:
        return []  # the [vars] check says what is wrong
    if not indexes or not settings.embedding_models:
        return []
    model = settings.embedding_models[0]
    checks = []
    for index in indexes:
        name, binding = str(index["index_name"]), f"semantic index {index.get('binding', '?')}"
        width = embedding_width(model)
        make = f"npx wrangler vectorize create {name} --dimensions={width or '<its width>'} --metric=cosine"
        if width is None:
            checks.append(Check(binding, True, f"{model}'s width is known only from its first answer: not checked "
                                "(a mismatch fails the first semantic lookup)"))
            continue
        done = run([*wrangler, "vectorize", "get", name, "--json"], capture_output=True, text=True, timeout=WRANGLER_TIMEOUT_S)
        try:
            dimensions = int(json.loads(done.stdout)["config"]["dimensions"]) if done.returncode == 0 else None
        except (ValueError, KeyError, TypeError):
            dimensions = None
        if dimensions is None:
            checks.append(Check(binding, False, f"cannot read the index {name} ({_last_line(_output(done))})",
                                f"{make}, then {' '.join(wrangler)} vectorize create-metadata-index {name} "
                                "--property-name=context --type=string"))
            continue
        problem = index_width_problem(settings, dimensions, f"the Vectorize index {name}")
        if problem is None:
            checks.append(Check(binding, True, f"{name} holds {dimensions} dimensions, as {model} makes"))
        else:
            checks.append(Check(binding, False, problem, f"{make} (and bind it), or put a {dimensions}-dimensional model "
                                "first in EMBEDDING_MODELS"))
    return checks


def check_dry_run(wrangler: Sequence[str], run: Runner, outdir: str = "dist") -> Check:
    """Builds the bundle and validates wrangler.toml without an account (its [build] step runs
    `make vendor-python vendor-wllama`, which reaches PyPI and npm on a fresh clone)."""
    done = run([*wrangler, "deploy", "--dry-run", "--outdir", outdir], capture_output=True, text=True,
               timeout=WRANGLER_TIMEOUT_S)
    if done.returncode != 0:
        return Check("dry run", False, _last_line(_output(done)),
                     f"{' '.join(wrangler)} deploy --dry-run --outdir {outdir} shows the whole error")
    return Check("dry run", True, f"bundle built in {outdir}/")


def run_checks(config_path: Path, wrangler: Sequence[str], run: Runner = subprocess.run) -> list[Check]:
    """Offline checks first; the account checks only once logged in (they would all fail alike)."""
    config = load_config(config_path)
    checks = check_vars(config) + check_guardrails(config) + check_ids(config)
    login = check_login(wrangler, run)
    checks.append(login)
    if login.ok:
        checks += check_secrets(config, wrangler, run)
        if all(c.ok for c in checks if c.name.startswith("KV namespace")):
            checks.append(check_key(config, wrangler, run))
        checks += check_index(config, wrangler, run)
    checks.append(check_analytics(config))
    checks.append(check_dry_run(wrangler, run))
    return checks


def default_wrangler() -> list[str]:
    """`wrangler` on PATH (make puts node_modules/.bin there), else the project's, else npx."""
    if shutil.which("wrangler"):
        return ["wrangler"]
    local = Path("node_modules/.bin/wrangler")
    return [str(local)] if local.exists() else ["npx", "wrangler"]


def run(args: argparse.Namespace) -> int:
    try:
        checks = run_checks(Path(args.config), args.wrangler.split() if args.wrangler else default_wrangler())
    except (OSError, ValueError) as exc:
        print(f"edgellm: error: cannot read {args.config}: {exc}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired as exc:
        print(f"edgellm: error: {' '.join(exc.cmd)} did not answer in {exc.timeout:.0f} s", file=sys.stderr)
        return 2
    for check in checks:
        print(check.line())
    failed = [c for c in checks if not c.ok]
    if failed:
        print(f"\n{len(failed)} check(s) failed: fix them, then run `make deploy` again. Nothing was deployed.")
        return 1
    print("\nall checks passed")
    return 0


def add_parser(sub: Any) -> None:
    check = sub.add_parser("deploy-check", help="check login, wrangler.toml ids, secrets and a key before deploying")
    check.add_argument("--config", default="wrangler.toml", help="the Worker's wrangler.toml (default: %(default)s)")
    check.add_argument("--wrangler", default=os.environ.get("EDGELLM_WRANGLER", ""),
                       help="the wrangler command (default: $EDGELLM_WRANGLER, else wrangler on PATH, else npx wrangler)")
    check.set_defaults(run=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgellm_local.deploy_check")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["deploy-check", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
