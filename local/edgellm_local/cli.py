"""`edgellm`: the local edge's command line."""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import logging
import os
import signal
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

from edgellm.config import Config
from edgellm.vars import SECRETS, VARS, unknown_name

from edgellm_local.emulator.access_log import install as install_access_log
from edgellm_local.cli_args import NONNEGATIVE, PORT, POSITIVE, OneLineParser
from edgellm_local.deploy_check import add_parser as add_deploy_check_parser
from edgellm_local.keys_cli import add_parser as add_keys_parser
from edgellm_local.hub.publish import add_parser as add_publish_parser
from edgellm_local.llama.model_file import RESIDENT_BUDGET_MIB
from edgellm_local.llama.stand_ins import DEFAULT_STAND_IN, STAND_INS


def _dev(args: argparse.Namespace) -> int:
    """`edgellm dev`; SIGTERM stops it as Ctrl-C does, at any point (loading the model included).
    Ctrl-C is how a developer ends it, so a clean stop after one is success (exit 0): with 130,
    `make dev` reported its own recipe as failed ("Error 130") on every ordinary stop. SIGTERM,
    a supervisor's stop, keeps the conventional 143."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _serve_dev(args)
    except KeyboardInterrupt:
        code = 0
    except Terminated:
        code = 143
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("EdgeLLM local edge stopped", flush=True)
    return code


def _serve_dev(args: argparse.Namespace) -> int:
    # imported here: `edgellm pull` should not pay for the server, uvicorn and llama.cpp at start-up
    from edgellm_local.llama.model_file import ModelFileError
    from edgellm_local.llama.stand_ins import StandInMissing, resolve_embedding_model, resolve_model
    from edgellm_local.edge import EdgeSettings, build_app, dev_stack
    from edgellm_local.doubles.faults import FaultPlan
    from edgellm_local.emulator.server import PortInUse, bind_socket, make_server

    try:
        check_sizes(args)
        for url in args.origin:
            check_origin_url(url)
        # [vars] as the deployed Worker has them (wrangler.toml), under any --var given here
        wrangler, vars_line = wrangler_vars(args)
        env = {**wrangler, **dev_vars(args.var)}
        model, chat_template = resolve_model(args.model)
        chat_template = args.chat_template or chat_template
        embedding_model = resolve_embedding_model(args.embedding_model)
        # Open mode on loopback by default (a developer's own machine; the README's curl lines work
        # as they are), keys on any other address; --open / --require-keys decide explicitly.
        # (a --var OPEN_ACCESS, MODEL or ADMIN_TOKEN counts unless the flag that sets it is given)
        loopback = args.host in ("127.0.0.1", "localhost", "::1")
        open_access = args.open if args.open is not None else Config.from_env({"OPEN_ACCESS": env.get("OPEN_ACCESS") or
                                                                               ("true" if loopback else "false")}).open_access
        env["OPEN_ACCESS"] = "true" if open_access else "false"
        for name, value in (("MODEL", args.model_id), ("ADMIN_TOKEN", args.admin_token or os.environ.get("EDGELLM_ADMIN_TOKEN"))):
            if value:
                env[name] = value
        # /metrics: open on loopback (Prometheus beside it) when the API is, behind the admin token
        # elsewhere: open beside API keys it would show every tenant's name (the config refuses that)
        env.setdefault("METRICS_OPEN", "true" if loopback and open_access else "false")
        env["LOG_PROMPTS"] = "true" if args.log_prompts else env.get("LOG_PROMPTS", "false")
        if args.max_waiting_generations is not None:
            env["MAX_WAITING_GENERATIONS"] = str(args.max_waiting_generations)
        if args.origin:
            env["ORIGIN_TOKEN"] = args.origin_token or os.environ.get("EDGELLM_ORIGIN_TOKEN")
            env["ORIGINS"] = json.dumps([{"name": f"origin{i + 1}", "url": url, "token_secret": "ORIGIN_TOKEN"}
                                         for i, url in enumerate(args.origin)])
        config = Config.from_env(env)
        plan = FaultPlan.parse(args.fault)
        settings = EdgeSettings(model_path=model, state_dir=Path(args.state), config=config,
                                n_ctx=args.ctx_size, n_parallel=args.slots, resident_slots=args.resident_slots,
                                resident_budget_mib=args.resident_mib,
                                threads=args.threads,
                                slot_disk_budget=args.slot_disk_mib * 1024 * 1024, chat_template=chat_template,
                                embedding_model_path=embedding_model,
                                guard_model_path=Path(args.guard_model) if args.guard_model else None)
        sock = bind_socket(args.host, args.port)
        app = build_app(settings)
        app.api_first = args.server == "fast"
    except (ModelFileError, StandInMissing, PortInUse, ValueError) as exc:
        print(f"edgellm: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error) as exc:  # a state directory that cannot be made or written
        print(f"edgellm: error: cannot use the state directory {args.state!r}: {exc}", file=sys.stderr)
        return 2
    # the runners' owners, closed on the way out (dev_stack wraps the AI binding): the chat and
    # embedding models' binding, and the guard model's runner
    ai = Owners(app.deps.ai, getattr(app.deps.guard, "runner", None))
    if args.warm_up:
        from edgellm_local.llama.warmup import warm_up

        print(warm_up(app.deps.ai.models[config.model]).line(), flush=True)  # type: ignore[attr-defined]
    app.zero_copy = args.sendfile
    served = dev_stack(app, plan, Path(args.request_log) if args.request_log else None)
    host, port = sock.getsockname()[:2]
    print(f"EdgeLLM local edge listening on http://{host}:{port}", flush=True)
    print(f"  {config.model} (and fallbacks {', '.join(config.fallback_models) or 'none'}) -> llama.cpp with {model.name}", flush=True)
    for origin in config.routing.origins:
        print(f"  origin {origin.name}: {origin.url}", flush=True)
    print(f"  {vars_line}", flush=True)
    print(f"  state in {settings.state_dir.resolve()}; try: curl http://{host}:{port}/v1/models", flush=True)
    if config.open_access:
        print("  WARNING: OPEN ACCESS: API calls need no key; anyone who can reach this port can spend inference.", flush=True)
        print("  Use --require-keys and `edgellm keys create --tenant NAME` to require API keys.", flush=True)
    else:
        print("  API keys required (Authorization: Bearer <key>); make one with `edgellm keys create --tenant NAME`.", flush=True)
    server = make_server(served, args.server)
    out_of_the_collectors_way(app.deps.log)
    return serve_until_stopped(server, sock, ai)


# The fewest context tokens a slot needs to answer anything: a chat template's markers, a short
# question and a few tokens of answer (a one-line question in SmolLM2's ChatML is ~30 tokens).
MIN_SLOT_TOKENS = 128


def check_sizes(args: argparse.Namespace) -> None:
    """A context too small to hold a question and its answer would start and then refuse every
    request; it is refused at start instead, saying how much is enough."""
    per_slot = args.ctx_size // args.slots
    if per_slot < MIN_SLOT_TOKENS:
        raise ValueError(f"--ctx-size {args.ctx_size} gives each of the {args.slots} slot(s) {per_slot} tokens, too few to "
                         f"answer anything: use --ctx-size {MIN_SLOT_TOKENS * args.slots} or more "
                         f"(at least {MIN_SLOT_TOKENS} per slot; the default is 4096)")


def check_origin_url(url: str) -> None:
    """An origin the edge cannot reach over HTTP(S) would fail every request routed to it."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--origin {url!r} is not an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080/v1")


