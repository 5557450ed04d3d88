"""An OpenAI-compatible origin (llama.cpp's server, vLLM, a second EdgeLLM, any `/v1` URL).

The client speaks OpenAI over the `HTTPFetch` port and turns the origin's SSE stream into the
gateway's own events, so an origin answer renders exactly like an edge one. It always
streams (a JSON answer is collected from the events): one code path, and a stalled origin is
noticed between tokens rather than after the whole answer. An origin that answers the stream
with `application/json` (a server that does not stream, a proxy that buffered the answer) gave
a whole answer: it is read as one and becomes the same events, so the client still gets what
it asked for, a stream of chunks ending in `[DONE]` (all an OpenAI client that asked to stream
can parse) or a JSON answer.

Continuing a cut edge answer: a chat request is resent with the partial answer as a final
assistant message (assistant prefill: llama.cpp continues a trailing assistant message; vLLM
is told so by `continue_final_message`); a raw prompt is resent as prompt + partial answer to
`/v1/completions`, which is a plain continuation on every server.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..errors import ErrorKind, GatewayError, is_context_refusal, window_figures
from ..generation import Event, Finish, GenerationRequest, Token, Usage
from ..http import json_bytes
from ..ids import RandomIds
from ..ports import FetchError, HTTPFetch
from ..sse import DONE, SSEDecoder, SSEFrameTooLarge
from ..stream import close_source, owns
from ..structured import tool_call_deltas
from ..telemetry.tracing import outgoing
from .affinity import slot_for
from .config import OriginConfig

DECODED_ENCODINGS = ("identity", "gzip", "x-gzip", "deflate")  # what `fetch` decodes on both runtimes
MAX_WHOLE_ANSWER_BYTES = 8 * 1024 * 1024  # a whole JSON answer in place of a stream, read into memory
MAX_USAGE_TOKENS = 10**9  # a usage figure above this (or negative, or not an integer) is not a count
_SAMPLING = ("temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty")
_AS_GIVEN = ("repetition_penalty", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs")
# Every input an origin request carries (`origin_body`); a request with any other input is never
# sent to an origin, since the origin would answer it without that input (a failover once dropped
# `tools` and answered prose to `tool_choice: "required"`).
CARRIED = frozenset(("messages", "prompt", "raw", "max_tokens", "response_format", *_SAMPLING, *_AS_GIVEN))


def uncarried(request: GenerationRequest) -> list[str]:
    """The inputs of this request an origin request cannot carry (empty: any origin may take it).
    `raw` with messages has no OpenAI spelling (a raw prompt goes to /completions)."""
    names = sorted(name for name in request.inputs if name not in CARRIED)
    if request.inputs.get("raw") and "prompt" not in request.inputs:
        names.append("raw")
    return names


def _openai_response_format(value: dict[str, Any]) -> dict[str, Any]:
    """Workers AI's `response_format` (the schema itself under `json_schema`) -> OpenAI's."""
    if value.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": value.get("json_schema") or {}}}
    return dict(value)


def origin_body(origin: OriginConfig, request: GenerationRequest, *, prefill: str = "", max_tokens: int | None = None) -> tuple[str, dict[str, Any]]:
    """(path, OpenAI request body) for this generation on this origin."""
    inputs = request.inputs
    body: dict[str, Any] = {"model": origin.model_for(request.model), "stream": True, "stream_options": {"include_usage": True},
                            "max_tokens": max_tokens if max_tokens is not None else request.max_tokens}
    body.update({name: inputs[name] for name in (*_SAMPLING, *_AS_GIVEN) if inputs.get(name) is not None})
    if inputs.get("response_format") is not None:
        body["response_format"] = _openai_response_format(inputs["response_format"])
    if request.stop:
        body["stop"] = list(request.stop)
    slot = slot_for(request.session, origin) if request.session else None
    if slot is not None:  # a llama.cpp origin: the session's own slot, its prompt kept cached there
        body.update(id_slot=slot, cache_prompt=True)
    if "prompt" in inputs and inputs.get("raw"):
        body["prompt"] = inputs["prompt"] + prefill
        return "/completions", body
    messages = list(inputs["messages"]) if "messages" in inputs else [{"role": "user", "content": inputs["prompt"]}]
    if prefill:
        messages.append({"role": "assistant", "content": prefill})
        body.update(continue_final_message=True, add_generation_prompt=False)
    body["messages"] = messages
    return "/chat/completions", body


def _status_error(origin: OriginConfig, status: int, data: bytes, max_tokens: int) -> GatewayError:
    """A refusing origin's answer, in the edge's words: the origin's own text (which may hold its
    server's internals) is the error's `detail`, logged, never the client's message."""
    detail = _detail(data)
    said = f"the origin {origin.name} answered {status}: {detail}"
    if status in (400, 422) and (is_context_refusal(detail) or _error_type(data) == "exceed_context_size_error"):
        # OpenAI's code (clients trim or fall back on it) and the numbers the edge knows: the
        # origin's configured window, this request's max_tokens, and the refusal's own figures
        figures = _counted(data) or window_figures(detail)
        return GatewayError(ErrorKind.INVALID_REQUEST, f"The origin {origin.name} cannot hold this prompt with max_tokens {max_tokens} "
                            f"(its window is {origin.context_window} tokens{'; ' + figures if figures else ''}). "
                            "Shorten the messages or lower max_tokens.", param="messages", code="context_length_exceeded", detail=said)
    if status in (400, 422):
        return GatewayError(ErrorKind.INVALID_REQUEST, f"The origin {origin.name} rejected the request ({status}; the details are in "
                            "the edge log).", code="origin_rejected", detail=said)
    if status in (429, 503):
        return GatewayError(ErrorKind.UNAVAILABLE, f"The origin {origin.name} is over capacity ({status}); retry shortly.",
                            code="origin_unavailable", detail=said)
    return GatewayError(ErrorKind.UPSTREAM, f"The origin {origin.name} failed ({status}); retry shortly.", code="origin_error", detail=said)


