"""Workers AI's shapes to llama.cpp's and back, as pure functions: an input becomes a llama.cpp
request body; llama.cpp's usage and timings become Workers AI usage."""

from __future__ import annotations

from typing import Any, Mapping

_PARAMS = {
    "max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
    "seed": "seed", "repetition_penalty": "repeat_penalty", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "grammar": "grammar",  # llama.cpp's own GBNF (edgellm.parameters)
}



def to_llama_request(inputs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Workers AI input -> ("chat" | "complete", llama.cpp request body).

    Like Workers AI, a `prompt` goes through the model's chat template unless `raw` is set.
    """
    body = {theirs: inputs[ours] for ours, theirs in _PARAMS.items() if inputs.get(ours) is not None}
    if "messages" in inputs:
        return "chat", {"messages": list(inputs["messages"]), **body}
    if inputs.get("raw"):
        return "complete", {"prompt": inputs["prompt"], **body}
    return "chat", {"messages": [{"role": "user", "content": inputs["prompt"]}], **body}


def llama_usage(result: dict[str, Any]) -> dict[str, Any]:
    """Workers AI usage, plus the prompt tokens llama.cpp reused from the slot's cache
    (`timings.cache_n`: what it actually skipped computing)."""
    usage = result.get("usage") or {}
    out: dict[str, Any] = {k: usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    timings = result.get("timings") or {}
    cached = timings.get("cache_n", (usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": int(cached)}
    return out


def prompt_usage(timings: dict[str, Any] | None) -> dict[str, Any] | None:
    """The prompt's tokens from a chunk's timings (computed + reused), as a usage event so far."""
    if not timings or "prompt_n" not in timings:
        return None
    prompt = int(timings.get("prompt_n") or 0) + int(timings.get("cache_n") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt} if prompt > 0 else None
