"""Downloading a model's shards into `<file>.partial`, resumably, each verified as it arrives.

A sidecar state file (`<file>.partial.state`) records verified shards and the bytes received of
the others (saved on every verified shard and every second), so a rerun after an interruption,
even a SIGKILL, rehashes what is on disk and never fetches it again. Shards go through `parallel`
workers. Every byte is hashed once: each shard's SHA-256 as it arrives, against the digests the
manifest lists (the shards together are the file, so a file of verified shards is the file the
manifest describes). The whole-file pass costs a second hash of every byte and is only done on
request (`verify_full`, `--verify-full`): a separate task then hashes the file in shard order as
shards are verified, overlapping with the download.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgellm_local.hub.object_fetch import Fetcher, FetchTarget, PullError, hash_range
from edgellm_local.hub.manifest import Manifest, Shard
from edgellm_local.hub.progress import MB, Progress
from edgellm_local.hub.resume import ResumeState

STATE_SAVE_INTERVAL = 1.0


@dataclass(frozen=True)
class PullResult:
    path: Path
    size: int
    fetched: int
    reused: int
    shards: int
    shards_reused: int
    seconds: float

    def summary(self) -> str:
        rate = self.fetched / self.seconds / MB if self.seconds > 0 else 0.0
        return (
            f"pulled {self.path}: {self.size:,} bytes, {self.fetched:,} fetched in {self.seconds:.2f} s "
            f"({rate:.1f} MB/s), {self.shards_reused}/{self.shards} shards reused"
        )


class ModelDownload:
    """One model download into `<file>.partial`: resume state, workers, whole-file check."""

    def __init__(
        self, fetcher: Fetcher, root: str, manifest: Manifest, out: Path, parallel: int, progress: Progress, verify_full: bool = False
    ) -> None:
        self.fetcher, self.root, self.manifest, self.parallel = fetcher, root, manifest, parallel
        self.verify_full = verify_full
        self.final = out / manifest.model.file
        self.partial = out / (manifest.model.file + ".partial")
        self.state_path = out / (manifest.model.file + ".partial.state")
        self.state = ResumeState(manifest.model.sha256)
        self.targets: list[FetchTarget] = []
        self.progress = progress
        self.whole_next = 0
        self.whole_hasher: Any = hashlib.sha256()
        self.whole_ready = asyncio.Event()
        self.last_save = progress.clock()
        self.reused_shards = 0

    async def run(self) -> PullResult:
        model = self.manifest.model
        if await file_matches(self.final, model.size, model.sha256):
            self.progress.reused(model.size, len(self.manifest.shards))
            self.reused_shards = len(self.manifest.shards)
            return self._result()
        if self.partial.exists():
            self.state = ResumeState.load(self.state_path, self.manifest)
        fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            preallocate(fd, model.size)
            await self._plan(fd)
            await self._download(fd)
        except BaseException:
            self.state.received = {t.index: t.received for t in self.targets if t.index not in self.state.verified and t.received}
            self.state.save(self.state_path)
            raise
        finally:
            os.close(fd)
        if self.verify_full and self.whole_hasher.hexdigest() != model.sha256:
            self.partial.unlink(missing_ok=True)
            self.state_path.unlink(missing_ok=True)
            raise PullError(f"{self.manifest.name}: every shard matched but the whole file's sha256 does not match the manifest; the manifest is inconsistent")
        os.replace(self.partial, self.final)
        self.state_path.unlink(missing_ok=True)
        self.progress.finish()
        return self._result()

    def _result(self) -> PullResult:
        p = self.progress
        return PullResult(self.final, p.total, p.fetched, p.reused_bytes, p.shards, self.reused_shards, p.seconds)

    async def _download(self, fd: int) -> None:
        queue = deque(self.targets)
        try:
            async with asyncio.TaskGroup() as group:
                if self.verify_full:
                    group.create_task(self._hash_whole_file(fd))
                for _ in range(min(self.parallel, len(queue))):
                    group.create_task(self._work(queue))
        except BaseExceptionGroup as failures:  # the first failure is the one to report
            raise _first_leaf(failures) from None

    async def _plan(self, fd: int) -> None:
        """Targets for the shards still missing; bytes already on disk are rehashed, not refetched."""
        reused = set(self.state.verified)
        for shard in self.manifest.shards:
            if shard.index in reused:
                self.progress.reused(shard.size)
                continue
            target = FetchTarget(f"shard {shard.index} ({shard.path})", self.root + shard.path, fd, shard.offset, shard.size, shard.sha256, shard.index)
            have = self.state.received.get(shard.index, 0)
            if have:
                target.hasher = await asyncio.to_thread(hash_range, fd, shard.offset, have, hashlib.sha256())
                target.received = have
                self.progress.reused(have, shards=0)
            self.targets.append(target)
        self.reused_shards = len(reused)

    async def _work(self, queue: deque[FetchTarget]) -> None:
        while queue:
            target = queue.popleft()
            await self.fetcher.fetch(target, self._on_bytes)
            self.state.verified.add(target.index)  # type: ignore[arg-type]
            self.state.received.pop(target.index, None)  # type: ignore[arg-type]
            self.state.save(self.state_path)
            self.progress.shard_verified()
            if self.verify_full:
                self.whole_ready.set()

    def _on_bytes(self, target: FetchTarget, size: int) -> None:
        if size >= 0:
            self.progress.advance(size)
        else:
            self.progress.rewind(-size)
        self.state.received[target.index] = target.received  # type: ignore[index]
        now = self.progress.clock()
        if now - self.last_save >= STATE_SAVE_INTERVAL:
            self.last_save = now
            self.state.save(self.state_path)

    async def _hash_whole_file(self, fd: int) -> None:
        """Hash the file in shard order as shards are verified, overlapping with the download,
        so the final whole-file check costs little more than the last shards' hashing."""
        shards: tuple[Shard, ...] = self.manifest.shards
        while self.whole_next < len(shards):
            while self.whole_next < len(shards) and shards[self.whole_next].index in self.state.verified:
                shard = shards[self.whole_next]
                await asyncio.to_thread(hash_range, fd, shard.offset, shard.size, self.whole_hasher)
                self.whole_next += 1
            if self.whole_next < len(shards):
                self.whole_ready.clear()
                await self.whole_ready.wait()


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def file_matches(path: Path, size: int, sha256: str) -> bool:
    """A complete file from an earlier pull is reused when its size and SHA-256 match."""
    try:
        if path.stat().st_size != size:
            return False
    except OSError:
        return False

    def digest() -> str:
        fd = os.open(path, os.O_RDONLY)
        try:
            return hash_range(fd, 0, size, hashlib.sha256()).hexdigest()
        finally:
            os.close(fd)

    return await asyncio.to_thread(digest) == sha256


def preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size) if size else None
    except OSError:  # filesystems without fallocate: a sparse file of the right size will do
        pass
    os.ftruncate(fd, size)


