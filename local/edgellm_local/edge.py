"""The local edge's composition root: build `Deps` from a model file and a state directory."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgellm.config import Config, index_width_problem
from edgellm.embeddings import DEFAULT_EMBEDDING_MODEL
from edgellm.ports import Clock
from edgellm.deps import Deps, SystemClock
from edgellm.state import IsolateState

from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.embedding_runner import EmbeddingRunner
from edgellm_local.llama.guard import LlamaCppGuard
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.model_file import RESIDENT_BUDGET_MIB, check_gguf, resident_slots_within
from edgellm_local.llama.slot_pool import DEFAULT_DISK_BUDGET, SlotPool
from edgellm_local.doubles.faults import FaultAdmin, FaultPlan, FaultyAI
from edgellm_local.emulator.assets import StaticAssets
from edgellm_local.emulator.conversation_sqlite import conversation_factory
from edgellm_local.emulator.durable import LocalDurableObjectNamespace
from edgellm_local.emulator.kv import SqliteKV
from edgellm_local.emulator.http_fetch import HttpxFetch
from edgellm_local.emulator.r2 import FileR2
from edgellm_local.emulator.request_log import RequestLog
from edgellm_local.emulator.server import EdgeApp
from edgellm_local.emulator.usage_sqlite import SqliteUsage
from edgellm_local.telemetry import otlp_tracer
from edgellm_local.emulator.vector_index import SqliteVectorIndex

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PUBLIC = PROJECT_ROOT / "public"


@dataclass(frozen=True)
class EdgeSettings:
    model_path: Path
    state_dir: Path
    public_dir: Path | None = DEFAULT_PUBLIC
    config: Config = Config()
    n_ctx: int = 4096
    n_parallel: int = 2
    # llama.cpp slots that only hold states (LlamaCppRunner.resident); None: as many as fit in
    # resident_budget_mib of KV memory (resident_slots_within), at most RESIDENT_MOST
    resident_slots: int | None = None
    resident_budget_mib: int = RESIDENT_BUDGET_MIB
    threads: int | None = None  # llama.cpp's threads (None: every core the machine has)
    slot_disk_budget: int = DEFAULT_DISK_BUDGET  # saved llama.cpp slot states under state_dir/slots
    chat_template: str | None = None  # llama.cpp's --chat-template (None: the GGUF's own); stand_ins.py names them
    # the embedding GGUF standing in for every `config.embedding_models` id (None: no embeddings served)
    embedding_model_path: Path | None = None
    # the guard GGUF (a Llama Guard 3) for moderation (`--guard-model`); None: no guard, so a
    # GUARDRAILS policy that moderates is refused at start
    guard_model_path: Path | None = None


def guard_missing(config: Config, guard_model_path: Path | None) -> str | None:
    """The one line that refuses a policy that moderates with no guard behind it."""
    if config.guardrails.needs_guard and guard_model_path is None:
        return ("GUARDRAILS moderates prompts or answers but no guard model is given: every such request would fail "
                "(GUARD_FAIL); start with --guard-model PATH (a Llama Guard 3 GGUF), or drop the policy's moderation")
    return None


def build_guard(settings: EdgeSettings, threads: int) -> LlamaCppGuard | None:
    """The guard GGUF behind the same llama.cpp engine: a runner of its own (one slot; a
    verdict is a short prompt and a few tokens), stopped where the chat model's runners are."""
    if settings.guard_model_path is None:
        return None
    runner = LlamaCppRunner(check_gguf(settings.guard_model_path), n_ctx=2048, n_parallel=1, cache_ram_mib=0)
    runner.threads = threads
    return LlamaCppGuard.for_model(runner)


def served_tokenizer(config: Config, model_path: Path, state: IsolateState) -> Config:
    """Routing that counts nothing (no EDGE_TOKENIZER) counts, on the local edge, with the tokenizer
    of the GGUF it serves: read from the file once, at start, into the isolate's tokenizer memo
    (what `EDGE_TOKENIZER` would have loaded from R2). So a prompt past every route's window is
    a 400 `context_length_exceeded` before any inference, and one past the edge's goes to an
    origin. Routing off (no origins, no regions), nothing is counted, as before."""
    routing = config.routing
    if routing.edge_tokenizer or not (routing.origins or routing.regions):
        return config
    import gguf  # only `edgellm dev` with routing pays for the GGUF reader and tokenizers

    from edgellm.routing.counting import EdgeTokenizer
    from edgellm.tokenizer import Tokenizer, UnsupportedTokenizer

    from edgellm_local.hub.gguf_tokenizer import UnsupportedVocabulary, build_tokenizer, tokenizer_config

    name = f"local:{model_path.name}"
    try:
        reader = gguf.GGUFReader(model_path)
        spec = json.loads(build_tokenizer(reader).to_str())
        state.routing.tokenizers[name] = EdgeTokenizer(Tokenizer.from_json(spec), tokenizer_config(reader))
    except (UnsupportedVocabulary, UnsupportedTokenizer) as exc:
        logging.getLogger("edgellm").warning("the served model's tokenizer cannot count prompts (%s): routing does not count", exc)
        return config
    return replace(config, routing=replace(routing, edge_tokenizer=name))


