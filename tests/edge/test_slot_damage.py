"""A conversation's saved llama.cpp slot state replaced by a directory (never a
502 showing an internal path), through the local edge's real HTTP server: the state is refused
like the other kinds of damage (tests/unit/test_slot_pool.py), the turn computed in full, a 200
whose text names no path of the edge's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from edgellm.config import Config
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.slot_pool import SlotPool


@pytest.fixture
def pool_edge(start_edge: Callable[..., Any], make_deps: Callable[..., Any], tiny_model: Path,
              tmp_path: Path) -> Iterator[tuple[Any, SlotPool, Path]]:
    slot_dir = tmp_path / "slots"
    runner = LlamaCppRunner(tiny_model, n_ctx=1024, n_parallel=2, threads=1, slot_dir=slot_dir, cache_ram_mib=0).load()
    config = Config(open_access=True)
    ai = LlamaCppAI.for_config(config, runner)
    ai.slots = pool = SlotPool(runner)
    try:
        yield start_edge(make_deps(config=config, ai=ai, kv=None)), pool, slot_dir
    finally:
        runner.close()


def turn(server: Any, session: str, text: str) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=120, headers={"x-session-affinity": session},
                      json={"messages": [{"role": "user", "content": text}], "max_tokens": 4, "temperature": 0})


def test_a_saved_slot_state_replaced_by_a_directory_is_refused_and_the_turn_recomputed(pool_edge: tuple[Any, SlotPool, Path]) -> None:
    server, pool, slot_dir = pool_edge
    for session in ("a", "b", "c", "d"):  # two slots: c and d evict a and b, whose states are saved to disk
        assert turn(server, session, f"Tell me about {session} rivers").status_code == 200
    asyncio.run_coroutine_threadsafe(pool.idle(), server.loop).result(60)  # every save written behind has ended
    names = [name for name in ("a", "default:a") if pool.saved(name) is not None]
    assert names, "a's state was never saved"
    target = pool.saved(names[0])
    assert target is not None
    target.path.unlink()
    target.path.mkdir()
    (target.path / "inside").write_bytes(b"x")
    refused = pool.stats.refused
    again = turn(server, "a", "Tell me about a rivers")
    assert again.status_code == 200, again.text
    assert str(slot_dir) not in again.text and str(target.path) not in again.text
    assert pool.stats.refused == refused + 1 and pool.stats.restores == 0
