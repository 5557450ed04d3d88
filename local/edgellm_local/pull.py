"""`edgellm pull BASE_URL NAME --out DIR`: a published model from an edge, verified and resumable.

The manifest names everything: the tokenizer files are fetched whole (each checked against its
SHA-256 and size), the weights shard by shard by `ModelDownload`, and `manifest.json` is written
last, so its presence in DIR means the pull completed. The HTTP client is injected (an
`httpx.AsyncClient`), so tests drive every fault through `httpx.MockTransport`; the command line
builds one on `StreamingTransport`, which moves large bodies with far less overhead than httpx's
default transport.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, TextIO

import httpx

from .fetch import CHUNK_SIZE, Fetcher, FetchTarget, PullError
from .manifest import Manifest, ManifestError
from .model_download import ModelDownload, PullResult, file_matches, preallocate
from .progress import Progress
from .resume import RetryPolicy, write_atomic
from .streaming_transport import StreamingTransport

__all__ = ["Downloader", "PullError", "PullResult", "make_client", "pull", "run"]


class Downloader:
    """Pulls models through `client`; every knob that a test needs to observe is injected."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        parallel: int = 4,
        chunk_size: int = CHUNK_SIZE,
        retry: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        stderr: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        show_progress: bool = True,
    ) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.fetcher = Fetcher(client, chunk_size=chunk_size, retry=retry, sleep=sleep, rand=rand, stderr=stderr)
        self.parallel = parallel
        self.clock = clock
        self.show_progress = show_progress

    async def pull(self, base_url: str, name: str, out: Path) -> PullResult:
        root = f"{base_url.rstrip('/')}/models/{name}/"
        raw = await self.fetcher.retrying("manifest.json", lambda: self.fetcher.get_small(root + "manifest.json"))
        try:
            manifest = Manifest.parse(raw)
        except ManifestError as exc:
            raise PullError(f"{root}manifest.json: {exc}") from None
        if manifest.name != name:
            raise PullError(f"{root}manifest.json describes {manifest.name!r}, not {name!r}")
        out.mkdir(parents=True, exist_ok=True)
        for file in manifest.files:
            await self._pull_file(root, file.path, file.size, file.sha256, out)
        result = await ModelDownload(self.fetcher, root, manifest, out, self.parallel, self._progress(manifest)).run()
        write_atomic(out / "manifest.json", raw)  # last: its presence means the pull completed
        return result

    def _progress(self, manifest: Manifest) -> Progress:
        stderr = self.fetcher.stderr
        return Progress(
            manifest.model.size,
            len(manifest.shards),
            stderr,
            is_tty=self.show_progress and stderr.isatty(),
            clock=self.clock,
            log_interval=5.0 if self.show_progress else float("inf"),
            enabled=self.show_progress,
        )

    async def _pull_file(self, root: str, path: str, size: int, sha256: str, out: Path) -> None:
        final = out / path
        if await file_matches(final, size, sha256):
            return
        partial = out / (path + ".partial")
        fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            preallocate(fd, size)
            await self.fetcher.fetch(FetchTarget(path, root + path, fd, 0, size, sha256))
        finally:
            os.close(fd)
        os.replace(partial, final)


def make_client() -> httpx.AsyncClient:
    """The command line's client. `identity`: a compressed body would not line up with byte
    ranges and shard sizes."""
    return httpx.AsyncClient(
        transport=StreamingTransport(),
        timeout=httpx.Timeout(60.0, connect=15.0),
        headers={"Accept-Encoding": "identity", "User-Agent": "edgellm-pull"},
        follow_redirects=True,
    )


async def pull(base_url: str, name: str, out: Path, parallel: int = 4, **options: Any) -> PullResult:
    async with make_client() as client:
        return await Downloader(client, parallel=parallel, **options).pull(base_url, name, out)


def run(args: Any) -> int:
    """The `edgellm pull` command: 0 on success, 1 when the pull fails, 130 when interrupted."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per shard request is noise here
    try:
        result = asyncio.run(pull(args.base_url, args.name, Path(args.out), parallel=args.parallel))
    except PullError as exc:
        print(f"edgellm pull: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nedgellm pull: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    print(result.summary(), file=sys.stderr)
    return 0
