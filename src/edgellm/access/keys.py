"""API keys: what a key record holds, how a key is checked, and where records live (KV).

A record is stored under `access/keys/<key id>`; it holds the SHA-256 of the secret, never the
secret. The key a caller sends is `el-<key id>.<secret>`: the id finds the record with one KV read
(no listing, no scan), and the secret's hash is compared in constant time (`hmac.compare_digest`).
SHA-256 and not a slow password hash: the secret is 32 random bytes, so there is nothing to guess,
and the check sits on the HIT path that answers in about a millisecond.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from functools import lru_cache
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..guardrails.policy import Policy, parse_policy
from ..ports import KVStore

KEY_PREFIX = "access/keys/"
_KEY = re.compile(r"^el-([a-z0-9]{12})\.([A-Za-z0-9_-]{20,100})$")
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # "_shared" (the shared pool) is no tenant
# Tenant names the edge uses itself: `default` is the configured tenant out of the box, the tenant
# of the admin token and of every open-mode caller; a key of that tenant would read their cache
# entries, stored responses and usage. Refused when a key is made and when one is presented.
RESERVED_TENANTS = frozenset({"default", "admin", "open", "shared", "edgellm"})


def is_reserved_tenant(tenant: str, configured: str | None = None) -> bool:
    """Whether `tenant` is one the edge uses itself (any case), or the edge's configured tenant."""
    return tenant.lower() in RESERVED_TENANTS or (configured is not None and tenant.lower() == configured.lower())


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class KeyRecord:
    """One API key. `requests_per_minute`/`tokens_per_minute` of 0 mean unlimited; `token_budget`
    of 0 means no lifetime budget; an empty `models` allows every configured model."""

    key_id: str
    secret_sha256: str
    tenant: str
    requests_per_minute: int = 60
    tokens_per_minute: int = 0
    token_budget: int = 0
    models: tuple[str, ...] = ()
    share_cache: bool = False
    # the semantic cache (cache/semantic.py) for every request of this key, unless a request
    # says `x-edgellm-semantic-cache: off`; off by default
    semantic_cache: bool = False
    semantic_max_error: float | None = None  # this key's own bound on wrong semantic hits (None: SEMANTIC_MAX_ERROR)
    # this key's guardrails policy as GUARDRAILS' JSON text (docs/guardrails.md); "" = the gateway's
    guardrails: str = ""
    created: float = 0.0
    revoked: float | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not _TENANT.fullmatch(self.tenant):
            raise ValueError(f"a tenant name must match {_TENANT.pattern}: {self.tenant!r}")
        if self.guardrails:
            parse_policy(self.guardrails)  # a PolicyError (a ValueError) names the bad value

    @property
    def policy(self) -> Policy | None:
        """The key's own guardrails policy; None: the gateway's applies."""
        return key_policy(self.guardrails) if self.guardrails else None

    @property
    def kv_key(self) -> str:
        return KEY_PREFIX + self.key_id

    @property
    def active(self) -> bool:
        return self.revoked is None

    def allows_model(self, model: str) -> bool:
        return not self.models or model in self.models

    def matches(self, secret: str) -> bool:
        return hmac.compare_digest(hash_secret(secret).encode(), self.secret_sha256.encode())

    def encode(self) -> bytes:
        data = asdict(self)
        data["models"] = list(self.models)
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "KeyRecord":
        data = json.loads(raw)
        data["models"] = tuple(data.get("models") or ())
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def public_json(self) -> dict[str, Any]:
        """What `keys list` and the admin API may show: everything but the hash."""
        data = asdict(self)
        data.pop("secret_sha256")
        data["models"] = list(self.models)
        return data


@lru_cache(maxsize=256)  # a key's policy is read on each of its requests; its text never changes
def key_policy(text: str) -> Policy:
    return parse_policy(text)


@dataclass(frozen=True)
class NewKey:
    record: KeyRecord
    api_key: str  # shown once, at creation; only its hash is stored


def parse_api_key(api_key: str) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed key, else None."""
    match = _KEY.fullmatch(api_key)
    return (match.group(1), match.group(2)) if match else None


def new_key(tenant: str, now: float, **limits: Any) -> NewKey:
    if is_reserved_tenant(tenant):
        raise ValueError(f"the tenant name {tenant!r} is reserved: the edge uses it itself (reserved: {', '.join(sorted(RESERVED_TENANTS))})")
    for name in ("requests_per_minute", "tokens_per_minute", "token_budget"):
        if int(limits.get(name) or 0) < 0:
            raise ValueError(f"{name} must be 0 (unlimited) or more, got {limits[name]}")
    bound = limits.get("semantic_max_error")
    if bound is not None and not 0 < float(bound) < 1:
        raise ValueError(f"semantic_max_error must be above 0 and below 1, got {bound}")
    key_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
    secret = secrets.token_urlsafe(32)
    record = KeyRecord(key_id=key_id, secret_sha256=hash_secret(secret), tenant=tenant, created=now, **limits)
    return NewKey(record, f"el-{key_id}.{secret}")


def rotated(record: KeyRecord, now: float) -> tuple[KeyRecord, NewKey]:
    """(the old record, revoked now; a new key with the same tenant and limits)."""
    fresh = new_key(record.tenant, now, requests_per_minute=record.requests_per_minute,
                    tokens_per_minute=record.tokens_per_minute, token_budget=record.token_budget,
                    models=record.models, share_cache=record.share_cache, semantic_cache=record.semantic_cache,
                    semantic_max_error=record.semantic_max_error, guardrails=record.guardrails, name=record.name)
    return replace(record, revoked=now), fresh


@dataclass
class KeyRing:
    """Key records in a KV namespace (the Worker's `CACHE` binding or a dedicated `KEYS` one)."""

    kv: KVStore

    async def get(self, key_id: str) -> KeyRecord | None:
        entry = await self.kv.get(KEY_PREFIX + key_id)
        return KeyRecord.decode(entry.value) if entry is not None else None

    async def put(self, record: KeyRecord) -> None:
        await self.kv.put(record.kv_key, record.encode(), metadata={"tenant": record.tenant})

    async def list(self) -> list[KeyRecord]:
        records, cursor = [], None
        while True:
            page = await self.kv.list(prefix=KEY_PREFIX, cursor=cursor)
            for item in page.get("keys", []):
                record = await self.get(item["name"][len(KEY_PREFIX):])
                if record is not None:
                    records.append(record)
            cursor = page.get("cursor")
            if page.get("list_complete", True) or not cursor:
                return records


@dataclass
class KeyCache:
    """Records an isolate read recently (plain per-isolate data, no I/O shared between requests):
    the HIT path then costs no KV read for the key. A revocation is seen within `ttl` seconds,
    the way KV itself propagates writes."""

    ttl: float = 30.0
    entries: dict[str, tuple[KeyRecord | None, float]] = field(default_factory=dict)

    def get(self, key_id: str, now: float) -> tuple[bool, KeyRecord | None]:
        hit = self.entries.get(key_id)
        if hit is None or now - hit[1] >= self.ttl:
            return False, None
        return True, hit[0]

    def put(self, key_id: str, record: KeyRecord | None, now: float) -> None:
        if len(self.entries) > 10_000:  # bounded: random key ids must not grow memory forever
            self.entries.clear()
        self.entries[key_id] = (record, now)
