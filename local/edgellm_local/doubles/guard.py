"""`ScriptedGuard`: the moderation guard's double, shipped as library code as `ScriptedAI` is.

It plays Llama Guard 3 at the AI binding seam: `run(model, inputs)` takes Workers AI's input for
`@cf/meta/llama-guard-3-8b` (and refuses what that schema refuses, with Workers AI's 5006
message) and answers `{response, usage}` from a script, so the Workers AI adapter is tested over
it through the binding stand-in; `classify(messages)` is the `ContentGuard` port itself, for the
local plumbing. The script: the first rule whose text occurs in the last turn gives the answer
(the raw `response`, text or object, so unparsable answers can be scripted too), else `default`.
Faults: `fail` raises at every call; `gate` holds every call until the test sets it (a guard that
times out is a call the caller stops waiting for: synchronised on events, never sleeps).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Mapping

from edgellm.guardrails.moderation import guard_answer, guard_messages, parse_verdict
from edgellm.ports import BindingError, InvalidModelInput, Verdict

# Workers AI's input schema for the model (@cloudflare/workers-types Ai_Cf_Meta_Llama_Guard_3_8B_Input)
_INPUT_KEYS = frozenset({"messages", "max_tokens", "temperature", "response_format"})


@dataclass
class ScriptedGuard:
    rules: list[tuple[str, Any]] = field(default_factory=list)
    default: Any = "safe"
    fail: BindingError | None = None
    gate: asyncio.Event | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def run(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        _check_input(inputs)
        self.calls.append(dict(inputs))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        last = inputs["messages"][-1]["content"]
        answer = next((answer for text, answer in self.rules if text in last), self.default)
        prompt_tokens = sum(len(m["content"].split()) for m in inputs["messages"])
        return {"response": answer, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2,
                                              "total_tokens": prompt_tokens + 2}}

    async def classify(self, messages: list[Mapping[str, Any]]) -> Verdict:
        result = await self.run("@cf/meta/llama-guard-3-8b", {"messages": guard_messages(messages)})
        return parse_verdict(guard_answer(result))


def _check_input(inputs: Mapping[str, Any]) -> None:
    unknown = set(inputs) - _INPUT_KEYS
    if unknown:
        raise InvalidModelInput(f"5006: Input validation error: unknown properties {sorted(unknown)}")
    messages = inputs.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidModelInput("5006: Input validation error: /messages must be a non-empty array")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or set(message) != {"role", "content"} or not isinstance(message["content"], str):
            raise InvalidModelInput(f"5006: Input validation error: /messages/{index} must be {{role, content: string}}")
        expected = "user" if index % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise InvalidModelInput(f"5006: Input validation error: /messages/{index}/role must alternate user and assistant")
