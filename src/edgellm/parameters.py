"""One rule for request fields the OpenAI-shaped routes do not know, on chat completions and
responses alike: a field is honoured, accepted because it asks for nothing (`user`,
`metadata`, ...), or refused by name with a 400. Never silently dropped: a client that sends
`verbose` or `min_p` to a llama.cpp server expects them to do something.

llama.cpp's own extension `grammar` (a GBNF grammar the answer must match) is honoured where the
serving model can (the `grammar` capability: the local edge's llama.cpp). So is the pair
`continue_final_message: true` / `add_generation_prompt: false` when the last message is the
assistant's: that is how an edge asks an origin to continue a partial answer (`routing/origin.py`
sends it, and an origin may be another EdgeLLM), and a final assistant message is continued here
anyway. Other extensions are refused by name, saying so.
"""

from __future__ import annotations

from typing import Any

from .errors import invalid

MAX_GRAMMAR_CHARS = 64 * 1024

# llama.cpp server fields a client of a llama.cpp server may send; only `grammar` is honoured
LLAMA_CPP_EXTENSIONS = frozenset({
    "verbose", "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs",
    "min_p", "typical_p", "n_predict", "n_keep", "n_discard", "n_probs", "cache_prompt", "id_slot", "ignore_eos",
    "mirostat", "mirostat_tau", "mirostat_eta", "samplers", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "dynatemp_range",
    "dynatemp_exponent", "penalty_last_n", "repeat_penalty", "repeat_last_n", "json_schema", "t_max_predict_ms",
    "return_tokens", "post_sampling_probs", "timings_per_token", "parse_tool_calls", "reasoning_format",
    "lora_adapters", "image_data", "slot_id", "tfs_z", "top_n_sigma", "grammar_lazy", "grammar_triggers",
    "preserved_tokens", "response_fields", "return_progress",
})


def refuse_unknown(name: str) -> None:
    """A field no rule of the route accepts: refused by name."""
    if name in LLAMA_CPP_EXTENSIONS:
        raise invalid(f"'{name}' is a llama.cpp extension this gateway does not honour (of llama.cpp's own fields only "
                      f"'grammar' is, where the model can).", name, "unsupported_parameter")
    raise invalid(f"Unknown parameter: '{name}'.", name, "unknown_parameter")


def parse_grammar(body: dict[str, Any], *, structured: bool) -> dict[str, Any]:
    """`grammar` (llama.cpp's GBNF) as an input entry; it cannot be combined with another
    constraint on the answer (a `response_format` or `tools` is itself a grammar)."""
    grammar = body.get("grammar")
    if grammar is None:
        return {}
    if not isinstance(grammar, str) or not grammar.strip():
        raise invalid("'grammar' must be a non-empty GBNF grammar string.", "grammar", "invalid_type")
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise invalid(f"'grammar' may hold at most {MAX_GRAMMAR_CHARS} characters.", "grammar")
    if structured:
        raise invalid("'grammar' cannot be combined with 'response_format' or 'tools' (each constrains the answer).",
                      "grammar", "unsupported_parameter")
    return {"grammar": grammar}


# chat completions: every field honoured (or refused by a rule of its own, e.g. `n` > 1)
CHAT_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "stream", "stream_options", "response_format",
    "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs", "raw", "lora", "n", "prompt_cache_key",
    "grammar",
})
# OpenAI fields that ask for nothing a backend here would have to do: accepted as they are
CHAT_NEUTRAL = frozenset({"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_retention"})
CHAT_REFUSED = {
    "reasoning_effort": "reasoning options are not supported by these models",
    "verbosity": "only 'verbosity': 'medium' is supported",
}


# the prefill pair and the value each must have to ask for what a final assistant message gets here
PREFILL_FIELDS = {"continue_final_message": True, "add_generation_prompt": False}


def _check_prefill(body: dict[str, Any], name: str, value: Any) -> None:
    """`continue_final_message` / `add_generation_prompt` are honoured only as the continuation
    of a final assistant message (what the edge does with one); any other use is refused by name."""
    if not isinstance(value, bool):
        raise invalid(f"'{name}' must be a boolean.", name, "invalid_type")
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else {}
    if value != PREFILL_FIELDS[name] or last.get("role") != "assistant":
        raise invalid(f"'{name}': {value} is not supported; only continuing a final assistant message "
                      "('continue_final_message': true, 'add_generation_prompt': false) is.", name, "unsupported_parameter")


def check_chat_fields(body: dict[str, Any], refused_elsewhere: tuple[str, ...]) -> None:
    for name, value in body.items():
        if value is None or name in CHAT_FIELDS or name in CHAT_NEUTRAL or name in refused_elsewhere:
            continue
        if name in PREFILL_FIELDS:
            _check_prefill(body, name, value)
            continue
        if name == "verbosity" and value == "medium":
            continue
        if name in CHAT_REFUSED:
            raise invalid(f"'{name}': {CHAT_REFUSED[name]}.", name, "unsupported_parameter")
        refuse_unknown(name)
