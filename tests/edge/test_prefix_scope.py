"""Prompt reuse for requests without a session, through the real HTTP server: a tenant's
requests reuse the prefix its own earlier ones left in the one llama.cpp slot, and never another
tenant's (`usage.prompt_tokens_details.cached_tokens`: the tokens llama.cpp reports it skipped); a
new conversation (a keyed tenant's session, `<tenant>:<name>`) starts from its own tenant's kept
prompt, never from another's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from edgellm.access.keys import KeyRing, new_key
from edgellm.config import Config
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.slot_pool import SlotPool

SYSTEM = {"role": "system", "content": "You answer questions about the sea, briefly and politely, in plain words. "
                                       "Name the sea, the coast and the season you mean, and say when you are not sure."
                                       " Never give advice on sailing, diving or swimming."}  # a restore's worth (SHARED_START)


@pytest.fixture(scope="module")
def one_slot(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppRunner]:
    yield LlamaCppRunner(tiny_model, n_ctx=1024, n_parallel=1, threads=1, slot_dir=tmp_path_factory.mktemp("slots"), cache_ram_mib=0).load()


def test_a_tenants_prompt_warms_its_own_next_requests_never_another_tenants(start_edge, make_deps, clock, one_slot) -> None:
    config = Config(admin_token="admin-secret")
    ai = LlamaCppAI.for_config(config, one_slot)
    ai.slots = SlotPool(one_slot)
    deps = make_deps(config=config, clock=clock, ai=ai)
    keys = {}
    for tenant in ("acme", "globex", "initech"):
        made = new_key(tenant, clock.now())
        asyncio.run(KeyRing(deps.kv).put(made.record))
        keys[tenant] = made.api_key
    server = start_edge(deps)

    def cached(tenant: str, question: str, session: str | None = None) -> int:
        body = {"messages": [SYSTEM, {"role": "user", "content": question}], "temperature": 0, "max_tokens": 4}
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60,
                              headers={"authorization": f"Bearer {keys[tenant]}", **({"x-session-affinity": session} if session else {})})
        assert response.status_code == 200 and response.headers["cf-aig-cache-status"] == "MISS", response.text
        return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("acme", "How deep is it?") == 0
    assert cached("acme", "How salty is it?") > 0  # the system prompt acme's first request left in the slot
    assert cached("globex", "How deep is it?") == 0  # acme's prompt, word for word, is in the slot: erased first
    assert cached("globex", "How cold is it?") > 0
    assert ai.slots.stats.scoped == 2
    # A request with no state of its own in the slot (globex's is there) starts from its own
    # tenant's kept prompt sharing the system prompt, restored in the slot's place, and so does a
    # new conversation (a session with no state yet); a third tenant's starts from nothing.
    assert cached("acme", "How wide is it?") > 0
    assert cached("globex", "How far is it?", session="s1") > 0
    assert cached("acme", "How far is it?", session="s1") > 0  # the same session name: each tenant's own
    assert cached("initech", "How far is it?", session="s1") == 0
    assert (ai.slots.stats.shared, ai.slots.stats.copied) == (3, 3)
