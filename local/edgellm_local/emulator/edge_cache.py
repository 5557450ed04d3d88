"""The data centre's cache on the local edge: the `EdgeCache` port in memory.

It answers as Workers' Cache API does where the core can tell: only a whole 200 is stored (a
206 is refused, as `cache.put` throws on one), a `range` header on `match` is answered with a
206 cut from the stored 200 (`content-range` set; an unsatisfiable or unparseable range is
answered whole, as the Cache API ignores what it cannot serve), and it forgets the oldest
entries beyond `max_bytes`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import AsyncIterator, Mapping

from edgellm.artifacts.conditional import parse_range
from edgellm.errors import GatewayError
from edgellm.ports import CachedResponse


async def _once(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


@dataclass
class MemoryEdgeCache:
    max_bytes: int = 64 * 1024 * 1024
    _entries: OrderedDict[str, tuple[dict[str, str], bytes]] = field(default_factory=OrderedDict, init=False, repr=False)
    puts: int = 0
    matches: int = 0
    hits: int = 0

    async def match(self, url: str, headers: Mapping[str, str]) -> CachedResponse | None:
        self.matches += 1
        entry = self._entries.get(url)
        if entry is None:
            return None
        self.hits += 1
        stored, data = entry
        wanted = {k.lower(): v for k, v in headers.items()}.get("range")
        try:
            byte_range = parse_range(wanted, len(data)) if wanted else None
        except GatewayError:  # unsatisfiable: answered whole
            byte_range = None
        if byte_range is None:
            return CachedResponse(200, dict(stored), _once(data))
        answered = {**stored, "content-range": byte_range.content_range(len(data)), "content-length": str(byte_range.length)}
        return CachedResponse(206, answered, _once(data[byte_range.first : byte_range.last + 1]))

    async def put(self, url: str, status: int, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> None:
        if status != 200:
            raise ValueError(f"Cache.put refuses a {status} response")
        data = b"".join([chunk async for chunk in body])
        self.puts += 1
        self._entries[url] = ({k.lower(): v for k, v in headers.items()}, data)
        self._entries.move_to_end(url)
        while sum(len(d) for _, d in self._entries.values()) > self.max_bytes and len(self._entries) > 1:
            self._entries.popitem(last=False)
