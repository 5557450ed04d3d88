"""Workers AI (`env.AI`) as the core's `AIBinding`: inputs go as JS objects, a stream is read
from the binding's JS ReadableStream as SSE, and its errors (`JsException` with Workers AI's
numbered message) become the core's binding errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from pyodide.ffi import JsException  # type: ignore[import-not-found]

from ..capabilities import workers_ai_description
from ..ports import BindingError, CapacityExceeded, InvalidModelInput, ModelNotFound, StreamCutError
from ..sse import IncompleteStream, decode_events
from ..stream import owns
from ..structured import for_workers_ai_binding
from .pyodide_toolbox import js_message, js_options, read_stream

_AI_CODE = re.compile(r"\b(\d{4})\b")


def ai_error(exc: BaseException) -> BindingError:
    message = js_message(exc)
    match = _AI_CODE.search(message)
    code = match.group(1) if match else ""
    if code == "5007" or "No such model" in message or "deprecated" in message.lower():
        return ModelNotFound(message)
    if code in ("5006", "5005", "5021") or "Input validation" in message:
        return InvalidModelInput(message)
    if code in ("3036", "3040") or "Capacity" in message:
        return CapacityExceeded(message)
    return BindingError(message)


def ai_run_options(session: str | None) -> tuple[Any, ...]:
    """`env.AI.run`'s third argument: a session goes as the `x-session-affinity` header, which
    routes the conversation's turns to the replica holding its prefix cache."""
    if not session:
        return ()
    return (js_options({"extraHeaders": {"x-session-affinity": session}}),)


@dataclass
class WorkersAI:
    binding: Any

    def describe(self, model: str, *, live: bool = True) -> Mapping[str, Any] | None:
        """From the catalog the Worker ships: the binding itself describes nothing (workerd)."""
        return workers_ai_description(model)

    async def run(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> dict[str, Any]:
        """The whole answer as an object. Never with `stream` in the inputs: the binding answers a
        ReadableStream for any truthy `stream`, whatever else they hold (workerd, JSON mode and
        tools included), and a caller may hand on inputs that were meant for a stream."""
        inputs = for_workers_ai_binding({name: value for name, value in inputs.items() if name != "stream"})
        try:
            result = await self.binding.run(model, js_options(inputs), *ai_run_options(session))
        except JsException as exc:
            raise ai_error(exc) from exc
        return result.to_py()

    async def stream(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> AsyncIterator[dict[str, Any]]:
        if inputs.get("response_format") is not None:
            # Workers AI's JSON mode does not stream (Cloudflare's JSON mode docs): run it whole
            # and hand the answer on as a one-event stream
            return _one_event(await self.run(model, inputs, session=session))
        inputs = for_workers_ai_binding(inputs)
        try:
            stream = await self.binding.run(model, js_options({**inputs, "stream": True}), *ai_run_options(session))
        except JsException as exc:
            raise ai_error(exc) from exc
        return _ai_events(decode_events(read_stream(stream)))


    # --- embeddings (the bge models): `env.AI.run(model, {"text": [...]})` -> {shape, data} ---

    async def embed(self, model: str, texts: list[str]) -> dict[str, Any]:
        """Workers AI's bge output is `{"shape": [n, d], "data": [[...]], "pooling"?}` (Cloudflare's
        bge-small-en-v1.5 model page); it carries no token count, so the core estimates usage."""
        try:
            result = await self.binding.run(model, js_options({"text": list(texts)}))
        except JsException as exc:
            raise ai_error(exc) from exc
        return result.to_py()


@owns("events")
async def _ai_events(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    try:
        async for event in events:
            yield event
    except IncompleteStream as exc:
        raise StreamCutError(f"the AI stream was cut: {exc}") from exc


async def _one_event(result: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield result
