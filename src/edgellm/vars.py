"""Every `[vars]` name the Worker reads, what each accepts, and the checks that refuse a mistake
before anything serves.

A misspelt name is no error to the Worker (it reads the names it knows and never sees the
others), so `EDGE_STAL_MS = "500"` would leave the default in force without a word. The names
live here once: `edgellm dev --var` and `edgellm deploy-check` refuse an unknown one, suggesting
the nearest known name, and the configuration reference in docs/operations.md is held to this
table by a test.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class VarSpec:
    """One `[vars]` value: the kind of TOML value wrangler.toml may give it and, in words, what it accepts."""

    kind: str  # "text", "whole", "number", "flag", "list", "json_object", "json_list"
    accepts: str


VARS: dict[str, VarSpec] = {
    "MODEL": VarSpec("text", "a Workers AI model id, e.g. @cf/meta/llama-2-7b-chat-int8"),
    "FALLBACK_MODELS": VarSpec("list", "model ids, comma-separated or a JSON list (empty: no fallback)"),
    "EMBEDDING_MODELS": VarSpec("list", "embedding model ids served at /v1/embeddings, comma-separated or a JSON list"),
    "SEMANTIC_MAX_ERROR": VarSpec("number", "the largest share of semantic hits allowed to be wrong: above 0 and below 1, or `off`"),
    "SEMANTIC_CHECK_RATE": VarSpec("number", "share of served semantic hits checked after the response, from 0 to 1"),
    "SEMANTIC_CHECKS_PER_MINUTE": VarSpec("whole", "those checks' generations per isolate and minute, a whole number of at least 1"),
    "SEMANTIC_VERIFIER": VarSpec("text", "a cross-encoder model id asked before a semantic hit, e.g. @cf/baai/bge-reranker-base"),
    "SEMANTIC_VERIFIER_THRESHOLD": VarSpec("number", "the verifier's score a candidate must reach, a number"),
    "MODEL_ALIASES": VarSpec("json_object", 'a JSON object of alias -> model id ("" = MODEL), e.g. {"gpt-4o-mini": ""}'),
    "MODEL_CAPABILITIES": VarSpec("json_object", 'a JSON object of model id -> capabilities, e.g. {"@cf/...": ["json_mode"]}'),
    "MODEL_PRICES": VarSpec("json_object", "a JSON object of model id -> [USD per million input, output tokens]"),
    "CONTEXT_WINDOW": VarSpec("whole", "the edge model's context in tokens, a whole number of at least 1"),
    "CACHE_NAMESPACE": VarSpec("text", "a name for the answer cache's namespace"),
    "CACHE_DEFAULT_TTL": VarSpec("whole", "seconds, a whole number of at least 1"),
    "CACHE_CLASSES": VarSpec("json_object", 'a JSON object of class -> TTL seconds, e.g. {"news": 300}'),
    "TENANT": VarSpec("text", "the tenant name of keyless (open-mode) callers"),
    "CONVERSATION_TTL": VarSpec("whole", "seconds a stored response lives, a whole number of at least 1"),
    "CONVERSATION_MAX_BYTES": VarSpec("whole", "bytes a conversation may hold, a whole number of at least 1"),
    "MAX_WAITING_GENERATIONS": VarSpec("whole", "generations in progress per isolate, a whole number of at least 1"),
    "MAX_MESSAGES": VarSpec("whole", "messages per request, a whole number of at least 1"),
    "START_TIMEOUT_SECONDS": VarSpec("number", "seconds, a number above 0"),
    "RUN_MIN_TOKENS_PER_SECOND": VarSpec("number", "tokens a second, a number above 0"),
    "OPEN_ACCESS": VarSpec("flag", "true or false"),
    "METRICS_OPEN": VarSpec("flag", "true or false: /metrics without the admin token"),
    "LOG_PROMPTS": VarSpec("flag", "true or false: the prompt in each request's log line"),
    "TRACE_LOGS": VarSpec("flag", "true or false: a log line per span (Workers Logs)"),
    "CORS_ORIGINS": VarSpec("list", "origins, comma-separated or a JSON list, e.g. https://app.example.com"),
    "RATE_LIMIT_PERIOD": VarSpec("whole", "the [[ratelimits]] period in seconds: 10 or 60"),
    "ANALYTICS_ACCOUNT_ID": VarSpec("text", "the Cloudflare account id (from `npx wrangler whoami`)"),
    "USAGE_DATASET": VarSpec("text", "the Analytics Engine dataset's name (default edgellm_usage)"),
    "ORIGINS": VarSpec("json_list", 'a JSON list of origins, e.g. [{"name": "central", "url": "https://llm.example.com/v1"}]'),
    "EDGE_FIRST_TOKEN_MS": VarSpec("whole", "milliseconds, a whole number of at least 1"),
    "EDGE_STALL_MS": VarSpec("whole", "milliseconds, a whole number of at least 1"),
    "EDGE_MAX_PROMPT_TOKENS": VarSpec("whole", "tokens, a whole number of at least 1"),
    "EDGE_MAX_OUTPUT_TOKENS": VarSpec("whole", "tokens, a whole number of at least 1"),
    "EDGE_TOKENIZER": VarSpec("text", "a published model name whose tokenizer counts prompts"),
    "BREAKER": VarSpec("json_object", 'a JSON object, e.g. {"failures": 5, "window_s": 30, "cooldown_s": 30}'),
    "GUARDRAILS": VarSpec("json_object", 'a JSON guardrails policy, e.g. {"moderation": {"prompt": {"S1": "block"}}, "dlp": {"email": "mask"}, "unmask_answer": true}'),
    "GUARD_FAIL": VarSpec("text", "closed (default: a failing guard refuses the request) or open (it lets it through)"),
    "GUARD_MODEL": VarSpec("text", "the Workers AI guard model (default @cf/meta/llama-guard-3-8b)"),
    "REGIONS": VarSpec("json_object", 'a JSON object of region code -> settings, e.g. {"EU": {"origin": "central"}}'),
}

RATE_LIMIT_PERIODS = ("10", "60")  # the Rate Limiting binding's only periods (developers.cloudflare.com/workers/runtime-apis/bindings/rate-limit/)

# Secrets, never [vars] (`npx wrangler secret put NAME`); `edgellm dev --var` takes them too.
SECRETS = ("ADMIN_TOKEN", "ANALYTICS_API_TOKEN", "ORIGIN_TOKEN")

_TOML_KINDS = {
    "text": (str,),
    "whole": (str, int),
    "number": (str, int, float),
    "flag": (str, bool),
    "list": (str,),
    "json_object": (str,),
    "json_list": (str,),
}
_TOML_TYPE_NAMES = {str: "a string", bool: "a boolean", int: "a number", float: "a number",
                    dict: "a TOML table", list: "a TOML array"}


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name a typo most likely meant (None when nothing is close)."""
    matches = difflib.get_close_matches(name.upper(), list(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_name(name: str, known: Iterable[str]) -> str:
    """The one line that refuses an unknown name: the nearest known one, or all of them."""
    known = sorted(known)
    guess = nearest(name, known)
    hint = f"did you mean {guess}?" if guess else f"known names: {', '.join(known)}"
    return f"unknown [vars] name {name!r}: {hint} (every name is in docs/operations.md)"


def toml_type_problem(name: str, value: Any) -> str | None:
    """A wrangler.toml value of a TOML type the Worker cannot read as `name` wants: a TOML table or
    array reaches a Python Worker as a JavaScript object, not the JSON text the config parses."""
    spec = VARS[name]
    if isinstance(value, _TOML_KINDS[spec.kind]) and not (isinstance(value, bool) and spec.kind != "flag"):
        return None
    got = _TOML_TYPE_NAMES.get(type(value), type(value).__name__)
    quoted = " in a string (quoted in wrangler.toml)" if spec.kind.startswith("json") or spec.kind == "list" else ""
    return f"{name} must be {spec.accepts}{quoted}, got {got}"


def as_var_text(value: Any) -> str:
    """A TOML value as the string the config reads (booleans in TOML's spelling)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def binding_var_problem(name: str, value: Any) -> str | None:
    """A var a binding's adapter reads, not the config (RATE_LIMIT_PERIOD: the Rate Limiting
    binding's period, the Retry-After of its refusals), refused as the config refuses its own: a
    typo would otherwise become a wait the binding does not keep. None when it is fine or not one."""
    if name == "RATE_LIMIT_PERIOD" and as_var_text(value).strip() not in RATE_LIMIT_PERIODS:
        return f"RATE_LIMIT_PERIOD must be {VARS[name].accepts}, got {value!r}"
    return None


def check_vars(values: Mapping[str, Any], *, secrets_allowed: bool = False) -> list[str]:
    """Every mistake in a set of `[vars]`, one line each: unknown names, TOML types the Worker
    cannot read, a secret put in [vars] where anyone who reads wrangler.toml sees it, and any value
    the config itself refuses (its message names the variable and what it accepts)."""
    from .config import Config  # the config imports nothing of this module's callers

    problems: list[str] = []
    readable: dict[str, str] = {}
    for name, value in values.items():
        if name in SECRETS:
            if not secrets_allowed:
                problems.append(f"{name} is a secret, not a [vars] value: remove it and run `npx wrangler secret put {name}`")
            readable[name] = as_var_text(value)
        elif name not in VARS:
            problems.append(unknown_name(name, VARS))
        elif (problem := toml_type_problem(name, value)) is not None:
            problems.append(problem)
        elif (problem := binding_var_problem(name, value)) is not None:
            problems.append(problem)
        else:
            readable[name] = as_var_text(value)
    if not problems:
        try:
            Config.from_env(readable)
        except ValueError as exc:
            problems.append(str(exc))
    return problems
