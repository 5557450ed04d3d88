"""Shared fixtures: a tiny GGUF written by the tests, a shared llama.cpp runner, and a factory
for local edges (a real uvicorn server on 127.0.0.1) with injectable bindings."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from edgellm.config import Config
from edgellm.ports import Clock
from edgellm.deps import Deps, SystemClock
from edgellm.state import IsolateState
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.emulator.assets import StaticAssets
from edgellm_local.edge import DEFAULT_PUBLIC
from edgellm_local.emulator.kv import SqliteKV
from edgellm_local.emulator.r2 import FileR2
from edgellm_local.emulator.server import EdgeApp, EdgeServer
from tests.support.tiny_gguf import write_tiny_gguf


class ManualClock:
    """A clock tests move by hand (TTL expiry without sleeping)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny-bpe.gguf", vocab="bpe")


@pytest.fixture(scope="session")
def tiny_runner(tiny_model: Path) -> LlamaCppRunner:
    # One thread in every test runner: on a loaded 2-core machine (CI), a 2-thread llama.cpp stalls at
    # its barriers whenever another process takes a core (5-50 s for one answer at load 10; a fuzzed
    # request under a CPU hog passed its 30 s), and the tiny model gains nothing from a second one.
    return LlamaCppRunner(tiny_model, n_ctx=2048, n_parallel=4, threads=1).load()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_deps(tiny_runner: LlamaCppRunner, tmp_path: Path) -> Callable[..., Deps]:
    """Deps over the real local bindings; keyword overrides replace any of them."""

    def make(config: Config | None = None, clock: Clock | None = None, **overrides: Any) -> Deps:
        config = config or Config(open_access=True)  # the API tests exercise the gateway, not keys (tests/edge/test_access.py does)
        clock = clock or SystemClock()
        deps = Deps(
            config=config,
            ai=LlamaCppAI.for_config(config, tiny_runner),
            kv=SqliteKV(tmp_path / "kv.sqlite3", clock=clock),
            r2=FileR2(tmp_path / "r2", clock=clock),
            clock=clock,
            log=logging.getLogger("edgellm.test"),
            state=IsolateState(),
        )
        return replace(deps, **overrides)

    return make


@pytest.fixture
def start_edge(make_deps: Callable[..., Deps]) -> Iterator[Callable[..., EdgeServer]]:
    """Start a local edge around given Deps (default: real local bindings + tiny model)."""
    servers: list[EdgeServer] = []

    def start(deps: Deps | None = None, public: Path | None = DEFAULT_PUBLIC, coalesce: bool = True, compress: bool = False,
              **overrides: Any) -> EdgeServer:
        """`compress`: gzip text for clients that ask, as `edgellm dev` (and Cloudflare's edge) does."""
        deps = deps or make_deps(**overrides)
        assets = StaticAssets(public) if public and public.is_dir() else None
        server = EdgeServer(EdgeApp(deps, assets, coalesce=coalesce, compress=compress)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def edge(start_edge: Callable[..., EdgeServer]) -> EdgeServer:
    return start_edge()


# --- the edge suite against any base URL -------------------------------------------------------

BASE_URL_ENV = "EDGELLM_TEST_BASE_URL"
# Fixtures that reach into the local edge (its bindings, its model, a server built around
# injected Deps): a test needing any of them runs only against a local edge.
LOCAL_ONLY_FIXTURES = frozenset({"start_edge", "make_deps", "tiny_runner", "tiny_model", "smollm2_runner", "edge"})


def target_base_url() -> str | None:
    """`EDGELLM_TEST_BASE_URL` (the Worker under `wrangler dev`, a deployment), or None: local."""
    base = os.environ.get(BASE_URL_ENV, "").strip()
    return base.rstrip("/") or None


def target_headers(**overrides: Any) -> dict[str, str]:
    """Headers that make a remote target behave like the local edge `overrides` describe: a
    local edge without the cache (`kv=None`) is a deployment asked to skip it."""
    if target_base_url() is not None and "kv" in overrides and overrides["kv"] is None:
        return {"cf-aig-skip-cache": "true"}
    return {}


@pytest.fixture
def edge_url(request: pytest.FixtureRequest) -> Callable[..., str]:
    """The base URL an HTTP-only test talks to: `EDGELLM_TEST_BASE_URL` when set, else a fresh
    local edge (`start_edge(**overrides)`; the overrides only shape the local one)."""

    def url(**overrides: Any) -> str:
        return target_base_url() or request.getfixturevalue("start_edge")(**overrides).url

    return url


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if target_base_url() is None:
        return
    for item in items:
        if "tests/edge/" not in item.nodeid.replace("\\", "/"):
            continue
        needs = sorted(LOCAL_ONLY_FIXTURES & set(getattr(item, "fixturenames", ())))
        if needs or item.get_closest_marker("local_edge"):
            why = ", ".join(needs) or "the local edge's internals"
            item.add_marker(pytest.mark.skip(reason=f"runs only against a local edge (needs {why}); {BASE_URL_ENV} is set"))
