"""Gateway configuration, read from the Worker's `[vars]`/secrets (or the local edge's flags).

Values arrive as strings (that is what `[vars]` and secrets are), so parsing lives here once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

from .capabilities import WORKERS_AI_MODELS, Capabilities
from .guardrails.policy import NO_POLICY, Policy, PolicyError, parse_policy
from .routing.config import RoutingConfig

DEFAULT_MODEL = "@cf/meta/llama-2-7b-chat-int8"
DEFAULT_FALLBACK_MODELS = ("@cf/meta/llama-2-7b-chat-hf-lora",)
DEFAULT_GUARD_MODEL = "@cf/meta/llama-guard-3-8b"  # Workers AI's Llama Guard 3 (docs/guardrails.md)
GUARD_FAIL_MODES = ("closed", "open")
MAX_BODY_BYTES = 1024 * 1024
# The most characters one token covers, with room: the longest token of SmolLM2's 49,152 is 81
# characters (a newline and 80 spaces); runs of spaces, '#' or '=' are the longest in any
# byte-level vocabulary. A message past window x this can fill no window.
MAX_CHARS_PER_TOKEN = 128
# The fewest tokens one message costs in any chat template: every template marks where a message
# starts and where it ends (ChatML `<|im_start|>role ... <|im_end|>`, Llama 2 `[INST] ... [/INST]`
# or `</s><s>`, Gemma `<start_of_turn> ... <end_of_turn>`). More messages than window / this fill
# no window, so no route could take them.
MIN_TOKENS_PER_MESSAGE = 2
# Workers AI's published prices, USD per million (input, output) tokens; MODEL_PRICES overrides.
DEFAULT_PRICES = {
    "@cf/meta/llama-2-7b-chat-int8": (0.556, 6.667),
    "@cf/meta/llama-2-7b-chat-hf-lora": (0.556, 6.667),
}


def _positive_int(name: str, value: Any) -> int:
    """A count that must be at least 1: MAX_MESSAGES=0 would refuse every request and a negative cap
    means nothing, so a deploy with one fails at start-up naming the variable, not on every request."""
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
    return number


def _positive_number(name: str, value: Any) -> float:
    """A duration or rate that must be above 0 (and finite): START_TIMEOUT_SECONDS=0 would refuse
    every stream, a negative one means nothing, so a deploy with one fails at start-up naming it."""
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} must be a number above 0, got {value!r}") from None
    if not 0 < number < float("inf"):
        raise ValueError(f"{name} must be a number above 0, got {value!r}")
    return number


def _float(value: Any) -> float:
    """A [vars] string as a number; NaN (refused by every check) when it is not one."""
    try:
        return float(str(value).strip())
    except ValueError:
        return float("nan")


def _fraction(name: str, value: Any, default: float, *, rate: bool = False) -> float:
    """A share between 0 and 1, ends excluded; a sampling `rate` may be 0 (off) or 1 (every one),
    an error bound of 0 could never be met and one of 1 bounds nothing."""
    if value is None:
        return default
    number = _float(value)
    if not (0 <= number <= 1 if rate else 0 < number < 1):
        raise ValueError(f"{name} must be a number {'from 0 to 1' if rate else 'above 0 and below 1'}, got {value!r}")
    return number


def _finite(name: str, value: Any, default: float) -> float:
    if value is None:
        return default
    number = _float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return number


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(name: str, value: Any) -> bool:
    """Strict, since a flag read leniently fails silently: OPEN_ACCESS = "ture" once meant false."""
    text = str(value).strip().lower()
    if text not in _TRUE + _FALSE:
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return text in _TRUE


def _whole(name: str, value: Any, default: int) -> int:
    """A count, size or duration in whole units, at least 1; the message names the variable (int()'s
    own, "invalid literal for int() with base 10", names nothing)."""
    if value is None:
        return default
    return _positive_int(name, value)


def _json_text(name: str, value: Any, parse: Any, accepts: str) -> Any:
    """A JSON-valued variable parsed by `parse`; any refusal is said naming the variable."""
    try:
        return parse(value)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ValueError(f"{name} must be {accepts}, got {value!r} ({exc})") from None


def _prices(value: Any) -> dict[str, tuple[float, float]]:
    if value is None or value == "":
        return dict(DEFAULT_PRICES)
    data = value if isinstance(value, Mapping) else json.loads(str(value))
    return {**DEFAULT_PRICES, **{str(k): (float(v[0]), float(v[1])) for k, v in data.items()}}
# OpenAI names clients hard-code, answered by the primary model ("" = whatever MODEL is).
DEFAULT_MODEL_ALIASES = {"gpt-4o-mini": "", "gpt-3.5-turbo": ""}


def _list(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    text = str(value).strip()
    if text.startswith("["):
        return tuple(str(v) for v in json.loads(text))
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _dict(value: Any, default: Mapping[str, int]) -> dict[str, int]:
    if value is None or value == "":
        return dict(default)
    data = value if isinstance(value, Mapping) else json.loads(str(value))
    return {str(k): int(v) for k, v in data.items()}


def _json_object(value: Any) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    data = value if isinstance(value, Mapping) else json.loads(str(value))
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object, got {value!r}")
    return dict(data)


def _capabilities(value: Any) -> dict[str, Any]:
    """Checked once, when the vars are read: a misspelt capability is a setup error, not a
    failure of every request that names the model."""
    return {str(model): Capabilities.parse(names) for model, names in _json_object(value).items()}


@dataclass(frozen=True)
class Config:
    model: str = DEFAULT_MODEL
    fallback_models: tuple[str, ...] = DEFAULT_FALLBACK_MODELS
    # the embedding models `/v1/embeddings` serves (EMBEDDING_MODELS, comma-separated; wrangler.toml
    # names Workers AI's bge ids, the local edge its stand-in's); none: embeddings are not served
    embedding_models: tuple[str, ...] = ()
    context_window: int = 8192
    max_body_bytes: int = MAX_BODY_BYTES
    cache_namespace: str = "default"
    cache_default_ttl: int = 86400
    cache_classes: dict[str, int] = field(
        default_factory=lambda: {"news": 300, "faq": 86400, "template": 7 * 86400}
    )
    admin_token: str | None = None
    tenant: str = "default"
    conversation_ttl: int = 30 * 86400  # seconds a stored response lives (CONVERSATION_TTL)
    conversation_max_bytes: int = 1024 * 1024  # stored size cap per conversation (CONVERSATION_MAX_BYTES)
    max_waiting_generations: int = 32  # admission control: generations in progress per isolate
    # seconds an admitted stream may wait for the binding to open it before a 503 + Retry-After
    # (START_TIMEOUT_SECONDS): admission bounds how many wait, this how long
    start_timeout_seconds: float = 30.0
    # the fewest tokens a second a whole (non-streamed) answer must come at (RUN_MIN_TOKENS_PER_SECOND):
    # a binding call that shows nothing until it ends gets `answer_timeout_seconds(max_tokens)`.
    # 1 by default: a CPU model on the local edge (a 7B GGUF on a laptop, the tiny model on a loaded
    # 2-core CI box) can make 2-3 tokens a second and is still healthy; wrangler.toml sets 4 for
    # Workers AI, which generates many times faster, so a stalled call ends sooner there.
    run_min_tokens_per_second: float = 1.0
    # Access (see access/): without OPEN_ACCESS every API call needs a key; open mode is only
    # ever configured, and said loudly (start banner, /healthz).
    open_access: bool = False
    cors_origins: tuple[str, ...] = ()  # besides the edge's own origin and localhost
    metrics_open: bool = False  # GET /metrics without the admin token (METRICS_OPEN; the local edge on loopback)
    log_prompts: bool = False  # the request log line carries the prompt (LOG_PROMPTS); never by default
    trace_logs: bool = False  # on Cloudflare, each span as a JSON log line (TRACE_LOGS; locally: OTLP)
    # None: derived from the routes' windows (`max_messages`); MAX_MESSAGES sets a stricter one.
    fixed_max_messages: int | None = None
    # USD per million tokens (input, output), for the usage API's estimated cost.
    model_prices: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    # model id -> what it can honour (see capabilities.py); unlisted ids use the backend's word
    # or Cloudflare's published lists. `MODEL_CAPABILITIES` var: {"id": ["json_mode", ...]}.
    model_capabilities: dict[str, Any] = field(default_factory=dict)
    # alias -> served model id (e.g. "gpt-4o-mini" -> MODEL), for clients that hard-code a name.
    # `MODEL_ALIASES` var: {"gpt-4o-mini": "@cf/..."}; a target of "" means the primary MODEL.
    model_aliases: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_MODEL_ALIASES))

    @property
    def aliases(self) -> dict[str, str]:
        """Aliases resolved to served ids (a target the gateway does not serve is dropped)."""
        resolved = {alias: (target or self.model) for alias, target in self.model_aliases.items()}
        return {alias: target for alias, target in resolved.items() if target in self.models and alias not in self.models}
    routing: RoutingConfig = field(default_factory=RoutingConfig)  # origins, budgets, breaker, regions
    # the semantic cache's error bound (cache/calibration.py): the largest share of its hits allowed
    # to serve an answer the model would not have given (SEMANTIC_MAX_ERROR; a key may set its own)
    # ("off": None, hits served on the guard and thresholds alone, unchecked: the operator's risk)
    semantic_max_error: float | None = 0.02
    semantic_check_rate: float = 0.05  # share of served semantic hits checked after the response (SEMANTIC_CHECK_RATE)
    semantic_checks_per_minute: int = 20  # their generations' cap, per isolate (SEMANTIC_CHECKS_PER_MINUTE)
    # the cross-encoder asked before a semantic candidate is served (cache/verifier.py): a model id
    # (Workers AI's @cf/baai/bge-reranker-base) or None, off (SEMANTIC_VERIFIER), and the score it must reach
    semantic_verifier: str | None = None
    semantic_verifier_threshold: float = 0.5
    # the gateway's guardrails policy (GUARDRAILS; a key's own replaces it for its requests)
    guardrails: Policy = NO_POLICY
    # what a guard that errors, times out or answers no verdict means (GUARD_FAIL): `closed`
    # refuses the request (503 guard_unavailable), `open` lets it through, counted
    guard_fail: str = "closed"
    guard_model: str = DEFAULT_GUARD_MODEL  # the Workers AI model the guard runs (GUARD_MODEL)
    # how long a guard's verdict may take before the guard counts as failed (GUARD_FAIL decides):
    # short, since every checked prompt waits for it (Llama Guard answers a few tokens)
    guard_timeout_seconds: float = 5.0
    # tokens of a streamed answer held back per guard verdict (the window), under a policy that
    # moderates answers: chosen from bench_guardrails' figures (docs/guardrails.md)
    guard_window_tokens: int = 16

    def answer_timeout_seconds(self, max_tokens: int) -> float:
        """How long a whole answer (`ai.run`, which shows no first token) may take: the start
        deadline streams have, plus its `max_tokens` at the slowest rate allowed. A deadline that
        grows with the answer's length never cuts a long answer a healthy binding is still making,
        and still ends a stalled call."""
        return self.start_timeout_seconds + max(0, max_tokens) / self.run_min_tokens_per_second

    @cached_property  # the config is frozen: computed once, read on every request
    def largest_context_window(self) -> int:
        """The largest context window of any route: the edge's, or a configured origin's."""
        return max([self.context_window, *(origin.context_window for origin in self.routing.origins)])

    @cached_property
    def max_message_chars(self) -> int:
        """The characters one message (or a prompt) may hold: as many as the largest route's
        window could take, never more than a body can carry. A fixed 64 KiB once refused, as
        `message_too_long`, a message a 32k-token origin would have taken. Whether a route can
        really take a prompt is its token count's question (`context_length_exceeded`), so this
        bound only has to be one no prompt a route takes can pass: `MAX_CHARS_PER_TOKEN` per token."""
        return min(self.max_body_bytes, self.largest_context_window * MAX_CHARS_PER_TOKEN)

    @cached_property
    def max_messages(self) -> int:
        """How many messages one request may carry: as many as the largest route's window could
        hold. A fixed 256 once refused a 300-message conversation a 32k-token origin would take;
        `context_length_exceeded` is the question whether a route really can. An operator's
        MAX_MESSAGES may only make it stricter."""
        derived = max(1, self.largest_context_window // MIN_TOKENS_PER_MESSAGE)
        return derived if self.fixed_max_messages is None else min(derived, self.fixed_max_messages)

    @cached_property
    def models(self) -> tuple[str, ...]:
        """Every model id the gateway serves, primary first, without duplicates."""
        return tuple(dict.fromkeys((self.model, *self.fallback_models)))

    @classmethod
    def from_env(cls, env: Mapping[str, Any]) -> "Config":
        def get(name: str) -> Any:
            value = env.get(name)
            return None if value is None or value == "" else value

        base = cls()
        config = cls(
            model=str(get("MODEL") or base.model),
            # present but empty turns fallback off; absent keeps the default list
            fallback_models=_json_text("FALLBACK_MODELS", env.get("FALLBACK_MODELS"), _list,
                                       "model ids, comma-separated or a JSON list") if env.get("FALLBACK_MODELS") is not None else base.fallback_models,
            embedding_models=_json_text("EMBEDDING_MODELS", get("EMBEDDING_MODELS"), _list, "model ids, comma-separated or a JSON list"),
            context_window=_whole("CONTEXT_WINDOW", get("CONTEXT_WINDOW"), base.context_window),
            cache_namespace=str(get("CACHE_NAMESPACE") or base.cache_namespace),
            cache_default_ttl=_whole("CACHE_DEFAULT_TTL", get("CACHE_DEFAULT_TTL"), base.cache_default_ttl),
            cache_classes=_json_text("CACHE_CLASSES", get("CACHE_CLASSES"), lambda v: _dict(v, base.cache_classes),
                                     'a JSON object of class -> TTL seconds, e.g. {"news": 300}'),
            admin_token=get("ADMIN_TOKEN"),
            tenant=str(get("TENANT") or base.tenant),
            conversation_ttl=_whole("CONVERSATION_TTL", get("CONVERSATION_TTL"), base.conversation_ttl),
            conversation_max_bytes=_whole("CONVERSATION_MAX_BYTES", get("CONVERSATION_MAX_BYTES"), base.conversation_max_bytes),
            max_waiting_generations=_whole("MAX_WAITING_GENERATIONS", get("MAX_WAITING_GENERATIONS"),
                                           base.max_waiting_generations),
            start_timeout_seconds=(_positive_number("START_TIMEOUT_SECONDS", get("START_TIMEOUT_SECONDS"))
                                   if get("START_TIMEOUT_SECONDS") else base.start_timeout_seconds),
            run_min_tokens_per_second=(_positive_number("RUN_MIN_TOKENS_PER_SECOND", get("RUN_MIN_TOKENS_PER_SECOND"))
                                       if get("RUN_MIN_TOKENS_PER_SECOND") else base.run_min_tokens_per_second),
            open_access=_flag("OPEN_ACCESS", get("OPEN_ACCESS") or "false"),
            cors_origins=_json_text("CORS_ORIGINS", get("CORS_ORIGINS"), _list, "origins, comma-separated or a JSON list"),
            metrics_open=_flag("METRICS_OPEN", get("METRICS_OPEN") or "false"),
            log_prompts=_flag("LOG_PROMPTS", get("LOG_PROMPTS") or "false"),
            trace_logs=_flag("TRACE_LOGS", get("TRACE_LOGS") or "false"),
            fixed_max_messages=_positive_int("MAX_MESSAGES", get("MAX_MESSAGES")) if get("MAX_MESSAGES") else None,
            model_prices=_json_text("MODEL_PRICES", get("MODEL_PRICES"), _prices,
                                    "a JSON object of model id -> [USD per million input tokens, output tokens]"),
            model_capabilities=_json_text("MODEL_CAPABILITIES", get("MODEL_CAPABILITIES"), _capabilities,
                                          'a JSON object of model id -> capability names, e.g. {"@cf/...": ["json_mode"]}'),
            # present but empty turns aliases off; absent keeps the default ones
            model_aliases=(_json_text("MODEL_ALIASES", get("MODEL_ALIASES"),
                                      lambda v: {str(k): str(t) for k, t in _json_object(v).items()},
                                      'a JSON object of alias -> model id ("" = MODEL), e.g. {"gpt-4o-mini": ""}')
                           if env.get("MODEL_ALIASES") is not None else dict(base.model_aliases)),
            routing=RoutingConfig.from_env(env),
            semantic_max_error=(None if str(get("SEMANTIC_MAX_ERROR") or "").strip().lower() == "off"
                                else _fraction("SEMANTIC_MAX_ERROR", get("SEMANTIC_MAX_ERROR"), 0.02)),
            semantic_check_rate=_fraction("SEMANTIC_CHECK_RATE", get("SEMANTIC_CHECK_RATE"), base.semantic_check_rate, rate=True),
            semantic_verifier=(None if str(get("SEMANTIC_VERIFIER") or "off").strip().lower() in ("off", "none")
                               else str(get("SEMANTIC_VERIFIER")).strip()),
            semantic_verifier_threshold=_finite("SEMANTIC_VERIFIER_THRESHOLD", get("SEMANTIC_VERIFIER_THRESHOLD"),
                                                base.semantic_verifier_threshold),
            semantic_checks_per_minute=(_positive_int("SEMANTIC_CHECKS_PER_MINUTE", get("SEMANTIC_CHECKS_PER_MINUTE"))
                                        if get("SEMANTIC_CHECKS_PER_MINUTE") else base.semantic_checks_per_minute),
            guardrails=_guardrails(get("GUARDRAILS")),
            guard_fail=_guard_fail(get("GUARD_FAIL")),
            guard_model=str(get("GUARD_MODEL") or base.guard_model),
        )
        problem = config_mistake(config)
        if problem is not None:
            raise ValueError(problem)
        return config


def _guardrails(value: Any) -> Policy:
    try:
        return parse_policy(value)
    except PolicyError as exc:  # its text names GUARDRAILS and the bad value
        raise ValueError(f"{exc} (docs/guardrails.md gives the format)") from None


def _guard_fail(value: Any) -> str:
    text = str(value or "closed").strip().lower()
    if text not in GUARD_FAIL_MODES:
        raise ValueError(f"GUARD_FAIL must be closed or open, got {value!r}")
    return text


def _is_embedding_model(model: str, config: Config) -> str | None:
    """Why `model` cannot chat, if it cannot: listed in EMBEDDING_MODELS, or an embedding model
    in Cloudflare's catalog (`capabilities.WORKERS_AI_MODELS`)."""
    if model in config.embedding_models:
        return "is listed in EMBEDDING_MODELS"
    facts = WORKERS_AI_MODELS.get(model)
    return "is an embedding model in Workers AI's catalog" if facts is not None and facts.kind == "embedding" else None


