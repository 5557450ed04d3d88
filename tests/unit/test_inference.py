"""Running a generation on the AI binding: fallback, stop sequences, finish reasons, and the one
place binding failures become HTTP errors. The binding is a fault-injecting double."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

import pytest

from edgellm.config import Config
from edgellm.errors import GatewayError
from edgellm.generation import Finish, Generation, GenerationRequest, Token, Usage
from edgellm.inference import apply_stop, binding_error, candidate_models, finish_reason, start_generation
from edgellm.ports import BindingError, CapacityExceeded, InvalidModelInput, ModelNotFound
from edgellm.deps import Deps
from edgellm_local.doubles.scripted import ScriptedAI

PRIMARY = "@cf/meta/llama-2-7b-chat-int8"
FALLBACK = "@cf/meta/llama-2-7b-chat-hf-lora"
CONFIG = Config(model=PRIMARY, fallback_models=(FALLBACK, "@cf/third/model"))


def deps_with(ai: Any, config: Config = CONFIG) -> Deps:
    return Deps(config=config, ai=ai, log=logging.getLogger("edgellm.test"))


def request(stream: bool = False, stop: tuple[str, ...] = (), max_tokens: int = 256, model: str = PRIMARY) -> GenerationRequest:
    inputs = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "temperature": 0.6}
    return GenerationRequest(model, inputs, stop=stop, stream=stream)


async def events_of(generation: Generation) -> list[Any]:
    return [e async for e in generation.events]


# --- fallback --------------------------------------------------------------------------------


def test_candidates_are_the_requested_model_then_the_fallbacks_without_duplicates() -> None:
    deps = deps_with(ScriptedAI())
    assert candidate_models(deps, PRIMARY) == [PRIMARY, FALLBACK, "@cf/third/model"]
    assert candidate_models(deps, FALLBACK) == [FALLBACK, "@cf/third/model"]


@pytest.mark.parametrize("stream", [False, True])
async def test_falls_back_to_the_next_model_when_the_binding_does_not_know_it(stream: bool) -> None:
    ai = ScriptedAI(unknown=frozenset({PRIMARY}))
    generation = await start_generation(deps_with(ai), request(stream))
    assert generation.model == FALLBACK
    text, finish = await generation.collect()
    assert text == "Hello, world!"
    assert [model for model, _ in ai.calls] == [PRIMARY, FALLBACK]


@pytest.mark.parametrize("stream", [False, True])
async def test_every_model_retired_is_a_502_with_retry_after(stream: bool) -> None:
    ai = ScriptedAI(unknown=frozenset(CONFIG.models))
    with pytest.raises(GatewayError) as info:
        await start_generation(deps_with(ai), request(stream))
    assert info.value.status == 502
    assert info.value.code == "model_unavailable"
    assert info.value.retry_after and info.value.retry_after > 0
    assert [model for model, _ in ai.calls] == list(CONFIG.models)


async def test_other_failures_do_not_fall_back() -> None:
    ai = ScriptedAI(fail=CapacityExceeded("3040: capacity"))
    with pytest.raises(GatewayError):
        await start_generation(deps_with(ai), request())
    assert [model for model, _ in ai.calls] == [PRIMARY]


async def test_stream_flag_reaches_the_binding_and_inputs_pass_unchanged() -> None:
    ai = ScriptedAI()
    await events_of(await start_generation(deps_with(ai), request(stream=True)))
    _, inputs = ai.calls[0]
    assert inputs["stream"] is True
    assert inputs["messages"] == [{"role": "user", "content": "hi"}]
    ai = ScriptedAI()
    await events_of(await start_generation(deps_with(ai), request(stream=False)))
    assert "stream" not in ai.calls[0][1]


# --- binding errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "code", "retry"),
    [
        (CapacityExceeded("3040: Capacity temporarily exceeded"), 503, "capacity_exceeded", True),
        (BindingError("InferenceUpstreamError: 5000"), 502, "upstream_error", True),
        (InvalidModelInput("5006: Input validation error"), 400, "invalid_model_input", False),
        (ModelNotFound("5007: No such model"), 502, "model_unavailable", True),
    ],
)
def test_binding_error_translation(error: BindingError, status: int, code: str, retry: bool) -> None:
    gateway = binding_error(error, PRIMARY)
    assert (gateway.status, gateway.code) == (status, code)
    assert (gateway.retry_after is not None) is retry
    assert str(error) in (gateway.detail or "") and gateway.message  # the binding's text is the log's
    response = gateway.to_response()
    assert response.status == status
    assert ("retry-after" in response.headers) is retry


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("error", "status"),
    [
        (CapacityExceeded("busy"), 503),
        (BindingError("reset"), 502),
        (ConnectionResetError("peer reset"), 502),  # an adapter let a raw error through
        (TimeoutError(), 502),
    ],
)
async def test_failures_at_the_call_become_gateway_errors(stream: bool, error: BaseException, status: int) -> None:
    with pytest.raises(GatewayError) as info:
        await start_generation(deps_with(ScriptedAI(fail=error)), request(stream))
    assert info.value.status == status
    assert info.value.retry_after is not None


@pytest.mark.parametrize("mid_stream", [BindingError("connection reset"), RuntimeError("JS read failed")])
async def test_a_failure_mid_stream_raises_a_gateway_error_after_the_tokens_sent(mid_stream: BaseException) -> None:
    ai = ScriptedAI(fail_after=2, mid_stream=mid_stream)
    generation = await start_generation(deps_with(ai), request(stream=True))
    received: list[Any] = []
    with pytest.raises(GatewayError) as info:
        async for event in generation.events:
            received.append(event)
    assert received == [Token("Hello"), Token(",")]
    assert info.value.status == 502
    assert ai.closed == 1


@pytest.mark.parametrize("stop", [(), ("zzz",)])
@pytest.mark.parametrize("read", [0, 2])
async def test_closing_a_streamed_generation_closes_the_binding_stream_read_or_not(read: int, stop: tuple[str, ...]) -> None:
    """A client gone before the first token (read=0) or mid-answer: the binding's stream is
    closed at once, with or without stop sequences, not left to the garbage collector."""
    ai = ScriptedAI(open_streams=True)
    generation = await start_generation(deps_with(ai), request(stream=True, stop=stop))
    for _ in range(read):
        await anext(generation.events)
    await generation.events.aclose()  # type: ignore[attr-defined]
    assert [s.closed for s in ai.streams] == [True]


async def test_a_result_without_text_is_an_upstream_error() -> None:
    generation = await start_generation(deps_with(ScriptedAI(response=None, tokens=())), request())
    assert (await generation.collect())[0] == ""  # an empty answer is fine
    generation = await start_generation(deps_with(ScriptedAI(response=42)), request())
    with pytest.raises(GatewayError) as info:
        await generation.collect()
    assert info.value.status == 502


# --- finish reasons and usage -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "max_tokens", "reason"),
    [(5, 256, "stop"), (255, 256, "stop"), (256, 256, "length"), (300, 256, "length"), (1, 1, "length"), (0, 1, "stop")],
)
def test_finish_reason(completion: int, max_tokens: int, reason: str) -> None:
    assert finish_reason(Usage(10, completion), max_tokens) == reason


@pytest.mark.parametrize("stream", [False, True])
async def test_usage_and_finish_come_from_the_binding(stream: bool) -> None:
    ai = ScriptedAI(usage={"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14})
    text, finish = await (await start_generation(deps_with(ai), request(stream, max_tokens=5))).collect()
    assert text == "Hello, world!"
    assert finish == Finish("length", Usage(9, 5))
    _, finish = await (await start_generation(deps_with(ai), request(stream, max_tokens=6))).collect()
    assert finish.finish_reason == "stop"


async def test_a_stream_without_usage_counts_one_token_per_event() -> None:
    ai = ScriptedAI(usage=None)
    events = await events_of(await start_generation(deps_with(ai), request(stream=True, max_tokens=5)))
    assert events[-1] == Finish("length", Usage(0, 5))
    assert [e.text for e in events[:-1]] == ["Hello", ",", " wor", "ld", "!"]  # token by token, in order


# --- stop sequences ---------------------------------------------------------------------------


async def _tokens(*texts: str, usage: Usage = Usage(3, 9)) -> AsyncIterator[Any]:
    for text in texts:
        yield Token(text)
    yield Finish("length", usage)


async def _collect(events: AsyncIterator[Any]) -> tuple[str, list[Any]]:
    out = [e async for e in events]
    return "".join(e.text for e in out if isinstance(e, Token)), out


@pytest.mark.parametrize(
    ("tokens", "stops", "text", "reason"),
    [
        (("Hello", " wor", "ld"), (), "Hello world", "length"),
        (("Hello", " wor", "ld"), ("world",), "Hello ", "stop"),  # split across tokens
        (("Hello", " wor", "ld"), ("o",), "Hell", "stop"),  # the earliest match wins
        (("Hello", " wor", "ld"), ("xyz", " w"), "Hello", "stop"),  # any of several
        (("ab", "cd"), ("bc",), "a", "stop"),
        (("abc",), ("abc",), "", "stop"),  # a stop at the very start gives empty text
        (("Hello", " wor", "ld"), ("zzz",), "Hello world", "length"),  # held-back text is released at the end
        (("a\n", "\nb"), ("\n\n",), "a", "stop"),
    ],
)
async def test_stop_sequences(tokens: tuple[str, ...], stops: tuple[str, ...], text: str, reason: str) -> None:
    got, events = await _collect(apply_stop(_tokens(*tokens), stops, live=False))
    assert got == text
    assert isinstance(events[-1], Finish) and events[-1].finish_reason == reason
    assert sum(isinstance(e, Finish) for e in events) == 1


async def test_stop_on_a_finished_result_keeps_the_exact_usage() -> None:
    _, events = await _collect(apply_stop(_tokens("ab", "cd", "ef", usage=Usage(3, 9)), ("cd",), live=False))
    assert events[-1] == Finish("stop", Usage(3, 9))


@pytest.mark.parametrize(("stops", "text"), [(("world",), "Hello "), (("ld",), "Hello wor")])
async def test_stop_on_a_live_stream_closes_the_upstream_at_once(stops: tuple[str, ...], text: str) -> None:
    ai = ScriptedAI(tokens=("Hello", " wor", "ld", " and", " more", " tokens"))
    generation = await start_generation(deps_with(ai), request(stream=True, stop=stops))
    got, events = await _collect(generation.events)
    assert got == text
    assert events[-1].finish_reason == "stop"
    assert ai.sent == 3  # nothing read after the token that completed the stop sequence
    assert ai.closed == 1
    assert events[-1].usage.completion_tokens == 3


async def test_stop_text_is_released_as_soon_as_it_cannot_start_a_match() -> None:
    """Holding back more than len(stop) - 1 characters would delay tokens needlessly."""
    requested: list[str] = []

    async def source() -> AsyncIterator[Any]:
        for text in ("abc", "def"):
            yield Token(text)
            requested.append(text)
        yield Finish("stop", Usage())

    events = apply_stop(source(), ("xyz",))
    assert await anext(events) == Token("a")  # len("xyz") - 1 characters are held back
    assert requested == []  # released before the next token was even asked for
    assert [e async for e in events] == [Token("bcd"), Token("ef"), Finish("stop", Usage())]


# --- a whole answer's deadline ------------------------------------------------


async def test_a_whole_answer_past_its_deadline_is_a_503_with_retry_after_and_the_call_is_cancelled() -> None:
    ai = ScriptedAI(hold_runs=True)  # a whole-answer call that never returns (a stalled Workers AI `run`)
    config = Config(model=PRIMARY, fallback_models=(), start_timeout_seconds=0.05, run_min_tokens_per_second=1000)
    with pytest.raises(GatewayError) as info:
        async with asyncio.timeout(30):  # a regression fails here, never hangs
            await start_generation(deps_with(ai, config), request(max_tokens=50))
    error = info.value
    assert (error.status, error.code, error.retry_after) == (503, "answer_timeout", 5)
    assert error.spent  # charged its reservation: the binding may have made all of it
    assert "0.1 s" in error.message  # 0.05 + 50/1000, the deadline it was given
    assert ai.called == 1 and ai.cancelled.is_set()  # cancelled, never retried on a fallback


async def test_a_whole_answer_within_its_deadline_is_untouched() -> None:
    config = Config(model=PRIMARY, fallback_models=(), start_timeout_seconds=5, run_min_tokens_per_second=1)
    text, finish = await (await start_generation(deps_with(ScriptedAI(), config), request())).collect()
    assert text == "Hello, world!" and finish.finish_reason == "stop"


async def test_a_bindings_own_timeout_inside_a_whole_answer_is_a_failing_dependency_not_the_deadline() -> None:
    config = Config(model=PRIMARY, fallback_models=(), start_timeout_seconds=60)
    with pytest.raises(GatewayError) as info:
        await start_generation(deps_with(ScriptedAI(fail=TimeoutError("binding's own")), config), request())
    assert info.value.code != "answer_timeout" and info.value.status in (502, 503)
