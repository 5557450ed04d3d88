"""Session affinity over origins: the same conversation always goes to the same replica.

Rendezvous (highest-random-weight) hashing: each origin scores `sha256(session, origin name)`
and a session's origins are tried in score order. It is consistent: adding or removing an origin
moves only the sessions whose top choice it was, and every isolate computes the same order with
no shared state. For a llama.cpp origin (one with `slots`), the session also picks a slot
(`id_slot`) by the same hash, with `cache_prompt`, so its KV cache is there on the next turn.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

from .config import OriginConfig


def _score(session: str, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{session}\0{name}".encode()).digest()[:8], "big")


def by_affinity(origins: Sequence[OriginConfig], session: str) -> list[OriginConfig]:
    """`origins` in this session's order: its pinned replica first, then its fallbacks."""
    return sorted(origins, key=lambda o: _score(session, o.name), reverse=True)


def slot_for(session: str, origin: OriginConfig) -> int | None:
    """The llama.cpp slot this session uses on `origin`, or None when it has no slots configured."""
    if not origin.slots:
        return None
    return _score(session, origin.name + "\0slot") % origin.slots
