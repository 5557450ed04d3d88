"""`cache.service.decoded`: a HIT's entry is decoded once per tenant's key and bytes (in the
isolate's memo), never across tenants, and a corrupt entry is never remembered (each read of it
is a miss again)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from edgellm.cache.entry import CachedAnswer, CorruptEntry
from edgellm.cache.key import CacheKey, CacheScope
from edgellm.cache.service import MEMO_MAX_ENTRY_BYTES, decoded, lookup
from edgellm.generation import Usage
from edgellm.state import IsolateState

DIGEST = "0" * 64
ANSWER = CachedAnswer("m", ("Hel", "lo"), "stop", Usage(3, 2), 1.0)


def isolate() -> SimpleNamespace:
    """What `decoded` reads of `Deps`: the isolate's state, where the memo lives."""
    return SimpleNamespace(state=IsolateState())


def kv_key(tenant: str) -> str:
    return CacheKey(CacheScope(tenant, "default"), DIGEST).kv_key


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every real decode made, in order (the memo emptied first)."""
    made: list[bytes] = []
    real = CachedAnswer.decode.__func__  # type: ignore[attr-defined]

    def counted(cls: type[CachedAnswer], data: bytes) -> CachedAnswer:
        made.append(data)
        return real(cls, data)

    monkeypatch.setattr(CachedAnswer, "decode", classmethod(counted))
    yield made


def test_an_entry_is_decoded_once_for_its_key_and_bytes(decodes: list[bytes]) -> None:
    deps = isolate()
    data = ANSWER.encode()
    assert decoded(deps, kv_key("a"), data) == ANSWER
    assert decoded(deps, kv_key("a"), data) is decoded(deps, kv_key("a"), data)
    assert decodes == [data]
    other = CachedAnswer("m", ("Bye",), "stop", Usage(3, 1), 2.0)
    assert decoded(deps, kv_key("a"), other.encode()) == other  # new bytes under the same key: decoded anew
    assert decodes == [data, other.encode()]


def test_another_tenant_never_finds_a_decode_warm(decodes: list[bytes]) -> None:
    deps = isolate()
    data = ANSWER.encode()
    decoded(deps, kv_key("a"), data)
    decoded(deps, kv_key("b"), data)  # the same bytes: its own decode, not tenant a's
    assert decodes == [data, data]


def test_a_corrupt_entry_is_never_remembered(decodes: list[bytes]) -> None:
    deps = isolate()
    for _ in range(2):
        with pytest.raises(CorruptEntry):
            decoded(deps, kv_key("a"), b'{"v": 1, "model": "m"')
    assert len(decodes) == 2  # read again each time: a miss each time


async def test_a_large_entry_is_decoded_every_time_never_kept(decodes: list[bytes]) -> None:
    """The memo's memory is bounded in bytes: an entry past MEMO_MAX_ENTRY_BYTES is decoded on
    each HIT and never held by the memo (a KV value may be 25 MiB, an isolate has 128 MB)."""
    import logging

    from edgellm.ports import KVEntry

    big = CachedAnswer("m", ("x" * 100,) * (MEMO_MAX_ENTRY_BYTES // 100 + 1), "stop", Usage(3, 2), 1.0).encode()
    small = ANSWER.encode()
    assert len(big) > MEMO_MAX_ENTRY_BYTES >= len(small)
    values = {kv_key("a"): big, kv_key("b"): small}

    class KV:
        async def get(self, key: str, **kwargs: Any) -> KVEntry:
            return KVEntry(values[key], {})

    deps = SimpleNamespace(kv=KV(), log=logging.getLogger("test"), state=IsolateState())
    for tenant in ("a", "a", "b", "b"):
        answer, size = await lookup(deps, CacheKey(CacheScope(tenant, "default"), DIGEST))  # type: ignore[arg-type]
        assert answer is not None and size == len(values[kv_key(tenant)])
    assert decodes == [big, big, small]  # the large one twice, the small one once
    assert list(deps.state.answers.entries) == [(kv_key("b"), small)]
