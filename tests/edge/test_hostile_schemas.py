"""Hostile JSON schemas through the real local edge, itself a child process under a memory limit
(`tests/support/watched_edge.py`): an impossible schema once grew the edge by ~330 MB/s inside
llama.cpp's grammar builder; here such a regression kills the child at its limit and the test
fails, never the machine, never a hang. Every place a schema enters is tried: chat
`response_format` (both spellings), a tool's `parameters`, Responses `text.format`, `/client/v4`."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.support.watched_edge import WatchedEdge

WAIT = 60
MODEL = "@cf/meta/llama-2-7b-chat-int8"


@pytest.fixture(scope="module")
def edge(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchedEdge]:
    watched = WatchedEdge.start(tiny_model, tmp_path_factory.mktemp("hostile-schema-edge"))
    yield watched
    watched.stop()


@pytest.fixture
def client(edge: WatchedEdge) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=edge.url, timeout=WAIT, headers={"cf-aig-skip-cache": "true"}) as c:
        yield c
    assert edge.alive(), "the edge process died (memory limit?):\n" + edge.log()[-3000:]
    assert httpx.get(edge.url + "/healthz", timeout=5).status_code == 200


def messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": f"give me json {uuid.uuid4().hex}"}]


def chat_schema(schema: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"messages": messages(), "max_tokens": 8,
                                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def chat_json_object(schema: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"messages": messages(), "max_tokens": 8, "response_format": {"type": "json_object", "schema": schema}}


def tool_parameters(schema: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"messages": messages(), "max_tokens": 8,
                                    "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}


def responses_format(schema: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"input": f"json {uuid.uuid4().hex}", "max_output_tokens": 8,
                             "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}


def workers_ai(schema: Any) -> tuple[str, dict[str, Any]]:
    return f"/client/v4/accounts/acct/ai/run/{MODEL}", {"messages": messages(), "max_tokens": 8,
                                                        "response_format": {"type": "json_schema", "json_schema": schema}}


PLACES: dict[str, Callable[[Any], tuple[str, dict[str, Any]]]] = {
    "chat": chat_schema, "json_object": chat_json_object, "tool": tool_parameters, "responses": responses_format,
    "client_v4": workers_ai}


def error_of(response: httpx.Response) -> dict[str, Any]:
    data = response.json()
    if "errors" in data:  # Cloudflare's envelope
        return {"message": data["errors"][0]["message"], "code": None}
    return data["error"]


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


IMPOSSIBLE = {
    "minLength": {"type": "string", "minLength": 5, "maxLength": 2},
    "minItems": {"type": "array", "items": {"type": "integer"}, "minItems": 9, "maxItems": 3},
    "maxLength": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 10**9}}},
    "minimum": {"type": "integer", "minimum": 10, "maximum": 1},
}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("keyword", IMPOSSIBLE)
def test_an_impossible_schema_is_a_400_naming_the_keyword(client: httpx.Client, place: str, keyword: str) -> None:
    path, body = PLACES[place](IMPOSSIBLE[keyword])
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    assert keyword in error_of(response)["message"]


UNHONOURED = {
    "not": {"type": "string", "not": {"const": "x"}},
    "lookahead": {"type": "string", "pattern": "^(?=a)a+$"},
    "backreference": {"type": "string", "pattern": "^(a)\\1$"},
    "\\p": {"type": "string", "pattern": "^\\p{L}+$"},
    "without its ')'": {"type": "string", "pattern": "^(ab$"},
    "email": {"type": "string", "format": "email"},
    "multipleOf": {"type": "integer", "multipleOf": 3},
}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("feature", UNHONOURED)
def test_a_feature_the_grammar_cannot_honour_is_refused_by_name(client: httpx.Client, place: str, feature: str) -> None:
    path, body = PLACES[place](UNHONOURED[feature])
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    message = error_of(response)["message"]
    assert (feature if feature != "lookahead" and feature != "backreference" else {"lookahead": "(?", "backreference": "\\1"}[feature]) in message


def test_a_schema_unrolling_past_the_bound_is_refused(client: httpx.Client) -> None:
    path, body = chat_schema({"type": "string", "pattern": "^((a{1000}){1000}){1000}$"})
    response = client.post(path, json=body)
    assert response.status_code == 400 and "pattern" in error_of(response)["message"]


@pytest.mark.parametrize("levels", [100, 300])
def test_a_deeply_nested_text_format_is_a_400_before_generation_stored_or_streamed(client: httpx.Client, levels: int) -> None:
    path, body = responses_format(nested(levels))
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text[:500]
    with client.stream("POST", path, json={**body, "stream": True}) as streamed:
        streamed.read()
    assert streamed.status_code == 400


def test_a_schema_within_the_bounds_is_served_and_stored(client: httpx.Client) -> None:
    path, body = responses_format(nested(20))
    response = client.post(path, json={**body, "max_output_tokens": 4})
    assert response.status_code == 200, response.text[:500]
    stored = client.get(f"/v1/responses/{response.json()['id']}")
    assert stored.status_code == 200 and stored.json()["text"]["format"]["schema"] == nested(20)
    path, body = chat_json_object({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                                   "required": ["n"], "additionalProperties": False})
    answer = client.post(path, json={**body, "max_tokens": 20})
    assert answer.status_code == 200, answer.text
    if answer.json()["choices"][0]["finish_reason"] == "stop":  # the schema is honoured, not dropped
        assert 0 <= json.loads(answer.json()["choices"][0]["message"]["content"])["n"] <= 9


def test_schemas_that_would_cost_without_bound_are_refused_while_another_caller_is_served(client: httpx.Client) -> None:
    """Two 20,000-value enums at once (each ~300 KB) once held both of the edge's generating
    slots for minutes, past their answers' deadline, and every other caller got 503: refused
    before any grammar is built, they hold nothing, and a plain request beside them is answered."""
    path, body = chat_schema({"type": "string", "enum": [f"value-{i:06d}" for i in range(20_000)]})
    with ThreadPoolExecutor(3) as pool:
        costly = [pool.submit(client.post, path, json={**body, "messages": messages()}) for _ in range(2)]
        plain = pool.submit(client.post, "/v1/chat/completions", json={"messages": messages(), "max_tokens": 4})
        refusals, answer = [f.result() for f in costly], plain.result()
    for refused in refusals:
        assert refused.status_code == 400, refused.text[:300]
        error = error_of(refused)
        assert error["code"] == "schema_too_complex" and "'enum'" in error["message"] and "20000" in error["message"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize("place", ["chat", "tool", "responses", "client_v4"])
@pytest.mark.parametrize("name, schema, words", [
    ("ref to the root", {"type": "object", "properties": {"a": {"$ref": "#"}}}, ["'#'", "root"]),
    ("mutual refs", {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, ["refers back to itself"]),
    ("pointer escape", {"$defs": {"a/b": {"type": "string"}}, "$ref": "#/$defs/a~1b"}, ["~1"]),
    ("4096 x 4096 arrays", {"type": "array", "minItems": 4096, "maxItems": 4096,
                            "items": {"type": "array", "minItems": 4096, "maxItems": 4096, "items": {"type": "integer"}}},
     ["'minItems'", "2000"]),
    ("required, no such property", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]},
     ["'b'", "'properties'"]),
])
def test_a_schema_llama_cpp_cannot_build_is_a_400_saying_what_is_wrong_with_it(client: httpx.Client, place: str, name: str,
                                                                               schema: dict[str, Any], words: list[str]) -> None:
    path, body = PLACES[place](schema)
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text[:300]
    message = error_of(response)["message"]
    assert "chat template" not in message
    for word in words:
        assert word in message, message
