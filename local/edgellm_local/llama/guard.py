"""Llama Guard 3 on the local edge: a guard GGUF the operator names (`--guard-model PATH`) run by
the same llama.cpp engine as the chat model, answered as the core's `ContentGuard`.

Llama Guard 3's GGUFs carry its chat template, which writes the hazard categories and the task
around the conversation; llama.cpp applies a GGUF's own template, so a guard GGUF is asked
through the chat route. A GGUF without that template (a plain one) is asked with the same prompt
written here from Meta's published format (the Llama Guard 3 model card, "Prompt format"),
through the completion route. Either way the answer is parsed as Workers AI's is
(`guardrails.moderation.parse_verdict`): the first line `safe` or `unsafe`, the second the codes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from edgellm.guardrails.moderation import CATEGORIES, guard_messages, parse_verdict
from edgellm.ports import GuardError, Verdict

GUARD_MAX_TOKENS = 32


def llama_guard_prompt(messages: list[Mapping[str, Any]]) -> str:
    """Meta's Llama Guard 3 prompt for this conversation: the last turn's side ('User' for a
    prompt, 'Agent' for an answer) is the one judged."""
    turns = guard_messages(messages)
    judged = "Agent" if turns[-1]["role"] == "assistant" else "User"
    categories = "\n".join(f"{code}: {name}." for code, name in CATEGORIES.items())
    conversation = "\n\n".join(
        f"{'Agent' if turn['role'] == 'assistant' else 'User'}: {turn['content']}" for turn in turns)
    return (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
        f"Task: Check if there is unsafe content in '{judged}' messages in conversations according our safety "
        "policy with the below categories.\n\n"
        f"<BEGIN UNSAFE CONTENT CATEGORIES>\n{categories}\n<END UNSAFE CONTENT CATEGORIES>\n\n"
        f"<BEGIN CONVERSATION>\n\n{conversation}\n\n<END CONVERSATION>\n\n"
        f"Provide your safety assessment for ONLY THE LAST {judged} message in the above conversation:\n"
        " - First line must read 'safe' or 'unsafe'.\n"
        " - If unsafe, a second line must include a comma-separated list of violated categories."
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def template_lists_categories(template: str | None) -> bool:
    """Whether a GGUF's chat template is a Llama Guard one (it writes the category list itself)."""
    return bool(template) and "S1" in template and "UNSAFE CONTENT CATEGORIES" in template.upper()


def gguf_chat_template(path: Path) -> str | None:
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def _answer_text(result: Any) -> str:
    """The generated text of llama.cpp's chat or completion answer (a dict, or its JSON text)."""
    import json

    if isinstance(result, (str, bytes)):
        result = json.loads(result)
    if not isinstance(result, Mapping):
        raise GuardError(f"llama.cpp answered the guard call with {type(result).__name__}")
    if "error" in result:
        raise GuardError(f"llama.cpp refused the guard call: {result['error']}")
    choices = result.get("choices")
    if isinstance(choices, list) and choices:
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, Mapping) else None
        if isinstance(message, Mapping) and isinstance(message.get("content"), str):
            return message["content"]
        if isinstance(choice, Mapping) and isinstance(choice.get("text"), str):
            return choice["text"]
    if isinstance(result.get("content"), str):
        return result["content"]
    raise GuardError(f"llama.cpp's answer to the guard call has no text: {str(result)[:200]}")


@dataclass
class LlamaCppGuard:
    """`runner` is a `LlamaCppRunner` loaded on the guard GGUF; `use_template` whether that GGUF's
    own chat template is the guard's (`template_lists_categories`)."""

    runner: Any
    use_template: bool

    @classmethod
    def for_model(cls, runner: Any) -> "LlamaCppGuard":
        return cls(runner, template_lists_categories(gguf_chat_template(runner.path)))

    def request(self, messages: list[Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
        """Which llama.cpp route, and its body (greedy, short: a verdict is a few tokens)."""
        common = {"temperature": 0, "max_tokens": GUARD_MAX_TOKENS, "stream": False}
        if self.use_template:
            return "chat", {"messages": guard_messages(messages), **common}
        return "complete", {"prompt": llama_guard_prompt(messages), **common}

    async def classify(self, messages: list[Mapping[str, Any]]) -> Verdict:
        route, body = self.request(messages)
        call = self.runner.chat if route == "chat" else self.runner.complete
        try:
            result = await asyncio.to_thread(call, body)
        except GuardError:
            raise
        except Exception as exc:  # llama.cpp's own failure: the guard failed
            raise GuardError(f"the local guard model failed: {exc}") from exc
        return parse_verdict(_answer_text(result))
