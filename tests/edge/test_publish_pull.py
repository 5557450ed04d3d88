"""`edgellm publish` a model into the local edge's R2, then `edgellm pull` it over real HTTP: bytes match,
an interrupted (SIGKILLed) pull resumes without refetching verified shards, a transient R2
failure is retried, and a blob corrupted in R2's storage is caught with a clear error."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
import pytest

from edgellm.errors import RetryAfter
from edgellm.ports import BindingError, BlobStore, R2Object
from edgellm.deps import Deps
from edgellm_local.cli import main
from edgellm_local.hub.pull import Downloader
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.hub.streaming_transport import StreamingTransport
from tests.support.tiny_gguf import write_tiny_gguf

NAME = "tiny-pull"
SHARD_SIZE = 256 * 1024


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A real (tiny) GGUF padded with random bytes to ~3 MB, so it makes a dozen shards."""
    path = write_tiny_gguf(tmp_path / "model.gguf", vocab="bpe")
    with open(path, "ab") as f:
        f.write(os.urandom(3 * 1024 * 1024 - path.stat().st_size + 12_345))
    return path


def publish(state: Path, model: Path, r2: BlobStore) -> dict[str, Any]:
    """`edgellm publish --target local` into the R2 under `state` (the one the edge serves); the
    manifest it wrote, read back from `r2`."""
    command = ["publish", str(model), "--name", NAME, "--shard-size", "256K", "--target", "local", "--state", str(state)]
    assert main(command) == 0

    async def read() -> bytes:
        obj = await r2.get(f"models/{NAME}/manifest.json")
        assert obj is not None and obj.body is not None
        return b"".join([chunk async for chunk in obj.body])

    return json.loads(asyncio.run(read()))


def blob_requests(requests: list[httpx.Request]) -> list[httpx.Request]:
    return [r for r in requests if "/blobs/" in r.url.path]


class RecordingTransport(StreamingTransport):
    """pull's own HTTP transport, remembering what was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await super().handle_async_request(request)


def pull_with(edge: EdgeServer, out: Path, transport: httpx.AsyncBaseTransport, parallel: int = 3, **options: Any) -> Any:
    async def run() -> Any:
        async with httpx.AsyncClient(transport=transport, headers={"Accept-Encoding": "identity"}) as client:
            return await Downloader(client, parallel=parallel, **options).pull(edge.url, NAME, out)

    return asyncio.run(run())


def test_publish_then_pull_gives_the_same_bytes(start_edge: Callable[..., EdgeServer], model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edge = start_edge()
    manifest = publish(tmp_path, model_file, edge.app.deps.r2)
    assert len(manifest["shards"]) == 13
    out = tmp_path / "pulled"

    assert main(["pull", edge.url, NAME, "--out", str(out), "--parallel", "3"]) == 0

    assert (out / "model.gguf").read_bytes() == model_file.read_bytes()
    for entry in manifest["files"]:
        assert hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    assert json.loads((out / "manifest.json").read_bytes()) == manifest
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "manifest.json", "model.gguf", "tokenizer.json", "tokenizer_config.json"]
    summary = capsys.readouterr().err.strip().splitlines()[-1]  # publish reports on stdout, pull on stderr
    assert summary.startswith(f"pulled {out / 'model.gguf'}: {model_file.stat().st_size:,} bytes") and "0/13 shards reused" in summary


class Interrupted(BaseException):
    """What a Ctrl-C is to the pull: not an error it may retry."""


class CuttingTransport(RecordingTransport):
    """pull's own transport that lets `budget` bytes of shard bodies through, then interrupts
    the pull mid-body: exactly where it stops is decided by the byte count, not by timing."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if "/blobs/" in request.url.path:
            response.stream = self._cut(response.stream)  # type: ignore[arg-type]
        return response

    class _Cut(httpx.AsyncByteStream):
        def __init__(self, owner: "CuttingTransport", inner: Any) -> None:
            self.owner, self.inner = owner, inner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self.inner:
                if len(chunk) >= self.owner.budget:
                    if self.owner.budget:
                        yield bytes(chunk[: self.owner.budget])
                    self.owner.budget = 0
                    raise Interrupted()
                self.owner.budget -= len(chunk)
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    def _cut(self, inner: Any) -> "CuttingTransport._Cut":
        return self._Cut(self, inner)


