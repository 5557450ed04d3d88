"""Structured outputs, tools and logprobs in the core, against a Workers AI binding double: what
is sent to Workers AI (its JSON-mode and function-calling shapes), how its answers render, what
each model's capabilities refuse, and how the cache keys and records them."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

import pytest

from edgellm.app import handle
from edgellm.cache.entry import CachedAnswer, record
from edgellm.cache.key import CacheScope, build_cache_key, canonical_request
from edgellm.capabilities import Capabilities, capabilities_of
from edgellm.config import Config
from edgellm.generation import Finish, Token, ToolCall, ToolCallDelta, Usage
from edgellm.openai import parse_chat_request
from edgellm.deps import Deps
from edgellm.errors import GatewayError, binding_error
from edgellm.ports import InvalidModelInput
from edgellm.structured import parse_extensions, parse_response_format
from edgellm_local.llama.errors import llama_exception, raise_llama_error
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.doubles.scripted import ScriptedAI
from tests.unit.test_app import assert_error, body_json, post, sse_events

HERMES = "@hf/nousresearch/hermes-2-pro-mistral-7b"  # JSON mode and tools, per Cloudflare's lists
LLAMA2 = "@cf/meta/llama-2-7b-chat-int8"  # neither
ASK = [{"role": "user", "content": "weather in Paris?"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@dataclass
class FunctionCallingAI(ScriptedAI):
    """A Workers AI function-calling model: `tool_calls` as `[{name, arguments: <object>}]`."""

    tool_calls: list[dict[str, Any]] | None = None

    def describe(self, model: str, *, live: bool = True) -> dict[str, Any] | None:
        return None  # like the real binding: capabilities come from config or Cloudflare's lists

    async def run(self, model: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
        result = await super().run(model, inputs)
        if self.tool_calls is not None:
            result.update(response=None, tool_calls=self.tool_calls)
        return result

    async def stream(self, model: str, inputs: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self._arrive(model, inputs, None)
        return self._tool_events() if self.tool_calls is not None else self._scripted()

    async def _tool_events(self) -> AsyncIterator[dict[str, Any]]:
        yield {"response": "", "tool_calls": self.tool_calls}
        yield {"response": "", "usage": {"prompt_tokens": 3, "completion_tokens": 9}}


def deps(ai: Any, **config: Any) -> Deps:
    return Deps(config=Config(**{"open_access": True, **config}), ai=ai, kv=None, log=logging.getLogger("edgellm.test"))


async def test_json_schema_goes_to_workers_ai_in_its_json_mode_shape() -> None:
    ai = FunctionCallingAI(response={"city": "Paris"})  # Workers AI's JSON mode answers an object
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}
    response = await handle(post("/v1/chat/completions", {"model": HERMES, "messages": ASK, "response_format": fmt}), deps(ai, model=HERMES))
    assert ai.calls[0][1]["response_format"] == {"type": "json_schema", "json_schema": SCHEMA}
    assert json.loads(body_json(response)["choices"][0]["message"]["content"]) == {"city": "Paris"}


async def test_workers_ai_tool_calls_render_as_openai_tool_calls_json_and_stream() -> None:
    ai = FunctionCallingAI(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}])
    body = {"model": HERMES, "messages": ASK, "tools": [TOOL]}
    data = body_json(await handle(post("/v1/chat/completions", body), deps(ai, model=HERMES)))
    assert ai.calls[0][1]["tools"] == [TOOL]
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    events = await sse_events(await handle(post("/v1/chat/completions", {**body, "stream": True}), deps(ai, model=HERMES)))
    deltas = [d for e in events[:-1] for d in e["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas == [{"index": 0, "id": deltas[0]["id"], "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls" and events[-1] == "[DONE]"


@pytest.mark.parametrize(("model", "extra", "param"), [
    (LLAMA2, {"response_format": {"type": "json_object"}}, "response_format"),
    (LLAMA2, {"tools": [TOOL]}, "tools"),
    (HERMES, {"tools": [TOOL], "tool_choice": "required"}, "tool_choice"),  # Workers AI cannot force a call
    (HERMES, {"tools": [TOOL], "parallel_tool_calls": False}, "parallel_tool_calls"),
    (HERMES, {"logprobs": True}, "logprobs"),
])
async def test_what_the_model_cannot_honour_is_refused_before_inference(model: str, extra: dict[str, Any], param: str) -> None:
    ai = FunctionCallingAI()
    response = await handle(post("/v1/chat/completions", {"model": model, "messages": ASK, **extra}), deps(ai, model=model))
    error = assert_error(response, 400, "unsupported_parameter")
    assert error["param"] == param and model in error["message"]
    assert ai.calls == []  # no inference spent


async def test_the_workers_ai_route_takes_its_own_shapes_and_is_held_to_the_same_capabilities() -> None:
    ai = FunctionCallingAI(response={"city": "Paris"})
    fmt = {"type": "json_schema", "json_schema": SCHEMA}
    response = await handle(post(f"/client/v4/accounts/a/ai/run/{HERMES}", {"messages": ASK, "response_format": fmt}), deps(ai, model=HERMES))
    assert ai.calls[0][1]["response_format"] == fmt and body_json(response)["success"] is True
    refused = await handle(post(f"/client/v4/accounts/a/ai/run/{LLAMA2}", {"messages": ASK, "response_format": fmt}), deps(ai))
    assert_error(refused, 400, "unsupported_parameter")


async def test_a_fallback_that_cannot_honour_the_request_is_not_tried() -> None:
    ai = FunctionCallingAI(unknown=frozenset({HERMES}))  # the primary is retired
    response = await handle(post("/v1/chat/completions", {"messages": ASK, "tools": [TOOL]}),
                            deps(ai, model=HERMES, fallback_models=(LLAMA2,)))
    assert_error(response, 502, "model_unavailable")
    assert [model for model, _ in ai.calls] == [HERMES]  # never llama-2, which would answer prose


def test_capabilities_come_from_config_then_backend_then_cloudflare_lists() -> None:
    assert capabilities_of(LLAMA2, {}, None) == Capabilities()
    assert capabilities_of(HERMES, {}, None).tools and not capabilities_of(HERMES, {}, None).logprobs
    assert capabilities_of(LLAMA2, {}, {"capabilities": ["logprobs"]}) == Capabilities(logprobs=True)
    assert capabilities_of(HERMES, {HERMES: []}, None) == Capabilities()  # configuration wins
    config = Config.from_env({"MODEL_CAPABILITIES": json.dumps({LLAMA2: ["json_mode", "tools"]}), "MODEL_ALIASES": '{"gpt-4o": ""}'})
    assert capabilities_of(LLAMA2, config.model_capabilities, None) == Capabilities(json_mode=True, tools=True)
    assert config.aliases == {"gpt-4o": LLAMA2}
    assert Config.from_env({"MODEL_ALIASES": ""}).aliases == {}
    assert Config.from_env({}).aliases == {"gpt-4o-mini": LLAMA2, "gpt-3.5-turbo": LLAMA2}
    with pytest.raises(ValueError):
        Capabilities.parse(["telepathy"])
    with pytest.raises(ValueError):  # a misspelt var fails when the vars are read, not per request
        Config.from_env({"MODEL_CAPABILITIES": json.dumps({LLAMA2: ["json-mode"]})})


def test_the_cache_key_covers_every_new_field_and_keeps_plain_keys() -> None:
    scope = CacheScope("t", "n")
    config = Config()
    plain = parse_chat_request({"messages": ASK, "temperature": 0}, config)
    assert "extensions" not in canonical_request(plain)
    keys = {build_cache_key(parse_chat_request({"messages": ASK, "temperature": 0, **extra}, config), scope).digest for extra in [
        {}, {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}},
        {"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": "required"}, {"tools": [TOOL], "parallel_tool_calls": False},
        {"logprobs": True}, {"logprobs": True, "top_logprobs": 2},
    ]}
    assert len(keys) == 8
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    other = [*turn[:2], {"role": "tool", "tool_call_id": "c1", "content": "rain"}]
    k1, k2 = (build_cache_key(parse_chat_request({"messages": m, "temperature": 0}, config), scope).digest for m in (turn, other))
    assert k1 != k2
    # `tool_choice: none` shows the model no tools: the same answer as no tools at all
    none = parse_chat_request({"messages": ASK, "temperature": 0, "tools": [TOOL], "tool_choice": "none"}, config)
    assert build_cache_key(none, scope) == build_cache_key(plain, scope)


async def test_an_entry_records_and_replays_tool_calls_and_logprobs() -> None:
    lp = ({"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []},)
    events = [Token("a", lp), ToolCallDelta(0, "c1", "f", '{"x"'), ToolCallDelta(0, None, None, ":1}"), Finish("tool_calls", Usage(2, 3))]
    answer = record("m", events, 1.0)
    assert answer is not None and answer.tool_calls == (ToolCall("c1", "f", '{"x":1}'),)
    again = CachedAnswer.decode(answer.encode())
    assert again == answer
    replayed = [e async for e in again.replay()]
    assert replayed == [Token("a", lp), ToolCallDelta(0, "c1", "f", '{"x":1}'), Finish("tool_calls", Usage(2, 3))]
    plain = record("m", [Token("hi"), Finish("stop", Usage())], 1.0)
    assert plain is not None and b"tool_calls" not in plain.encode() and b"logprobs" not in plain.encode()


def test_the_local_tool_call_stream_yields_openai_fragments_as_generated() -> None:
    from edgellm_local.llama.grammar import ToolCallStream

    answer = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "a}\\"b", "n": [1, {"x": 2}]}}, {"name": "f", "arguments": {}}]}'
    stream, events = ToolCallStream(), []
    for i in range(0, len(answer), 3):  # three characters per "token"
        events += stream.feed(answer[i:i + 3])
    calls: dict[int, dict[str, str]] = {}
    for event in events:
        call = calls.setdefault(event["index"], {"name": "", "arguments": ""})
        call["name"] += event["function"].get("name", "")
        call["arguments"] += event["function"]["arguments"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": 'a}"b', "n": [1, {"x": 2}]}), ("f", {})]
    assert [e["function"]["name"] for e in events if "id" in e] == ["get_weather", "f"]
    assert sum(1 for e in events if e["index"] == 0 and e["function"]["arguments"]) > 5
    assert ToolCallStream().feed('{"response": "hi"}') == []  # a text answer is not a call


async def test_the_workers_ai_adapter_meets_its_function_calling_and_json_mode_quirks() -> None:
    from tests.support import fake_pyodide as fp
    from tests.unit.test_pyodide_adapter import FakeAIBinding

    with fp.installed():
        from edgellm.runtime import pyodide_ai

        binding = FakeAIBinding(fp.JsDict({"response": {"city": "Paris"}, "usage": {"prompt_tokens": 3}}))
        ai = pyodide_ai.WorkersAI(binding)
        call = {"id": "call_abc123def456", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_abc123def456", "content": "sunny"}]
        await ai.run(HERMES, {"messages": messages, "tools": [TOOL]})
        sent = binding.calls[0][1]["messages"]  # JS objects: read as attributes
        short = sent[1].tool_calls[0].id
        assert len(short) == 9 and short.isalnum() and sent[2].tool_call_id == short  # a call and its result still match
        assert sent[1].content == ""  # the binding refuses a null content
        # JSON mode does not stream on Workers AI: run whole, handed on as one event
        events = await ai.stream(HERMES, {"messages": ASK, "response_format": {"type": "json_object"}})
        assert [e async for e in events] == [{"response": {"city": "Paris"}, "usage": {"prompt_tokens": 3}}]
        assert "stream" not in binding.calls[1][1]


async def test_prompt_requests_refuse_chat_only_parameters_by_name() -> None:
    ai = FunctionCallingAI()
    for path, body in [("/v1/completions", {"prompt": "x", "tools": [TOOL]}),
                       (f"/client/v4/accounts/a/ai/run/{HERMES}", {"prompt": "x", "response_format": {"type": "json_object"}})]:
        error = assert_error(await handle(post(path, body), deps(ai, model=HERMES)), 400, "unsupported_parameter")
        assert error["param"] in ("tools", "response_format")
    assert ai.calls == []


def test_a_request_checked_against_one_models_capabilities_is_checked_again_against_others() -> None:
    """`enforce_capabilities` keeps what a (shared, immutable) request needs, never whether it
    passed: the backend saying less later refuses the same request object; a plain request
    needs nothing and passes whatever the backend says."""
    from types import SimpleNamespace

    from edgellm.api import enforce_capabilities
    from edgellm.config import Config
    from edgellm.errors import GatewayError
    from edgellm.openai import parse_chat_request

    config = Config()
    request = parse_chat_request({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}, config)
    deps = SimpleNamespace(config=config, ai=None)
    enforce_capabilities(deps, request, {"capabilities": ["json_mode"]})  # type: ignore[arg-type]
    enforce_capabilities(deps, request, {"capabilities": ["json_mode"]})  # type: ignore[arg-type]
    with pytest.raises(GatewayError, match="response_format"):
        enforce_capabilities(deps, request, {"capabilities": []})  # type: ignore[arg-type]
    plain = parse_chat_request({"messages": [{"role": "user", "content": "x"}]}, config)
    enforce_capabilities(deps, plain, {"capabilities": []})  # type: ignore[arg-type]
    assert plain.derived["needs"] == () and request.derived["needs"] == (("json_mode", "response_format"),)


def test_the_local_tool_call_stream_keeps_each_calls_arguments_under_its_own_index() -> None:
    """Two calls in one piece (a whole answer is read in one piece; a token can hold `}}, {`): the
    first call's arguments stay the first's, never glued onto the second's."""
    from edgellm_local.llama.grammar import ToolCallStream

    answer = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Lon'
    calls: dict[int, str] = {}
    for event in ToolCallStream().feed(answer):
        calls[event["index"]] = calls.get(event["index"], "") + event["function"]["arguments"]
    assert calls == {0: '{"city": "Paris"}', 1: '{"city": "Lon'}


