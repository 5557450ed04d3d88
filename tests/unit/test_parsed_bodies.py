"""`api.parsed_body`: a tenant's identical request body is parsed once; another tenant's, a
body under another Config, a changed byte or a refused body is parsed (or refused) anew."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from edgellm import openai
from edgellm.api import parsed_body
from edgellm.app import ROUTES
from edgellm.context import RequestContext
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.errors import GatewayError
from edgellm.generation import GenerationRequest
from edgellm.http import Request
from edgellm.state import ParsedBodies
from edgellm.tenancy import TenantScope

from edgellm_local.doubles.scripted import ScriptedAI

BODY = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 16}).encode()


def request(body: bytes = BODY, tenant: str | None = "a") -> tuple[Request, RequestContext]:
    r = Request("POST", "http://edge/v1/chat/completions", {"content-length": str(len(body))}, body)
    ctx = RequestContext(ROUTES)
    if tenant is not None:
        ctx.principal = SimpleNamespace(scope=TenantScope.of(tenant, share_cache=False, keyed=True))  # type: ignore[assignment]
    return r, ctx


def parse_body(made: tuple[Request, RequestContext], deps: Deps, chat: bool, parse: Any) -> Any:
    r, ctx = made
    return parsed_body(r, deps, ctx, chat, parse)


@pytest.fixture
def parses() -> list[Any]:
    return []


def counting(parses: list[Any]) -> Any:
    def parse(body: Any, config: Config) -> GenerationRequest:
        parses.append(body)
        return openai.parse_chat_request(body, config)
    return parse


def test_a_tenants_identical_body_is_parsed_once(parses: list[Any]) -> None:
    deps = Deps(config=Config(), ai=ScriptedAI())
    first = parse_body(request(), deps, True, counting(parses))
    again = parse_body(request(), deps, True, counting(parses))
    assert len(parses) == 1 and again == first and again[1] is first[1]  # the same object: what is derived from it is kept
    # the parse, with the tenant's prefix scope (so the shared request never needs a copy)
    assert first[1] == replace(openai.parse_chat_request(json.loads(BODY), deps.config), prefix_scope="a")
    parse_body(request(BODY.replace(b"Hi", b"Ho")), deps, True, counting(parses))  # one byte changed
    assert len(parses) == 2


def test_another_tenant_or_another_route_never_finds_the_parse_warm(parses: list[Any]) -> None:
    deps = Deps(config=Config(), ai=ScriptedAI())
    parse_body(request(tenant="a"), deps, True, counting(parses))
    parse_body(request(tenant="b"), deps, True, counting(parses))
    parse_body(request(tenant=None), deps, True, counting(parses))
    parse_body(request(tenant="a"), deps, False, lambda b, c: counting(parses)(b, c))  # the completions route's own parse
    assert len(parses) == 4


def test_another_config_parses_anew(parses: list[Any]) -> None:
    deps = Deps(config=Config(), ai=ScriptedAI())
    parse_body(request(), deps, True, counting(parses))
    other = Deps(config=Config(model=Config().fallback_models[0]), ai=ScriptedAI(), state=deps.state)
    _, theirs = parse_body(request(), other, True, counting(parses))
    assert len(parses) == 2 and theirs.model == other.config.model and theirs == replace(openai.parse_chat_request(json.loads(BODY), other.config), prefix_scope="a")


def test_a_refused_body_is_refused_every_time_and_never_kept(parses: list[Any]) -> None:
    deps = Deps(config=Config(), ai=ScriptedAI())
    bad = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "n": 2}).encode()
    for _ in range(2):
        with pytest.raises(GatewayError):
            parse_body(request(bad), deps, True, counting(parses))
    assert len(parses) == 2 and deps.state.parsed.entries == {}


def test_the_memo_is_bounded_oldest_first() -> None:
    memo = ParsedBodies(limit=2)
    config = Config()
    for i in range(3):
        memo.keep(("k", i), config, {}, i)
    assert memo.parsed(("k", 0), config) is None and memo.parsed(("k", 2), config) == ({}, 2) and len(memo.entries) == 2
