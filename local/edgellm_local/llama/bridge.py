"""llama.cpp's callback thread bridged to async events: one generation, run in a thread, read
as an async iterator; closing it stops the generation at its next token."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator

from edgellm_local.llama.errors import RunnerStopping, llama_exception, public, raise_llama_error
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.wire import llama_usage, prompt_usage


async def stream_events(runner: LlamaCppRunner, kind: str, body: dict[str, Any], tenant: str | None = None,
                         placed: bool = False) -> AsyncIterator[dict[str, Any]]:
    """Bridge llama.cpp's callback thread to async events; closing this stops the generation.
    `placed`: this generation holds one of the runner's start places (no slot pool), given back
    when llama.cpp is done with it (its thread returns), not when the consumer is."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    cancelled = threading.Event()
    try:
        forget = runner.track(cancelled)  # a runner that stops stops this generation too
    except BaseException:
        runner.release(tenant)
        if placed:
            runner.starts.release()
        raise
    DONE = object()

    def on_chunk(chunk: Any) -> bool:
        loop.call_soon_threadsafe(queue.put_nowait, chunk)
        return cancelled.is_set()  # True tells llama.cpp to stop generating

    def work() -> None:
        try:
            result = runner.chat(body, on_chunk) if kind == "chat" else runner.complete(body, on_chunk)
            loop.call_soon_threadsafe(queue.put_nowait, result if isinstance(result, dict) and "error" in result else DONE)
        except BaseException as exc:  # surfaced to the consumer, not lost in the thread
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            if placed:
                runner.starts.release()

    try:
        task = loop.run_in_executor(None, work)
    except BaseException:
        forget()
        runner.release(tenant)
        if placed:
            runner.starts.release()
        raise
    # llama.cpp streams `timings` (with `cache_n`, the prompt tokens it reused) and `usage` on
    # chunks of their own: the usage event goes out at the end, with both.
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    told_prompt = False
    finish: str | None = None  # llama.cpp's finish_reason ("length" also when the slot's context filled up)
    try:
        while True:
            item = await queue.get()
            if cancelled.is_set():  # only the runner sets it while this reads: it is stopping
                raise public(RunnerStopping("3040: the local model server stopped mid-generation; try again later."))
            if item is DONE:
                end: dict[str, Any] = {"usage": llama_usage({"usage": usage, "timings": timings or {}})} if usage is not None else {}
                if finish == "length":  # max_tokens or the slot's context: only llama.cpp knows which stopped it
                    end["finish_reason"] = finish
                if end:
                    yield {"response": "", **end}
                return
            if isinstance(item, BaseException):
                raise llama_exception(item) from item
            raise_llama_error(item)
            timings = item.get("timings") or timings
            usage = item.get("usage") or usage
            for choice in item.get("choices") or []:
                finish = choice.get("finish_reason") or finish
                text = (choice.get("delta") or {}).get("content") if kind == "chat" else choice.get("text")
                if choice.get("logprobs"):  # asked for: llama.cpp's entries ride along (trimmed by structured_events)
                    yield {"response": text or "", "logprobs": choice["logprobs"]}
                elif text:
                    early = prompt_usage(timings) if usage is None and not told_prompt else None
                    told_prompt = told_prompt or early is not None
                    yield {"response": text, **({"usage": early} if early else {})}
    finally:
        cancelled.set()
        try:
            if not task.done():
                await asyncio.shield(task)  # the thread stops at its next token
        finally:
            forget()
            runner.release(tenant)