async def test_whole_tool_calls_gives_each_call_one_name_its_own_arguments_and_drops_the_cut_one() -> None:
    from edgellm.generation import Finish, Token, ToolCallDelta, Usage
    from edgellm.inference import whole_tool_calls

    async def events(*items: object):  # type: ignore[no-untyped-def]
        for item in items:
            yield item

    async def run(*items: object) -> list[object]:
        return [e async for e in whole_tool_calls(events(*items))]

    cut = await run(ToolCallDelta(0, "a", "f", '{"x":'), ToolCallDelta(0, None, None, "1}"),
                    ToolCallDelta(0, "b", "g", '{"y":'), Token("t"), Finish("length", Usage(1, 9)))
    assert cut == [Token("t"), ToolCallDelta(0, "a", "f", '{"x":1}'), Finish("length", Usage(1, 9))]  # g: a second name, cut
    nameless = await run(ToolCallDelta(0, None, None, "{}"), Finish("tool_calls", Usage(1, 2)))
    assert nameless == [Finish("stop", Usage(1, 2))]  # no usable call: not a tool-calls finish
    whole = await run(ToolCallDelta(3, "a", "f", "{}"), ToolCallDelta(5, "b", "f", '{"z":2}'), Finish("tool_calls", Usage()))
    assert whole == [ToolCallDelta(0, "a", "f", "{}"), ToolCallDelta(1, "b", "f", '{"z":2}'), Finish("tool_calls", Usage())]


