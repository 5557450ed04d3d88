"""Counting a request's prompt tokens at the edge, as the model will see them.

The model's `tokenizer.json` and `tokenizer_config.json` (which `edgellm publish` writes under
`models/{name}/` in R2) are read once per isolate and parsed by the pure-Python `Tokenizer`;
messages are rendered with the model's chat template first. The Worker cannot run Jinja, so
the template families Llama-family GGUFs ship are recognised by their markers and rendered
by hand: ChatML (`<|im_start|>`, SmolLM2, Qwen), Llama 2 (`[INST]`), Llama 3
(`<|start_header_id|>`); anything else is counted as `role: content` lines (an estimate).
"""

from __future__ import annotations

import json
from typing import Any

from ..generation import GenerationRequest
from ..deps import Deps
from ..tokenizer import Tokenizer, UnsupportedTokenizer


class EdgeTokenizer:
    """A tokenizer and the chat template family it goes with."""

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.template = str(config.get("chat_template") or "")
        self.bos = str(config.get("bos_token") or "")

    def render(self, inputs: dict[str, Any]) -> str:
        if "prompt" in inputs and inputs.get("raw"):
            return str(inputs["prompt"])
        messages = inputs.get("messages") or [{"role": "user", "content": inputs.get("prompt", "")}]
        return render_chat(self.template, messages)

    def count(self, inputs: dict[str, Any]) -> int:
        return self.tokenizer.count(self.render(inputs))


def render_chat(template: str, messages: list[dict[str, str]]) -> str:
    """The prompt text a chat template makes of `messages`, with the generation prompt."""
    if "<|im_start|>" in template:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + "<|im_start|>assistant\n"
    if "<|start_header_id|>" in template:
        text = "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>" for m in messages)
        return text + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    if "[INST]" in template:
        parts, system = [], ""
        for m in messages:
            if m["role"] == "system":
                system = f"<<SYS>>\n{m['content']}\n<</SYS>>\n\n"
            elif m["role"] == "user":
                parts.append(f"[INST] {system}{m['content']} [/INST]")
                system = ""
            else:
                parts.append(f" {m['content']} </s>")
        return "".join(parts)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


async def _read(deps: Deps, key: str) -> dict[str, Any] | None:
    assert deps.r2 is not None
    obj = await deps.r2.get(key)
    if obj is None or obj.body is None:
        return None
    data = b""
    async for chunk in obj.body:
        data += chunk
    return json.loads(data)


async def load_edge_tokenizer(deps: Deps, name: str) -> EdgeTokenizer | None:
    """Once per isolate: the parsed tokenizer (plain data, safe to share), or None when it is
    not published or not supported (then the edge routes without counting, and says so)."""
    memo = deps.state.routing.tokenizers
    if name in memo:
        return memo[name]
    tokenizer: EdgeTokenizer | None = None
    try:
        spec = await _read(deps, f"models/{name}/tokenizer.json")
        config = await _read(deps, f"models/{name}/tokenizer_config.json") or {}
        if spec is not None:
            tokenizer = EdgeTokenizer(Tokenizer.from_json(spec), config)
        else:
            deps.log.warning("no tokenizer published as %s: prompts are not counted", name)
    except UnsupportedTokenizer as exc:
        deps.log.warning("tokenizer %s is not supported by the edge counter (%s): prompts are not counted", name, exc)
    except Exception as exc:  # an R2 failure: try again on the next request, do not remember
        deps.log.warning("could not read tokenizer %s: %s", name, exc)
        return None
    memo[name] = tokenizer
    return tokenizer


async def count_prompt_tokens(deps: Deps, request: GenerationRequest) -> int | None:
    name = deps.config.routing.edge_tokenizer
    if not name or deps.r2 is None:
        return None
    tokenizer = await load_edge_tokenizer(deps, name)
    return None if tokenizer is None else tokenizer.count(request.inputs)
