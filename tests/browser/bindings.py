"""AI bindings for the chat page tests: the real llama.cpp binding, wrapped at the binding seam.

The tiny test model writes a whole answer in a few milliseconds, faster than a browser can show
that it renders progressively; `PacedAI` spaces its stream events out, the way a real model's
tokens arrive (a rate the page must show, not a gate: the library double,
`edgellm_local.doubles.scripted.ScriptedAI`, fails a stream part-way with `fail_after`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from edgellm.ports import AIBinding


@dataclass
class PacedAI:
    inner: AIBinding
    delay: float = 0.05
    events_sent: int = 0
    closed_early: bool = False

    async def run(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        return await self.inner.run(model, inputs, **options)

    def describe(self, model: str) -> dict[str, Any] | None:
        return self.inner.describe(model)

    async def stream(self, model: str, inputs: Mapping[str, Any], **options: Any) -> AsyncIterator[dict[str, Any]]:
        return self._paced(await self.inner.stream(model, inputs, **options))

    async def _paced(self, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        finished = False
        try:
            async for event in events:
                await asyncio.sleep(self.delay)
                self.events_sent += 1
                yield event
            finished = True
        finally:
            self.closed_early = not finished
            await events.aclose()  # type: ignore[attr-defined]