# --- schemas: what a grammar may cost, and what llama.cpp's grammar builder refuses ----------


def enum_of(count: int, width: int = 12) -> dict[str, Any]:
    return {"type": "string", "enum": [f"v{i:06d}".ljust(width, "x") for i in range(count)]}


def optional_properties(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(count)}}


def square_array(side: int) -> dict[str, Any]:
    row = {"type": "array", "items": {"type": "integer"}, "minItems": side, "maxItems": side}
    return {"type": "array", "items": row, "minItems": side, "maxItems": side}


DEFS_LOOP = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
ANY_OF_LOOP = {"$defs": {"a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}
# (schema, error code, words the message must hold: what is wrong and where)
REFUSED_SCHEMAS = {
    "20,000-value enum": (enum_of(20_000), "schema_too_complex", ["'enum'", "20000", "1000"]),
    "enums past the total": ({"type": "object", "properties": {"a": enum_of(600), "b": enum_of(600)}, "required": ["a", "b"]},
                             "schema_too_complex", ["'enum'", "1200"]),
    "anyOf past the total": ({"anyOf": [{"const": f"c{i}"} for i in range(1001)]}, "schema_too_complex", ["'anyOf'", "1001"]),
    "long literals": (enum_of(100, 1300), "schema_too_complex", ["characters", "120000"]),
    "optional properties": (optional_properties(129), "schema_too_complex", ["optional", "129", "#"]),
    "required, not a property": ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"],
                                  "additionalProperties": False}, "invalid_schema", ["'b'", "required", "#"]),
    "required, extra allowed": ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"],
                                 "additionalProperties": True}, "invalid_schema", ["'b'", "required"]),
    "required, no properties": ({"type": "object", "required": ["b"]}, "invalid_schema", ["'b'"]),
    "required across allOf, missing": ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                                                  {"type": "object", "required": ["a", "z"]}]}, "invalid_schema", ["'z'"]),
    "$ref to the root": ({"type": "object", "properties": {"a": {"$ref": "#"}}}, "unsupported_schema", ["'#'", "#/properties/a"]),
    "mutual $refs": (DEFS_LOOP, "invalid_schema", ["#/$defs/a", "loop"]),
    "anyOf looping to itself": (ANY_OF_LOOP, "invalid_schema", ["loop"]),
    "allOf looping to itself": ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]}, "invalid_schema", ["loop"]),
    "~1 in a pointer": ({"$defs": {"a/b": {"type": "string"}}, "$ref": "#/$defs/a~1b"}, "unsupported_schema", ["~1"]),
    "4096 x 4096 arrays": (square_array(4096), "invalid_schema", ["'minItems'", "2000"]),
    "maxLength past llama.cpp's count": ({"type": "string", "maxLength": 2001}, "invalid_schema", ["'maxLength'", "2000"]),
}
ACCEPTED_SCHEMAS = {
    "1000-value enum": enum_of(1000),
    "128 optional properties": optional_properties(128),
    "2000 x 2000 arrays": square_array(2000),
    "maxLength 2000": {"type": "string", "maxLength": 2000},
    "required across allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                                        {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["a", "b"]}]},
    "recursion through an object": {"$defs": {"node": {"type": "object", "properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}}}},
                                    "$ref": "#/$defs/node"},
}


@pytest.mark.parametrize("name", REFUSED_SCHEMAS)
def test_a_schema_too_costly_or_that_no_grammar_can_honour_is_a_400_saying_what(name: str) -> None:
    schema, code, words = REFUSED_SCHEMAS[name]
    with pytest.raises(GatewayError) as refused:
        parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, openai_shape=True)
    error = refused.value
    assert (error.status, error.code, error.param) == (400, code, "response_format.json_schema.schema"), error.message
    for word in words:
        assert word in error.message, error.message


@pytest.mark.parametrize("name", ACCEPTED_SCHEMAS)
def test_a_schema_within_the_bounds_is_accepted(name: str) -> None:
    assert parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": ACCEPTED_SCHEMAS[name]}},
                                 openai_shape=True) == {"type": "json_schema", "json_schema": ACCEPTED_SCHEMAS[name]}


