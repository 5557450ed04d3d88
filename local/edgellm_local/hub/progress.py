"""A plain-text progress bar with throughput, for long downloads on stderr.

On a terminal the line is redrawn in place with `\\r` (at most every `tty_interval` seconds); in a
log or CI it prints an ordinary line every `log_interval` seconds, so output stays readable. The
stream and the clock are injected so the formatting is testable without a terminal or sleeping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

MB = 1_000_000
MIB = 1 << 20


def format_bar(done: int, total: int, width: int = 24) -> str:
    fraction = 1.0 if total == 0 else min(done / total, 1.0)
    filled = int(round(fraction * width))
    return "[" + "#" * filled + "-" * (width - filled) + f"] {fraction * 100:5.1f}%"


def format_progress(done: int, total: int, fetched: int, seconds: float, shards_done: int, shards: int) -> str:
    """`done` counts reused bytes too; throughput is over bytes actually fetched."""
    rate = fetched / seconds / MB if seconds > 0 else 0.0
    return (
        f"{format_bar(done, total)} {done / MIB:,.1f}/{total / MIB:,.1f} MiB"
        f"  {rate:7.1f} MB/s  shards {shards_done}/{shards}"
    )


@dataclass
class Progress:
    total: int
    shards: int
    stream: TextIO
    is_tty: bool = False
    clock: Callable[[], float] = time.monotonic
    tty_interval: float = 0.1
    log_interval: float = 5.0
    enabled: bool = True  # False: count, never draw (library use, quiet runs)
    done: int = 0
    fetched: int = 0  # bytes received this run, discarded ones included
    reused_bytes: int = 0  # bytes found on disk from an earlier run
    shards_done: int = 0
    started: float = field(default=0.0)
    _last: float = field(default=float("-inf"), repr=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def reused(self, size: int, shards: int = 1) -> None:
        self.done += size
        self.reused_bytes += size
        self.shards_done += shards

    def advance(self, size: int) -> None:
        self.done += size
        self.fetched += size
        self._maybe_draw()

    def rewind(self, size: int) -> None:
        """Bytes thrown away (a corrupt shard refetched) no longer count as done."""
        self.done -= size

    def shard_verified(self) -> None:
        self.shards_done += 1
        self._maybe_draw()

    @property
    def seconds(self) -> float:
        return self.clock() - self.started

    def line(self) -> str:
        return format_progress(self.done, self.total, self.fetched, self.seconds, self.shards_done, self.shards)

    def _maybe_draw(self) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if now - self._last < (self.tty_interval if self.is_tty else self.log_interval):
            return
        self._last = now
        self.draw()

    def draw(self) -> None:
        if self.is_tty:
            self.stream.write("\r" + self.line())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """Leave the terminal on a fresh line after the last redraw."""
        if not self.enabled:
            return
        self.draw()
        if self.is_tty:
            self.stream.write("\n")
            self.stream.flush()