def build_deps(settings: EdgeSettings, clock: Clock = SystemClock()) -> Deps:
    if (problem := guard_missing(settings.config, settings.guard_model_path)) is not None:
        raise ValueError(problem)
    model = check_gguf(settings.model_path)
    resident = settings.resident_slots
    if resident is None:
        resident = resident_slots_within(model, settings.n_ctx // max(1, settings.n_parallel), settings.resident_budget_mib * 1024 * 1024)
    runner = LlamaCppRunner(model, n_ctx=settings.n_ctx, n_parallel=settings.n_parallel,
                            resident=resident, slot_dir=settings.state_dir / "slots", cache_ram_mib=0, chat_template=settings.chat_template)
    if settings.threads is not None:
        runner.threads = settings.threads
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    state = IsolateState()
    settings = replace(settings, config=served_tokenizer(settings.config, settings.model_path, state))
    ai = LlamaCppAI.for_config(settings.config, runner)
    ai.slots = SlotPool(runner, disk_budget=settings.slot_disk_budget)
    if settings.embedding_model_path is not None:  # the stand-in answers for bge-small unless EMBEDDING_MODELS names others
        if not settings.config.embedding_models:
            settings = replace(settings, config=replace(settings.config, embedding_models=(DEFAULT_EMBEDDING_MODEL,)))
        embedder = EmbeddingRunner(check_gguf(settings.embedding_model_path), threads=runner.threads)
        ai.embedders = {model: embedder for model in settings.config.embedding_models}
    elif settings.config.embedding_models:  # nothing stands in for them: not listed, not served
        settings = replace(settings, config=replace(settings.config, embedding_models=()))
    vectors = None
    if settings.config.embedding_models:  # the semantic cache's index (Vectorize's stand-in), only where embeddings are served
        vectors = SqliteVectorIndex(settings.state_dir / "vectors.sqlite3")
        if vectors.dimensions is not None and settings.embedding_model_path is not None:
            # the index keeps its first vector's width (as Vectorize keeps the one it was made with)
            problem = index_width_problem(settings.config, vectors.dimensions, f"the local index {vectors.path}",
                                          width=embedder.dimensions)
            if problem is not None:
                vectors.close()
                raise ValueError(f"{problem} (or delete {vectors.path})")
    guard = build_guard(settings, runner.threads)  # its runner is stopped with the chat model's (cli.serve_until_stopped)
    return Deps(
        config=settings.config,
        ai=ai,
        guard=guard,
        kv=SqliteKV(settings.state_dir / "kv.sqlite3", clock=clock),
        r2=FileR2(settings.state_dir / "r2", clock=clock),
        clock=clock,
        conversations=LocalDurableObjectNamespace(
            conversation_factory(settings.state_dir / "conversations", settings.config, clock), class_name="Conversation"),
        log=logging.getLogger("edgellm"),
        state=state,
        usage=SqliteUsage(settings.state_dir / "usage.sqlite3"),
        fetch=HttpxFetch(),
        tracer=otlp_tracer(),
        vectors=vectors,
    )


def build_app(settings: EdgeSettings, clock: Clock = SystemClock()) -> EdgeApp:
    deps = build_deps(settings, clock)
    runner = deps.ai.models[settings.config.model].load()  # type: ignore[attr-defined]
    runner.special_pattern  # read the control tokens now, not on the first request's event loop
    assets = StaticAssets(settings.public_dir) if settings.public_dir and settings.public_dir.is_dir() else None
    return EdgeApp(deps, assets, compress=True)  # `edgellm dev`: what the platform adds, gzip included


def dev_stack(app: EdgeApp, plan: FaultPlan, request_log: Path | None = None) -> Any:
    """The ASGI app `edgellm dev` serves: the edge with its fault seam (no faults unless asked;
    `POST /admin/faults` changes them) and, for an origin under test, a log of every request.
    Tests of the HTTP server build the same stack."""
    faulty = FaultyAI(app.deps.ai, plan)
    app.deps = replace(app.deps, ai=faulty, faults=FaultAdmin(faulty))  # `/admin/faults`, a route of the core
    served: Any = app
    if request_log is not None:
        served = RequestLog(served, request_log)
    return served
