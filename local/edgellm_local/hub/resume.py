"""Pure pieces of a resumable download: retry timing, header parsing, and the sidecar state.

Kept apart from the HTTP code so each rule is a function with a table of cases: how long to wait
before attempt n, what `Retry-After` means, which bytes a `Content-Range` covers, and what a
previous, interrupted run left behind that can be trusted.
"""

from __future__ import annotations

import email.utils
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from edgellm.artifacts.conditional import parse_content_range as parse_content_range  # one parser, the core's
from edgellm.artifacts.conditional import range_header as core_range_header

from edgellm_local.hub.manifest import Manifest


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: exponential backoff with jitter, capped, and `Retry-After` honoured.

    `attempts` bounds tries of one request without progress (a retry that received bytes starts
    the count again, so a flaky link still finishes a big shard); `corrupt_attempts` bounds how
    often a shard that fails its SHA-256 is fetched before the pull gives up."""

    attempts: int = 6
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_retry_after: float = 300.0
    corrupt_attempts: int = 3

    def delay(self, attempt: int, retry_after: float | None, rand: float) -> float:
        """Seconds to wait before retry number `attempt` (1-based); `rand` is uniform in [0, 1).

        "Equal jitter": half the exponential step is fixed and half random, so concurrent shard
        downloads that failed together do not come back together. A server's `Retry-After` wins
        (within `max_retry_after`): it knows when it will have capacity again."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        step = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return step / 2 + step / 2 * rand


def parse_retry_after(value: str | None, now: float) -> float | None:
    """`Retry-After` as seconds from `now` (epoch seconds): delta-seconds or an HTTP-date."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now, 0.0)


def range_header(start: int, size: int) -> str:
    """The `Range` asking for the rest of an object of `size` bytes from `start`."""
    return core_range_header(offset=start, length=size - start)


@dataclass
class ResumeState:
    """What an earlier run of a pull of this exact model (by whole-file SHA-256) left on disk:
    shards already verified in `<file>.partial`, and bytes received of the others."""

    model_sha256: str
    verified: set[int] = field(default_factory=set)
    received: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "model_sha256": self.model_sha256,
                "verified": sorted(self.verified),
                "received": {str(k): v for k, v in sorted(self.received.items()) if v > 0},
            }
        )

    @classmethod
    def from_json(cls, raw: str, manifest: Manifest) -> "ResumeState":
        """The state if it describes this manifest's model and is well formed, else a fresh one:
        a stale or damaged sidecar costs a re-download, never a wrong file."""
        fresh = cls(manifest.model.sha256)
        try:
            data = json.loads(raw)
            if data["model_sha256"] != manifest.model.sha256:
                return fresh
            shards = {s.index: s.size for s in manifest.shards}
            verified = {int(i) for i in data["verified"]}
            received = {int(k): int(v) for k, v in data["received"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return fresh
        if not verified <= shards.keys():
            return fresh
        received = {i: n for i, n in received.items() if i in shards and i not in verified and 0 < n < shards[i]}
        return cls(manifest.model.sha256, verified, received)

    @classmethod
    def load(cls, path: Path, manifest: Manifest) -> "ResumeState":
        try:
            return cls.from_json(path.read_text(), manifest)
        except OSError:
            return cls(manifest.model.sha256)

    def save(self, path: Path) -> None:
        write_atomic(path, self.to_json().encode())


def write_atomic(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