def test_an_interrupted_pull_resumes_a_half_received_shard_without_fetching_verified_bytes_again(
    start_edge: Callable[..., EdgeServer], model_file: Path, tmp_path: Path
) -> None:
    edge = start_edge()
    manifest = publish(tmp_path, model_file, edge.app.deps.r2)
    out = tmp_path / "pulled"
    half = SHARD_SIZE // 2 + 1234
    with pytest.raises(Interrupted):  # one stream at a time: shards 0-3 whole, then `half` bytes of shard 4
        pull_with(edge, out, CuttingTransport(4 * SHARD_SIZE + half), parallel=1)
    state = json.loads((out / "model.gguf.partial.state").read_text())
    assert state["verified"] == [0, 1, 2, 3] and state["received"] == {"4": half}
    assert (out / "model.gguf.partial").read_bytes()[: 4 * SHARD_SIZE + half] == model_file.read_bytes()[: 4 * SHARD_SIZE + half]

    transport = RecordingTransport()
    result = pull_with(edge, out, transport)

    assert (out / "model.gguf").read_bytes() == model_file.read_bytes()
    asked = {r.url.path.rsplit("/", 1)[1]: r.headers["range"] for r in blob_requests(transport.requests)}
    expected = {s["path"].split("/")[1]: f"bytes={half if s['index'] == 4 else 0}-{s['size'] - 1}" for s in manifest["shards"][4:]}
    assert asked == expected  # shards 0-3 never asked for; shard 4 only for the bytes not on disk
    assert result.shards_reused == 4
    assert result.fetched == model_file.stat().st_size - 4 * SHARD_SIZE - half
    assert not (out / "model.gguf.partial.state").exists() and not (out / "model.gguf.partial").exists()


class R2Hiccup(BindingError):
    retryable = True


class FlakyR2:
    """R2 whose first read of each of `flaky_keys` fails as a retryable error (the edge's 503)."""

    def __init__(self, inner: BlobStore, flaky_keys: set[str]) -> None:
        self.inner, self.flaky_keys = inner, set(flaky_keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def head(self, key: str) -> R2Object | None:
        if key in self.flaky_keys:
            self.flaky_keys.discard(key)
            raise R2Hiccup("R2 operation failed: 503 we are having a moment (10001)")
        return await self.inner.head(key)


def test_an_edge_503_is_retried_after_the_time_it_asks_for(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], model_file: Path, tmp_path: Path) -> None:
    deps = make_deps()
    manifest = publish(tmp_path, model_file, deps.r2)
    flaky = {f"models/{NAME}/{manifest['shards'][2]['path']}", f"models/{NAME}/manifest.json"}
    edge = start_edge(deps=replace(deps, r2=FlakyR2(deps.r2, flaky)))
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    transport = RecordingTransport()
    pull_with(edge, tmp_path / "pulled", transport, sleep=sleep)
    assert sleeps == [float(RetryAfter.DEPENDENCY)] * 2  # the edge's Retry-After, for the manifest and for shard 2
    assert (tmp_path / "pulled" / "model.gguf").read_bytes() == model_file.read_bytes()


def corrupt_in_storage(r2_root: Path, key: str, at: int) -> None:
    """Flip one byte of the object's file under FileR2, as disk rot would (ETag unchanged)."""
    with sqlite3.connect(r2_root / "index.sqlite3") as db:
        (file,) = db.execute("SELECT file FROM objects WHERE key = ?", (key,)).fetchone()
    with open(r2_root / "data" / file, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_blob_corrupted_in_r2_is_caught_with_a_clear_error(start_edge: Callable[..., EdgeServer], model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edge = start_edge()
    manifest = publish(tmp_path, model_file, edge.app.deps.r2)
    bad = manifest["shards"][5]
    corrupt_in_storage(edge.app.deps.r2.root, f"models/{NAME}/{bad['path']}", at=1000)
    out = tmp_path / "pulled"

    assert main(["pull", edge.url, NAME, "--out", str(out)]) == 1

    err = capsys.readouterr().err
    label = f"shard 5 ({bad['path']})"
    assert err.count(f"{label} is corrupt (sha256 is") == 2  # reported, discarded, fetched again...
    assert f"edgellm pull: error: {label} is corrupt on the server" in err and "after 3 downloads" in err  # ...then a clear stop
    assert "Traceback" not in err
    assert not (out / "model.gguf").exists() and not (out / "manifest.json").exists()
    state = json.loads((out / "model.gguf.partial.state").read_text())
    assert 5 not in state["verified"] and "5" not in state["received"]  # the bad bytes are dropped...
    assert state["verified"]  # ...the good shards kept for a rerun once the blob is republished