def _error_object(data: bytes) -> dict[str, Any]:
    try:
        error = json.loads(data).get("error")
    except Exception:
        return {}
    return error if isinstance(error, dict) else {}


def _error_type(data: bytes) -> Any:
    return _error_object(data).get("type")


def _counted(data: bytes) -> str:
    """llama.cpp's context refusal counts for itself (`n_prompt_tokens`, `n_ctx`): figures, never words."""
    error = _error_object(data)
    prompt, window = error.get("n_prompt_tokens"), error.get("n_ctx")
    if all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_USAGE_TOKENS for n in (prompt, window)):
        return f"the origin counted {prompt} prompt tokens, its context holds {window}"
    return ""


def _detail(data: bytes) -> str:
    try:
        error = json.loads(data).get("error")
        return str(error.get("message") if isinstance(error, dict) else error)[:500]
    except Exception:
        return data[:200].decode(errors="replace")


@dataclass(frozen=True)
class OriginClient:
    origin: OriginConfig
    fetch: HTTPFetch
    tracer: Any = None  # the edge's tracer (`Deps.tracer`): whether the current span is worth sending on
    ids: RandomIds = field(default_factory=RandomIds)  # the span id an origin call gets when no span records it

    @property
    def timeout(self) -> float:
        return self.origin.timeout_ms / 1000

    async def start(self, request: GenerationRequest, *, prefill: str = "", max_tokens: int | None = None) -> AsyncIterator[Event]:
        """Send the request; once the origin answered 200, return its events (Token..., Finish).
        Raises `GatewayError` if the origin cannot be reached or refuses."""
        path, body = origin_body(self.origin, request, prefill=prefill, max_tokens=max_tokens)
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if self.origin.token:
            headers["authorization"] = f"Bearer {self.origin.token}"
        if request.session:  # Workers AI's spelling; an EdgeLLM origin keeps the session's slot warm with it
            headers["x-session-affinity"] = request.session
        headers["traceparent"] = outgoing(self.tracer, self.ids)  # the request's trace goes on to the origin
        deadline = asyncio.get_running_loop().time() + self.origin.total_ms / 1000
        try:
            response = await self.fetch.post(self.origin.base_url + path, json_bytes(body), headers, self.timeout)
        except FetchError as exc:
            raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} is unreachable; retry shortly.", code="origin_unreachable", detail=f"origin {self.origin.name}: {exc}") from exc
        if response.status != 200:
            try:
                data = b""
                async for chunk in response.body:
                    data += chunk
                    if len(data) > 4096:
                        break
            except Exception:
                data = b""
            finally:
                await close_source(response.body)
            raise _status_error(self.origin, response.status, data, body["max_tokens"])
        encoding = {k.lower(): v for k, v in response.headers.items()}.get("content-encoding", "identity").strip().lower()
        if encoding not in DECODED_ENCODINGS:
            await close_source(response.body)
            raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} sent its answer as {encoding[:40]!r}, an encoding "
                               f"the edge does not decode ({', '.join(DECODED_ENCODINGS)}).", code="origin_bad_encoding")
        content_type = {k.lower(): v for k, v in response.headers.items()}.get("content-type", "")
        if content_type.split(";")[0].strip().lower() == "application/json":
            return self._whole(response.body, chat=path == "/chat/completions", max_tokens=body["max_tokens"], deadline=deadline)
        return self._events(response.body, chat=path == "/chat/completions", max_tokens=body["max_tokens"], deadline=deadline)

    @owns("chunks")
    async def _whole(self, chunks: AsyncIterator[bytes], *, chat: bool, max_tokens: int, deadline: float) -> AsyncIterator[Event]:
        """A whole JSON answer (`chat.completion` or `text_completion`) as the events its stream
        would have given: its text as one token, its tool calls, then its finish and usage. Read
        within the same budgets as a stream (`timeout` between chunks, `total_ms` in all) and up
        to MAX_WHOLE_ANSWER_BYTES; an error object or any other shape is the origin failing."""
        loop = asyncio.get_running_loop()
        data = bytearray()
        while True:
            try:
                async with asyncio.timeout_at(min(loop.time() + self.timeout, deadline)):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} did not finish within {self.origin.total_ms} ms.",
                                   code="origin_timeout") from None
            except FetchError as exc:
                raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} broke off mid-answer.", code="origin_error",
                                   detail=f"origin {self.origin.name}: {exc}") from exc
            data += chunk
            if len(data) > MAX_WHOLE_ANSWER_BYTES:
                raise self._garbage(f"a JSON answer of more than {MAX_WHOLE_ANSWER_BYTES} bytes")
        try:
            text = bytes(data).decode()
        except UnicodeDecodeError:
            raise self._garbage("bytes that are not UTF-8") from None
        answer = self._event(text)
        choices = answer.get("choices")
        if not choices:
            raise self._garbage("a JSON answer without 'choices'")
        choice = choices[0]
        message = choice.get("message") if chat else {"content": choice.get("text")}
        if not isinstance(message, dict) or not isinstance(message.get("content"), (str, type(None))):
            raise self._garbage("a JSON answer whose message is not an object with text")
        usage = self._usage(answer["usage"]) if answer.get("usage") else None
        lp = choice.get("logprobs")
        logprobs = lp.get("content") if chat and isinstance(lp, dict) and isinstance(lp.get("content"), list) else None
        content = message.get("content") or ""
        if content or logprobs:
            yield Token(content, tuple(logprobs) if logprobs else None)
        calls = tool_call_deltas(message.get("tool_calls")) if chat else []
        for call in calls:
            yield call
        usage = usage or Usage(0, 1 if content else 0)
        yield Finish(_reason(choice.get("finish_reason"), usage, max_tokens, bool(calls)), usage)

    def _garbage(self, what: str) -> GatewayError:
        return GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} sent an answer that is not an OpenAI stream: {what}.",
                            code="origin_garbage")

    @owns("chunks")
    async def _events(self, chunks: AsyncIterator[bytes], *, chat: bool, max_tokens: int, deadline: float) -> AsyncIterator[Event]:
        """The origin's SSE as events, within the budgets: `timeout` between tokens (bytes that
        carry none, keep-alive pings included, are not progress), `total_ms` for the whole
        answer, and at most `max_tokens` tokens however many the origin sends (then the answer
        is cut there, `length`). Bytes that are not an OpenAI stream are `origin_garbage`."""
        decoder = SSEDecoder()
        usage: Usage | None = None
        reason, count, called = None, 0, False
        loop = asyncio.get_running_loop()
        idle_until = loop.time() + self.timeout
        try:
            while True:
                try:
                    async with asyncio.timeout_at(min(idle_until, deadline)):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    if loop.time() >= deadline:
                        raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} did not finish within "
                                           f"{self.origin.total_ms} ms.", code="origin_timeout") from None
                    raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} stalled mid-answer.", code="origin_stalled") from None
                except FetchError as exc:
                    raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} broke off mid-answer.", code="origin_error", detail=f"origin {self.origin.name}: {exc}") from exc
                try:
                    payloads = list(decoder.feed(chunk))
                except SSEFrameTooLarge as exc:
                    raise self._garbage(str(exc)) from None
                except UnicodeDecodeError:
                    raise self._garbage("bytes that are not UTF-8") from None
                for data in payloads:
                    if data == DONE:
                        usage = usage or Usage(0, count)
                        yield Finish(_reason(reason, usage, max_tokens, called), usage)
                        return
                    event = self._event(data)
                    if event.get("usage"):
                        usage = self._usage(event["usage"])
                    for choice in event.get("choices") or []:
                        delta = choice.get("delta") or {}
                        text = delta.get("content") if chat else choice.get("text")
                        reason = choice.get("finish_reason") or reason
                        lp = choice.get("logprobs")
                        logprobs = lp.get("content") if chat and isinstance(lp, dict) else None
                        if text or logprobs:
                            if count >= max_tokens:  # a token past max_tokens: an origin that ignores it is cut at the request's own
                                yield Finish("length", Usage(usage.prompt_tokens if usage else 0, count))
                                return
                            count += 1
                            idle_until = loop.time() + self.timeout
                            yield Token(text or "", tuple(logprobs) if isinstance(logprobs, list) else None)
                        for call in tool_call_deltas(delta.get("tool_calls")) if chat else ():
                            called = True
                            idle_until = loop.time() + self.timeout
                            yield call
            raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} stream ended before [DONE].", code="origin_error")
        finally:
            await close_source(chunks)

    def _event(self, data: str) -> dict[str, Any]:
        """One event's JSON, checked for the shape read from it; an error event is the origin's failure."""
        try:
            event = json.loads(data)
        except ValueError:
            raise self._garbage("an event that is not JSON") from None
        if not isinstance(event, dict):
            raise self._garbage("an event that is not a JSON object")
        if event.get("error"):
            raise GatewayError(ErrorKind.UPSTREAM, f"The origin {self.origin.name} failed mid-answer.", code="origin_error", detail=f"origin {self.origin.name} sent an error event: {_detail(data.encode())}")
        choices = event.get("choices")
        if choices is not None and not (isinstance(choices, list) and all(isinstance(c, dict) for c in choices)):
            raise self._garbage("'choices' that is not a list of objects")
        for choice in choices or []:
            delta, text = choice.get("delta"), choice.get("text")
            if (delta is not None and not (isinstance(delta, dict) and isinstance(delta.get("content"), (str, type(None)))))\
                    or not isinstance(text, (str, type(None))) or not isinstance(choice.get("finish_reason"), (str, type(None))):
                raise self._garbage("a choice whose text is not a string")
        return event

    def _usage(self, data: Any) -> Usage:
        """The origin's usage, only if every figure is a count: an integer from 0 to MAX_USAGE_TOKENS."""
        if not isinstance(data, dict):
            raise self._garbage("'usage' that is not an object")
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = data.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_USAGE_TOKENS):
                raise self._garbage(f"usage.{name} is not a token count")
        cached = (data.get("prompt_tokens_details") or {}).get("cached_tokens") if isinstance(data.get("prompt_tokens_details"), dict) else None
        if cached is not None and (not isinstance(cached, int) or isinstance(cached, bool) or not 0 <= cached <= MAX_USAGE_TOKENS):
            raise self._garbage("usage.prompt_tokens_details.cached_tokens is not a token count")
        return Usage.from_json(data)


def _reason(reason: str | None, usage: Usage, max_tokens: int, called: bool) -> str:
    if reason not in ("stop", "length"):
        reason = "length" if usage.completion_tokens >= max_tokens else "stop"
    return "tool_calls" if called and reason != "length" else reason