LLAMA_REFUSES = ["$ref to the root", "mutual $refs", "anyOf looping to itself", "~1 in a pointer", "4096 x 4096 arrays"]


@pytest.mark.parametrize("name", LLAMA_REFUSES + list(ACCEPTED_SCHEMAS))
def test_the_bounds_agree_with_llama_cpps_grammar_builder(tiny_runner: LlamaCppRunner, name: str) -> None:
    """What the check refuses as llama.cpp's refusal, llama.cpp does refuse; what it accepts at
    its bounds, llama.cpp builds a grammar for and generates under."""
    schema = REFUSED_SCHEMAS[name][0] if name in REFUSED_SCHEMAS else ACCEPTED_SCHEMAS[name]
    body = {"messages": [{"role": "user", "content": "json"}], "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    try:
        result = tiny_runner.chat(body)
        refused = isinstance(result, dict) and "error" in result
    except ValueError:
        refused = True
    assert refused == (name in LLAMA_REFUSES), result


CONVERTER_REFUSAL = "Unable to generate parser for this template. Automatic parser generation failed: JSON schema error at #: "
PARSER_REFUSAL = "Failed to initialize samplers: failed to parse grammar "
GRAMMAR_FAILURES = {
    "a schema the converter refuses": lambda text: llama_exception(ValueError(CONVERTER_REFUSAL + text)),
    "a grammar the parser refuses": lambda text: _raised(lambda: raise_llama_error({"error": {"code": 400, "message": PARSER_REFUSAL + text}})),
}


def _raised(call: Any) -> BaseException:
    with pytest.raises(Exception) as raised:
        call()
    return raised.value


@pytest.mark.parametrize("failure", GRAMMAR_FAILURES)
def test_llama_cpps_grammar_failures_say_the_schema_and_log_its_size_and_hash_not_its_text(failure: str) -> None:
    """A failure check_schema did not foresee still tells the caller it is the schema (not 'the
    chat template refused the messages'), and the log line it makes (its text, the error's
    detail) carries the size and hash of llama.cpp's text, which holds the schema, never the text
    itself: one such line once held 6.5 MB of a caller's schema."""
    schema_text = json.dumps({"enum": ["x" * 100] * 65_000})
    error = GRAMMAR_FAILURES[failure](schema_text)
    said = (CONVERTER_REFUSAL if "converter" in failure else PARSER_REFUSAL) + schema_text
    assert isinstance(error, InvalidModelInput)
    assert "schema" in error.public and "chat template" not in error.public
    logged = binding_error(error, "The AI binding", "ai")
    assert logged.status == 400 and "schema" in logged.message and "xxxx" not in logged.message
    assert len(logged.detail) < 1000, len(logged.detail)
    assert f"{len(said.encode())} bytes" in logged.detail and hashlib.sha256(said.encode()).hexdigest()[:16] in logged.detail
    assert llama_exception(ValueError("short")).args[0].endswith("short")  # a short text is logged as it is


def test_the_schemas_of_one_request_are_bounded_together() -> None:
    """A request's tools and response_format become one grammar (the tool-call envelope is the
    choice of every tool's parameters): 3 tools of 400 enum values each, each within the bound,
    are 1200 choices in one grammar."""
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object", "properties": {"v": enum_of(400)},
                                                                              "required": ["v"]}}} for i in range(3)]
    with pytest.raises(GatewayError) as refused:
        parse_extensions({"tools": tools}, openai_shape=True)
    assert (refused.value.status, refused.value.code, refused.value.param) == (400, "schema_too_complex", "tools")
    assert "1000" in refused.value.message and "tools" in refused.value.message
    with pytest.raises(GatewayError) as refused:
        parse_extensions({"tools": tools[:2], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": enum_of(300)}}},
                         openai_shape=True)
    assert refused.value.code == "schema_too_complex"
    assert parse_extensions({"tools": tools[:2]}, openai_shape=True)["tools"] == tools[:2]


def test_a_long_chain_of_references_is_checked_without_deep_recursion() -> None:
    chain = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(1500)}
    chain["a1500"] = {"type": "string"}
    schema = {"$defs": chain, "$ref": "#/$defs/a0"}
    assert parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, openai_shape=True)
    chain["a1500"] = {"$ref": "#/$defs/a0"}
    with pytest.raises(GatewayError) as refused:
        parse_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, openai_shape=True)
    assert refused.value.code == "invalid_schema" and "loop" in refused.value.message