def config_mistake(config: Config) -> str | None:
    """Settings each valid alone that together make an edge that starts and then fails every
    request of a kind, or publishes what it must not: refused where a deploy is checked and where
    an edge starts (the local edge exits, the Worker answers `worker_misconfigured`), never found by
    the first caller. One line, naming each variable involved; None when there is none."""
    if (why := _is_embedding_model(config.model, config)) is not None:
        return (f"MODEL {config.model} {why}: an embedding model cannot chat, so every chat request would be a 400; "
                "set MODEL to a chat model and keep embedding models in EMBEDDING_MODELS only")
    for model in config.fallback_models:
        if (why := _is_embedding_model(model, config)) is not None:
            return (f"FALLBACK_MODELS names {model}, which {why}: an embedding model cannot chat, so every fallback "
                    "to it would fail; list chat models only in FALLBACK_MODELS")
    if config.metrics_open and not config.open_access:
        return ("METRICS_OPEN is true while API keys are required (OPEN_ACCESS false): /metrics would show every "
                "tenant's name and token counts to anyone; set METRICS_OPEN false and scrape /metrics with the admin "
                "token (Authorization: Bearer), or open the whole edge with OPEN_ACCESS true")
    return None


def embedding_width(model: str) -> int | None:
    """The width of the vectors `model` makes, where Cloudflare's catalog says it (None: known
    only from its first answer)."""
    facts = WORKERS_AI_MODELS.get(model)
    return facts.dimensions if facts is not None and facts.kind == "embedding" else None


def index_width_problem(config: Config, index_dimensions: int, where: str, width: int | None = None) -> str | None:
    """The semantic cache embeds with the first of EMBEDDING_MODELS and searches an index of a
    dimension fixed when it was made (Vectorize's `--dimensions`, the local index's first vector):
    a model of another width makes every lookup and write fail, so the cache never answers. `width`
    is the model's, where the caller knows it (the local edge reads its GGUF), else the catalog's;
    unknown, nothing can be said before its first answer. One line, or None."""
    if not config.embedding_models:
        return None
    model = config.embedding_models[0]
    width = width if width is not None else embedding_width(model)
    if width is None or width == index_dimensions:
        return None
    return (f"the semantic cache's embedding model {model} (the first of EMBEDDING_MODELS) makes {width}-dimensional "
            f"vectors, but {where} holds {index_dimensions}: every semantic lookup would fail; put a model of "
            f"{index_dimensions} dimensions first in EMBEDDING_MODELS, or make an index of {width}")
