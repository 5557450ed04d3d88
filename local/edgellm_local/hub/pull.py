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

import json
from urllib.parse import urlsplit

import httpx

from edgellm.artifacts.names import validate_name
from edgellm.errors import GatewayError

from edgellm_local.hub.object_fetch import CHUNK_SIZE, Fetcher, FetchTarget, PullError, RateLimit
from edgellm_local.hub.manifest import Manifest, ManifestError
from edgellm_local.hub.model_download import ModelDownload, PullResult, file_matches, preallocate
from edgellm_local.hub.progress import Progress
from edgellm_local.hub.resume import RetryPolicy, write_atomic
from edgellm_local.hub.streaming_transport import StreamingTransport

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
        verify_full: bool = False,
        limit_rate: float | None = None,
    ) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        rate_limit = RateLimit(limit_rate, clock=clock, sleep=sleep) if limit_rate else None
        self.fetcher = Fetcher(client, chunk_size=chunk_size, retry=retry, sleep=sleep, rand=rand, stderr=stderr, rate_limit=rate_limit)
        self.parallel = parallel
        self.clock = clock
        self.show_progress = show_progress
        self.verify_full = verify_full

    async def pull(self, base_url: str, name: str, out: Path) -> PullResult:
        check_arguments(base_url, name, out)
        root = f"{base_url.rstrip('/')}/models/{name}/"
        try:
            raw = await self.fetcher.retrying(
                "manifest.json", lambda: self.fetcher.get_small(root + "manifest.json", first_contact=True)
            )
        except PullError as exc:
            if "(HTTP 404)" in str(exc):
                raise PullError(f"no model {name!r} is published on {base_url}; {await self._published(base_url)}") from None
            raise
        try:
            manifest = Manifest.parse(raw)
        except ManifestError as exc:
            raise PullError(f"{root}manifest.json: {exc}") from None
        if manifest.name != name:
            raise PullError(f"{root}manifest.json describes {manifest.name!r}, not {name!r}")
        out.mkdir(parents=True, exist_ok=True)
        for file in manifest.files:
            await self._pull_file(root, file.path, file.size, file.sha256, out)
        result = await ModelDownload(self.fetcher, root, manifest, out, self.parallel, self._progress(manifest), self.verify_full).run()
        write_atomic(out / "manifest.json", raw)  # last: its presence means the pull completed
        return result

    async def _published(self, base_url: str) -> str:
        """What the edge does publish (`GET /models`), for the 404 message."""
        try:
            index = json.loads(await self.fetcher.get_small(f"{base_url.rstrip('/')}/models"))
            names = [entry["name"] for entry in index["data"]]
        except Exception:  # the hint is best effort: the 404 is the error
            return "its index (/models) could not be read"
        return f"published: {', '.join(names)}" if names else "it publishes no models yet (edgellm publish)"

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


def check_arguments(base_url: str, name: str, out: Path) -> None:
    """Mistakes that need no network to find, reported before any request."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PullError(f"{base_url!r} is not an edge URL: give the scheme and host, e.g. http://127.0.0.1:8787")
    try:
        validate_name(name)
    except GatewayError as exc:
        raise PullError(f"{name!r} is not a model name: {exc.message}") from None
    if out.exists() and not out.is_dir():
        raise PullError(f"--out {out} is a file; give a directory (it is created if missing)")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise PullError(f"--out {out}: {parent} is a file, not a directory")
            break


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
    check_arguments(base_url, name, out)
    async with make_client() as client:
        return await Downloader(client, parallel=parallel, **options).pull(base_url, name, out)


def run(args: Any) -> int:
    """The `edgellm pull` command: 0 on success, 1 when the pull fails, 130 when interrupted."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per shard request is noise here
    try:
        limit_rate = parse_rate(args.limit_rate) if getattr(args, "limit_rate", None) else None
        options = {"verify_full": getattr(args, "verify_full", False), "limit_rate": limit_rate}
        result = asyncio.run(pull(args.base_url, args.name, Path(args.out), parallel=args.parallel, **options))
    except PullError as exc:
        print(f"edgellm pull: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the disk: full, read-only, permissions
        print(f"edgellm pull: error: {exc.strerror or exc}: {exc.filename or args.out}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nedgellm pull: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    print(result.summary(), file=sys.stderr)
    return 0


def parse_rate(text: str) -> float:
    """`--limit-rate`: bytes per second, `500K`, `10M`, `1G` (binary units, as curl's)."""
    from edgellm_local.hub.publish import PublishError, parse_size

    try:
        return float(parse_size(text))
    except PublishError:
        raise PullError(f"--limit-rate {text!r}: expected bytes per second, e.g. 500K, 10M, 1G") from None