# [vars] the local edge takes from wrangler.toml only through its own rule: who may call it follows
# the address it listens on (loopback: open, so the README's requests work as they are), because a
# deployment's OPEN_ACCESS says who on the internet may call it; --open, --require-keys or a --var
# decide explicitly. METRICS_OPEN follows the access mode the same way.
ADDRESS_VARS = ("OPEN_ACCESS", "METRICS_OPEN")


def wrangler_vars(args: argparse.Namespace) -> tuple[dict[str, str], str]:
    """The `[vars]` of the Worker's wrangler.toml (`--config`, default ./wrangler.toml), so the
    local edge runs with the deployed Worker's settings unless a flag says otherwise; and the one
    start line saying which file was read. A mistake in them is refused as `deploy-check` refuses it."""
    import tomllib

    from edgellm.vars import as_var_text, check_vars

    path = Path(args.config) if args.config else Path("wrangler.toml")
    if not args.wrangler_vars:
        return {}, "[vars]: built-in defaults (--no-wrangler-vars: wrangler.toml not read)"
    if not path.is_file():
        if args.config:
            raise ValueError(f"--config {args.config}: no such file (the Worker's wrangler.toml, as wrangler's --config)")
        return {}, "[vars]: built-in defaults (no wrangler.toml here; --config PATH reads one)"
    try:
        values = tomllib.loads(path.read_text()).get("vars", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: [vars] is not a table of NAME = \"value\" lines")
    problems = check_vars(values)
    if problems:
        raise ValueError(f"{path} [vars]: {problems[0]} (or --no-wrangler-vars)")
    taken = {name: as_var_text(value) for name, value in values.items() if name not in ADDRESS_VARS}
    left = [name for name in ADDRESS_VARS if name in values]
    aside = f"; {' and '.join(left)} follow{'s' if len(left) == 1 else ''} this edge's address" if left else ""
    return taken, f"[vars] from {path.resolve()}: {len(taken)} value(s){aside} (--no-wrangler-vars: built-in defaults)"


