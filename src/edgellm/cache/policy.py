"""What a request asks of the cache: read it, write it, for how long, or bypass it.

Controls follow Cloudflare AI Gateway (`cf-aig-skip-cache`, `cf-aig-cache-ttl`,
`cf-aig-cache-key`) and HTTP (`Cache-Control: no-cache` = do not read but refresh,
`no-store` = do not write). Only deterministic requests are cached: temperature 0 after
defaults (Workers AI defaults to 0.6, so omitting it is NOT deterministic) or an explicit seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..config import Config
from ..errors import invalid
from ..generation import GenerationRequest
from ..http import Request

MIN_TTL = 60
MAX_TTL = 30 * 86400
CLASS_HEADER = "x-edgellm-cache-class"
NOT_DETERMINISTIC = "not deterministic (temperature > 0 and no seed)"


@dataclass(frozen=True)
class CachePolicy:
    read: bool
    write: bool
    ttl: int
    bypass_reason: str | None = None
    custom_key: str | None = None

    @property
    def bypass(self) -> bool:
        return self.bypass_reason is not None


def is_deterministic(request: GenerationRequest) -> bool:
    return request.inputs.get("temperature") == 0 or request.inputs.get("seed") is not None


def _ttl(request: Request, config: Config) -> int:
    raw = request.header("cf-aig-cache-ttl")
    if raw is not None:
        try:
            seconds = int(raw.strip())
        except ValueError:
            raise invalid(f"'cf-aig-cache-ttl' must be a whole number of seconds, got {raw!r}.", "cf-aig-cache-ttl", "invalid_header") from None
        return _clamped(seconds)
    name = request.header(CLASS_HEADER)
    if name is not None:
        if name not in config.cache_classes:
            known = ", ".join(sorted(config.cache_classes))
            raise invalid(f"Unknown cache class {name!r}; configured classes: {known}.", CLASS_HEADER, "unknown_cache_class")
        return _clamped(config.cache_classes[name])
    return _clamped(config.cache_default_ttl)


def _clamped(seconds: int) -> int:
    """A TTL within KV's floor and the gateway's 30 days."""
    return min(max(seconds, MIN_TTL), MAX_TTL)


# every header that changes the policy (names as `Request.headers` holds them, lower-cased)
POLICY_HEADERS = frozenset({"cf-aig-cache-ttl", CLASS_HEADER, "cf-aig-cache-key", "cf-aig-skip-cache", "cache-control"})


@lru_cache(maxsize=16)  # per configured default TTL: most requests send none of POLICY_HEADERS
def _default_policy(ttl: int, deterministic: bool) -> CachePolicy:
    ttl = _clamped(ttl)
    if not deterministic:
        return CachePolicy(False, False, ttl, NOT_DETERMINISTIC)
    return CachePolicy(read=True, write=True, ttl=ttl)


def cache_policy(request: Request, generation: GenerationRequest, config: Config) -> CachePolicy:
    if request.headers.keys().isdisjoint(POLICY_HEADERS):  # no header to read: the config's policy, made once
        return _default_policy(config.cache_default_ttl, is_deterministic(generation))
    ttl = _ttl(request, config)  # validated even when bypassing: a bad header is a bad request
    custom = request.header("cf-aig-cache-key")
    if custom is not None and not (0 < len(custom) <= 256):
        raise invalid("'cf-aig-cache-key' must be 1 to 256 characters.", "cf-aig-cache-key", "invalid_header")
    if (request.header("cf-aig-skip-cache") or "").strip().lower() == "true":
        return CachePolicy(False, False, ttl, "skip-cache header")
    if not is_deterministic(generation):
        return CachePolicy(False, False, ttl, NOT_DETERMINISTIC)
    directives = {d.strip().lower() for d in (request.header("cache-control") or "").split(",")}
    return CachePolicy(read="no-cache" not in directives, write="no-store" not in directives, ttl=ttl, custom_key=custom)
