"""Cache keys: equal requests written differently share a key; anything that can change the
output gives a new one; keys stay well under KV's 512-byte limit."""

from __future__ import annotations

import pytest

from edgellm.cache.key import CacheScope, build_cache_key, build_custom_key
from edgellm.config import Config
from edgellm.openai import parse_chat_request, parse_completion_request
from edgellm.workers_ai import validate_inputs

CONFIG = Config()
SCOPE = CacheScope("default", "default")
BASE = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0}


def key_of(body: dict, scope: CacheScope = SCOPE) -> str:
    return build_cache_key(parse_chat_request(body, CONFIG), scope).kv_key


@pytest.mark.parametrize("variant", [
    {"temperature": 0.0, "messages": BASE["messages"]},                               # 0 vs 0.0
    {"messages": BASE["messages"], "temperature": 0},                                 # key order
    {**BASE, "max_tokens": 256},                                                      # default spelled out
    {**BASE, "model": CONFIG.model},                                                  # default model spelled out
    {**BASE, "stream": True},                                                         # stream does not shape output
    {**BASE, "stream": True, "stream_options": {"include_usage": True}},
    {**BASE, "user": "someone"},                                                      # request metadata
    {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]},
])
def test_equal_requests_share_a_key(variant: dict) -> None:
    assert key_of(variant) == key_of(BASE)


@pytest.mark.parametrize("change", [
    {"temperature": 0, "seed": 5},
    {"max_tokens": 10},
    {"top_p": 0.5},
    {"top_k": 5},
    {"presence_penalty": 0.5},
    {"frequency_penalty": 0.5},
    {"repetition_penalty": 1.1},
    {"stop": ["."]},
    {"raw": True},
    {"lora": "my-adapter"},
    {"model": CONFIG.fallback_models[0]},
    {"messages": [{"role": "user", "content": "What is the capital of France? "}]},   # text exactly as sent
    {"messages": [{"role": "system", "content": "What is the capital of France?"}]},
    {"messages": [*BASE["messages"], {"role": "assistant", "content": "Paris"}]},
])
def test_any_output_shaping_change_gives_a_new_key(change: dict) -> None:
    assert key_of({**BASE, **change}) != key_of(BASE)


def test_tenant_namespace_and_generation_scope_the_key() -> None:
    keys = {key_of(BASE, s) for s in (SCOPE, CacheScope("other", "default"), CacheScope("default", "faq"), CacheScope("default", "default", 1))}
    assert len(keys) == 4


def test_chat_and_workers_ai_route_share_an_entry_for_the_same_input() -> None:
    inputs, _ = validate_inputs({"messages": BASE["messages"], "temperature": 0, "stream": True}, CONFIG)
    from edgellm.generation import GenerationRequest

    assert build_cache_key(GenerationRequest(CONFIG.model, inputs), SCOPE).kv_key == key_of(BASE)


def test_completion_prompt_differs_from_chat_with_same_text() -> None:
    completion = parse_completion_request({"prompt": "What is the capital of France?", "temperature": 0}, CONFIG)
    assert build_cache_key(completion, SCOPE).kv_key != key_of(BASE)


def test_custom_key_is_scoped_to_the_tenant() -> None:
    a = build_custom_key("faq:hours", SCOPE)
    assert a == build_custom_key("faq:hours", SCOPE)
    assert a != build_custom_key("faq:hours", CacheScope("other", "default"))
    assert a != build_custom_key("faq:hours2", SCOPE)


def test_key_stays_under_kv_limit_for_longest_scope_and_huge_input() -> None:
    scope = CacheScope("t" * 64, "n" * 64, 10**12)
    body = {**BASE, "messages": [{"role": "user", "content": "x" * 100_000}]}
    assert len(key_of(body, scope).encode()) <= 512


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 65, "ü"])
def test_scope_names_are_checked(bad: str) -> None:
    with pytest.raises(ValueError):
        CacheScope(bad, "default")


def test_a_requests_digest_is_kept_with_it_per_scope_and_never_outlives_a_change() -> None:
    """The digest is computed once per request and scope (kept on the immutable request: a HIT
    on a request the parse memo shares hashes nothing), and a changed copy computes its own."""
    from dataclasses import replace

    request = parse_chat_request(BASE, CONFIG)
    first = build_cache_key(request, SCOPE)
    other_scope = build_cache_key(request, CacheScope("other", "default"))
    assert build_cache_key(request, SCOPE) == first and other_scope.digest != first.digest  # per scope, not one for all
    assert build_cache_key(parse_chat_request(BASE, CONFIG), SCOPE) == first  # what a fresh request computes
    changed = replace(request, inputs={**request.inputs, "max_tokens": 7})
    assert build_cache_key(changed, SCOPE).digest != first.digest
    assert build_cache_key(changed, SCOPE) == build_cache_key(parse_chat_request({**BASE, "max_tokens": 7}, CONFIG), SCOPE)
    assert request.derived and not replace(request, stream=True).derived  # a copy starts with nothing kept


def test_a_kept_key_follows_its_scopes_purge_generation() -> None:
    """The key itself is kept on the request (one object, one kv_key string, hashed once); a
    purge's new generation gets a key of that generation with the same digest, never the old one."""
    request = parse_chat_request(BASE, CONFIG)
    first = build_cache_key(request, SCOPE)
    assert build_cache_key(request, SCOPE) is first
    assert build_cache_key(request, CacheScope(SCOPE.tenant, SCOPE.namespace)) is first  # an equal scope: the same key
    purged = build_cache_key(request, CacheScope(SCOPE.tenant, SCOPE.namespace, SCOPE.generation + 1))
    assert purged.digest == first.digest and purged.kv_key != first.kv_key and f"/g{SCOPE.generation + 1}/" in purged.kv_key
    assert build_cache_key(request, SCOPE).kv_key == first.kv_key  # back to the first generation: its own key again
