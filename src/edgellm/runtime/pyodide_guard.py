"""Llama Guard 3 on Workers AI (`@cf/meta/llama-guard-3-8b`) as the core's `ContentGuard`.

The contract (docs/runtime-contracts.md, "Llama Guard 3 on Workers AI"): input
`{messages: [{role: "user"|"assistant", content: string}], temperature?, max_tokens?}`, roles
alternating; output `{response: string | {safe: boolean, categories: string[]}, usage}`. Both
forms of `response` are parsed by `guardrails.moderation.parse_verdict`; anything else is a
`GuardError`, and so is every failure of the binding (it keeps its retryable flag)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pyodide.ffi import JsException  # type: ignore[import-not-found]

from ..guardrails.moderation import guard_answer, guard_messages, parse_verdict
from ..ports import Verdict
from .pyodide_ai import ai_error
from .pyodide_toolbox import js_options

LLAMA_GUARD = "@cf/meta/llama-guard-3-8b"
# a verdict is `unsafe` and a few category codes: a short answer is a whole one
GUARD_MAX_TOKENS = 32


@dataclass
class WorkersAIGuard:
    binding: Any
    model: str = LLAMA_GUARD

    async def classify(self, messages: list[Mapping[str, Any]]) -> Verdict:
        inputs = {"messages": guard_messages(messages), "temperature": 0, "max_tokens": GUARD_MAX_TOKENS}
        try:
            result = await self.binding.run(self.model, js_options(inputs))
        except JsException as exc:
            raise ai_error(exc) from exc
        to_py = getattr(result, "to_py", None)
        answer = guard_answer(to_py() if to_py is not None else result)
        return parse_verdict(answer)

