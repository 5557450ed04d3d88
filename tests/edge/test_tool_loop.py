"""Tool calls as clients nobody here wrote use them: the official `openai` SDK and LangChain's
`bind_tools`, through the local edge on real llama.cpp.

- The binding's internal call envelope never reaches a client: a call cut by max_tokens is a
  partial `tool_calls` entry with finish_reason "length", streamed and not (tiny model: only the
  grammar is relied on).
- A whole loop ends: call, `role: "tool"` result, final text answer, on the default model
  (SmolLM2-135M-Instruct). Shape is asserted, never wording.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import openai
import pytest

from edgellm.config import Config
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.model_file import default_model_path
from edgellm_local.emulator.server import EdgeServer

MODEL = "@cf/meta/llama-2-7b-chat-int8"
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TIME_TOOL = {"type": "function", "function": {  # arguments the tiny model completes: an enum
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
RESULT = json.dumps({"city": "Paris", "temperature_c": 21, "sky": "sunny"})


def leaks(text: str | None) -> bool:
    return bool(text) and any(k in text for k in ('"tool_calls"', '"response"', "tool_response", '{"name"'))


def sdk(server: EdgeServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused-locally", max_retries=0, timeout=120)


@pytest.fixture
def tiny(start_edge: Callable[..., EdgeServer]) -> Iterator[openai.OpenAI]:
    with sdk(start_edge(kv=None)) as client:
        yield client


@pytest.fixture(scope="module")
def smollm2_runner() -> LlamaCppRunner:
    return LlamaCppRunner(default_model_path(), n_ctx=2048, n_parallel=1, threads=1).load()


@pytest.fixture
def default_edge(start_edge: Callable[..., EdgeServer], smollm2_runner: LlamaCppRunner) -> EdgeServer:
    config = Config(open_access=True)
    return start_edge(kv=None, config=config, ai=LlamaCppAI.for_config(config, smollm2_runner))


def assemble(chunks: list[Any]) -> tuple[str | None, dict[int, dict[str, str]], str | None]:
    """What a streaming client builds: content (None if never given text), calls, finish reason."""
    content: str | None = None
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content is not None:
                content = (content or "") + choice.delta.content
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                call["name"] += (delta.function.name or "") if delta.function else ""
                call["arguments"] += (delta.function.arguments or "") if delta.function else ""
            finish = choice.finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize("max_tokens", [1, 3, 6, 10, 16, 40])
def test_a_forced_call_cut_by_max_tokens_is_dropped_never_sent_half_written(tiny: openai.OpenAI, max_tokens: int) -> None:
    """A call whose arguments the cut left unfinished is no call a client could make: the answer
    says `length` and carries no call, the same streamed or not (never a partial call, whose
    arguments fail to parse in the AI SDK's and litellm's tool loops)."""
    ask = dict(model=MODEL, messages=ASK, tools=[WEATHER_TOOL], tool_choice="required", temperature=0, max_tokens=max_tokens)
    whole = tiny.chat.completions.create(**ask)  # type: ignore[call-overload]
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert not leaks(choice.message.content)
    streamed_content, streamed, finish = assemble(list(tiny.chat.completions.create(**ask, stream=True)))  # type: ignore[call-overload]
    assert finish == "length" and not leaks(streamed_content)
    assert (choice.message.content or "") == (streamed_content or "")
    whole_calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert whole_calls == [(c["name"], c["arguments"]) for c in streamed.values()]
    for name, arguments in whole_calls:  # a call that is there is whole: its arguments parse
        assert name == "get_weather" and isinstance(json.loads(arguments), dict)


@pytest.mark.parametrize("max_tokens", [2, 5, 9, 14, 20, 30])
@pytest.mark.parametrize("stream", [False, True])
def test_auto_cut_anywhere_never_shows_the_envelope(tiny: openai.OpenAI, max_tokens: int, stream: bool) -> None:
    ask = dict(model=MODEL, messages=ASK, tools=[WEATHER_TOOL], temperature=0.9, seed=max_tokens, max_tokens=max_tokens)
    if stream:
        content, calls, finish = assemble(list(tiny.chat.completions.create(**ask, stream=True)))  # type: ignore[call-overload]
        names = [c["name"] for c in calls.values()]
    else:
        choice = tiny.chat.completions.create(**ask).choices[0]  # type: ignore[call-overload]
        content, finish, names = choice.message.content, choice.finish_reason, [c.function.name for c in choice.message.tool_calls or []]
    assert not leaks(content)
    assert all(n == "get_weather" for n in names)
    assert finish in ("length", "stop", "tool_calls")


def test_a_streamed_tool_call_has_no_content_like_the_unstreamed_one(tiny: openai.OpenAI) -> None:
    ask = dict(model=MODEL, messages=ASK, tools=[TIME_TOOL], tool_choice="required", temperature=0, max_tokens=200)
    whole = tiny.chat.completions.create(**ask).choices[0]  # type: ignore[call-overload]
    with tiny.chat.completions.stream(**ask) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion().choices[0]
    assert whole.message.tool_calls and final.message.tool_calls
    assert whole.message.content is None and final.message.content is None


def test_the_openai_sdk_tool_loop_ends_with_an_answer(default_edge: EdgeServer) -> None:
    messages: list[Any] = list(ASK)
    with sdk(default_edge) as client:
        first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],  # type: ignore[arg-type]
                                               temperature=0, max_tokens=80)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]  # type: ignore[index]
        assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
        for stream in (False, True):
            if stream:
                content, calls, finish = assemble(list(client.chat.completions.create(
                    model=MODEL, messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=80, stream=True)))  # type: ignore[arg-type]
            else:
                answer = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],  # type: ignore[arg-type]
                                                        temperature=0, max_tokens=80).choices[0]
                content, calls, finish = answer.message.content, answer.message.tool_calls, answer.finish_reason
            assert not calls and finish == "stop"
            assert isinstance(content, str) and content.strip() and not leaks(content)


def test_langchain_bind_tools_loop_ends_with_an_answer(default_edge: EdgeServer) -> None:
    import langchain_openai
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = langchain_openai.ChatOpenAI(base_url=f"{default_edge.url}/v1", api_key="unused-locally", model=MODEL,
                                      temperature=0, max_tokens=80, max_retries=0, timeout=120)

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return RESULT

    bound = llm.bind_tools([get_weather])
    history: list[Any] = [HumanMessage("What is the weather in Paris?")]
    first = bound.invoke(history)
    assert first.tool_calls and first.tool_calls[0]["name"] == "get_weather"
    assert isinstance(first.tool_calls[0]["args"], dict) and not leaks(str(first.content))
    history += [first, ToolMessage(get_weather(**first.tool_calls[0]["args"]) if first.tool_calls[0]["args"].keys() == {"city"} else RESULT,
                                   tool_call_id=first.tool_calls[0]["id"])]
    final = bound.invoke(history)
    assert not final.tool_calls
    assert isinstance(final.content, str) and final.content.strip() and not leaks(final.content)