def dev_vars(pairs: list[str]) -> dict[str, str]:
    """`--var NAME=VALUE`s as the [vars] mapping. A name the Worker does not read would be ignored
    without a word (a typo leaves the default in force), so it is refused, naming the nearest known
    one; a secret (ADMIN_TOKEN, an origin's token) is accepted, as wrangler's `--var` takes it."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--var {pair!r} is not NAME=VALUE, e.g. --var EDGE_STALL_MS=500")
        env[name] = value
    secrets = set(SECRETS)
    try:
        origins = json.loads(env.get("ORIGINS") or "[]")
    except ValueError:
        origins = []  # the config says what is wrong with it
    if isinstance(origins, list):
        secrets |= {str(o["token_secret"]) for o in origins if isinstance(o, dict) and o.get("token_secret")}
    for name in env:
        if name not in VARS and name not in secrets:
            raise ValueError(f"--var {name}: {unknown_name(name, VARS)}")
    return env


def out_of_the_collectors_way(log: logging.Logger) -> int:
    """What the process made before serving (modules, the model's runners, config) lives as long
    as it does: frozen (`gc.freeze`), a full collection no longer walks it. Under
    load one came about once a second and paused the event loop for ~48 ms (a HIT's p99 under
    wrk -c16: 47 ms, 10 ms frozen), walking the same ~60k objects each time. Collected first, so
    no startup garbage is kept for ever. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%d objects made at startup frozen out of the collector's way (gc.freeze)", frozen)
    return frozen


class Terminated(Exception):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that both stop the same way."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


# How long a stop may take once signalled: uvicorn's graceful shutdown (3 s), a generation reaching
# its next token, llama.cpp's threads joined. Past it the process exits at once (see StopWatchdog).
STOP_DEADLINE_S = 8.0


class StopWatchdog:
    """Armed by the first SIGINT/SIGTERM: if the process has not stopped within the deadline, it
    prints every thread's stack (what was stuck) and exits at once with `os._exit`. Stopping
    never waits for ever, whatever a native thread does (an xllamacpp destructor joining a loop
    that missed its stop, a generation deep in a long prompt)."""

    def __init__(self, deadline_s: float = STOP_DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self._timer: threading.Timer | None = None
        self.code = 130

    def arm(self, code: int) -> None:
        if self._timer is None:
            self.code = code
            self._timer = threading.Timer(self.deadline_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        print(f"edgellm: did not stop within {self.deadline_s:.0f} s; exiting now. Threads:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(self.code)


class Owners:
    """Several owners of native runners stopped as one (`cancel_generations`, then `close`)."""

    def __init__(self, *owners: Any) -> None:
        self.owners = [owner for owner in owners if owner is not None]

    def cancel_generations(self) -> None:
        for owner in self.owners:
            owner.cancel_generations()

    def close(self) -> None:
        for owner in self.owners:
            owner.close()


def serve_until_stopped(server: Any, sock: Any, ai: Any) -> int:
    """Serve until SIGINT or SIGTERM, then stop within STOP_DEADLINE_S: generations are cut at
    their next token (their clients get an error, never a finished answer), uvicorn drains the
    rest of the requests, then the runners are closed (llama.cpp's servers dropped, which joins
    their threads)."""
    watchdog = StopWatchdog()
    handle_exit = server.handle_exit  # uvicorn's handler for both signals while it serves

    def on_signal(signum: int, frame: Any) -> None:
        watchdog.arm(128 + signum)
        # generations stop at their next token rather than run on through the graceful shutdown
        # (on a thread: the code this handler interrupted may hold the runner's lock)
        threading.Thread(target=ai.cancel_generations, name="edgellm-stop", daemon=True).start()
        handle_exit(signum, frame)

    server.handle_exit = on_signal  # capture_signals installs self.handle_exit: arm the watchdog first
    try:
        # run(): uvicorn sets up its (isolating uvloop) event loop; once it has drained, it re-raises
        # the signal: KeyboardInterrupt for Ctrl-C, Terminated for SIGTERM (_dev's handler)
        server.run(sockets=[sock])
    finally:
        watchdog.arm(0)  # closing the runners is bounded too (a no-op once a signal armed it)
        ai.close()
    return 0


def _pull(args: argparse.Namespace) -> int:
    from edgellm_local.hub.pull import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="edgellm", description="EdgeLLM: Workers AI at the edge, and offline.")
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="serve the Worker locally with a real llama.cpp model")
    dev.add_argument("--port", type=PORT, default=8787, help="TCP port (default: %(default)s)")
    dev.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    dev.add_argument("--embedding-model", default=None,
                     help="the embedding model standing in for Workers AI's bge ids on /v1/embeddings: a stand-in's name "
                          "(minilm-l6, the default when its package is installed), a GGUF path, or 'none'")
    dev.add_argument("--guard-model", metavar="PATH", default=None,
                     help="a Llama Guard 3 GGUF for GUARDRAILS' moderation (docs/guardrails.md); without it a policy that "
                          "moderates is refused at start")
    dev.add_argument("--model", help="the model standing in for the configured one: a stand-in's name "
                                     f"({', '.join(STAND_INS)}; docs/getting-started.md) or a GGUF path (default: {DEFAULT_STAND_IN})")
    dev.add_argument("--chat-template", help="llama.cpp's chat template by name or Jinja text (default: the GGUF's own, "
                                             "or the stand-in's)")
    dev.add_argument("--model-id", help="the Workers AI model id to serve (default: the config's)")
    dev.add_argument("--state", default=".state", help="directory for KV (SQLite) and R2 (files) (default: %(default)s)")
    dev.add_argument("--admin-token", help="turns on /admin/cache/* (default: $EDGELLM_ADMIN_TOKEN)")
    dev.add_argument("--ctx-size", type=POSITIVE, default=4096, help=f"llama.cpp context, shared by the slots; at least {MIN_SLOT_TOKENS} per slot (default: %(default)s)")
    dev.add_argument("--slots", type=POSITIVE, default=2, help="llama.cpp slots: conversations computed at once (default: %(default)s)")
    dev.add_argument("--resident-slots", type=NONNEGATIVE, default=None, metavar="N",
                     help="N more llama.cpp slots of the same size that only keep conversations and prompts in memory "
                          "(no save and restore when they come back), never computed beyond --slots at once; each costs "
                          "its slot's KV memory, ~46 MB at 2,048 tokens on SmolLM2-135M (default: as many as fit in "
                          "--resident-mib, at most 4)")
    dev.add_argument("--resident-mib", type=NONNEGATIVE, default=RESIDENT_BUDGET_MIB, metavar="MIB",
                     help="KV memory the resident slots may use when --resident-slots is not given (default: %(default)s)")
    dev.add_argument("--threads", type=POSITIVE, default=os.cpu_count() or 1,
                     help="llama.cpp threads for generation and prompts (default: the machine's cores, %(default)s)")
    dev.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                     help="skip the short generation at start-up that prints tokens/s")
    dev.add_argument("--slot-disk-mib", type=NONNEGATIVE, default=2048, help="disk budget for saved conversation slot states (default: %(default)s)")
    dev.add_argument("--max-waiting-generations", type=POSITIVE, metavar="N",
                     help="admission control: generations in progress before a miss gets 503 + Retry-After (default 32)")
    dev.add_argument("--open", dest="open", action="store_true", default=None, help="serve the API without keys (default on loopback)")
    dev.add_argument("--require-keys", dest="open", action="store_false", help="require API keys (default off loopback)")
    dev.add_argument("--log-format", choices=("text", "json"), default="text",
                     help="one line per request: readable text, or the JSON record (default: %(default)s)")
    dev.add_argument("--log-json", dest="log_format", action="store_const", const="json", help="the same as --log-format json")
    dev.add_argument("--log-prompts", action="store_true", help="the request's log line carries its prompt (never by default)")
    dev.add_argument("--server", choices=("fast", "baseline"), default="fast",
                     help="fast: httptools + uvloop, API routes before static files; baseline: h11 + asyncio, "
                          "static files first (for benchmarks) (default: %(default)s)")
    dev.add_argument("--no-sendfile", dest="sendfile", action="store_false",
                     help="send R2 files in chunks through Python instead of sendfile(2) (for comparison)")
    dev.add_argument("--origin", action="append", default=[], metavar="URL", help="an OpenAI-compatible origin to fall back to (repeatable)")
    dev.add_argument("--origin-token", help="bearer token for the origins (default: $EDGELLM_ORIGIN_TOKEN)")
    dev.add_argument("--config", "-c", metavar="PATH", default=None,
                     help="the Worker's wrangler.toml whose [vars] the edge runs with, as wrangler's --config "
                          "(default: ./wrangler.toml if there is one; flags, --var and the environment win over it)")
    dev.add_argument("--no-wrangler-vars", dest="wrangler_vars", action="store_false",
                     help="ignore wrangler.toml's [vars]: built-in defaults and flags only")
    dev.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="a [vars] value, e.g. EDGE_FIRST_TOKEN_MS=500 (repeatable; every name is in docs/operations.md)")
    dev.add_argument("--fault", action="append", default=[], metavar="KIND=RATE[:OPT=V]",
                     help="inject faults at the AI binding: fail, retired, delay_first, stall, fail_mid (e.g. stall=0.33:after=3)")
    dev.add_argument("--request-log", metavar="FILE", help="append every request to FILE as JSON lines (for an origin under test)")
    dev.set_defaults(run=_dev)
    pull = sub.add_parser("pull", help="download a published model from an edge (verified, resumable)")
    pull.add_argument("base_url", metavar="BASE_URL", help="the edge, e.g. http://127.0.0.1:8787")
    pull.add_argument("name", metavar="NAME", help="the model's published name")
    pull.add_argument("--out", required=True, help="directory for the GGUF and its tokenizer files")
    pull.add_argument("--parallel", type=int, default=4, choices=range(1, 65), metavar="N", help="concurrent shard downloads (1-64, default 4)")
    pull.add_argument("--verify-full", action="store_true", help="also hash the whole file at the end (each shard is always verified as it arrives)")
    pull.add_argument("--limit-rate", metavar="RATE", help="at most RATE bytes per second, e.g. 500K, 10M (default: no limit)")
    pull.set_defaults(run=_pull)
    add_publish_parser(sub)
    add_keys_parser(sub)
    add_deploy_check_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "dev":
        install_access_log(as_json=args.log_format == "json")
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
