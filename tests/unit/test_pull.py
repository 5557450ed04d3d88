"""`edgellm pull` against an in-process edge (`httpx.MockTransport`) that injects faults:
5xx and 429 with `Retry-After`, dropped and truncated bodies, corrupt shards, ignored ranges."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
import pytest

from edgellm_local.hub.manifest import Manifest, ManifestError
from edgellm_local.hub.progress import Progress, format_bar
from edgellm_local.hub.pull import check_arguments, Downloader, PullError
from edgellm_local.hub.resume import ResumeState, RetryPolicy, parse_content_range, parse_retry_after, range_header

BASE = "http://edge.test"
NAME = "tiny"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_model(size: int = 10_000, shard_size: int = 4096, seed: int = 1) -> tuple[bytes, dict[str, bytes]]:
    """A model and every object of its publication, keyed by URL path (as /tmp/manifest.md)."""
    model = b"GGUF" + bytes((i * 31 + seed) % 251 for i in range(size - 4))
    objects: dict[str, bytes] = {}
    shards = []
    for index, offset in enumerate(range(0, size, shard_size)):
        data = model[offset : offset + shard_size]
        shards.append({"index": index, "offset": offset, "size": len(data), "sha256": sha(data), "path": f"blobs/sha256-{sha(data)}"})
        objects[f"/models/{NAME}/blobs/sha256-{sha(data)}"] = data
    files = []
    for path, body in [("tokenizer.json", b'{"model": {}}'), ("tokenizer_config.json", b"{}"), ("config.json", b'{"a": 1}')]:
        files.append({"path": path, "size": len(body), "sha256": sha(body), "content_type": "application/json"})
        objects[f"/models/{NAME}/{path}"] = body
    manifest = {
        "schema": "edgellm.manifest/1",
        "name": NAME,
        "model": {"file": "model.gguf", "size": size, "sha256": sha(model)},
        "shard_size": shard_size,
        "shards": shards,
        "files": files,
    }
    objects[f"/models/{NAME}/manifest.json"] = json.dumps(manifest).encode()
    return model, objects


class ChunkedStream(httpx.AsyncByteStream):
    """A body that arrives in 1000-byte pieces, as from a socket, then fails like a reset
    connection (or just ends, if `error` is None)."""

    def __init__(self, data: bytes, error: Exception | None) -> None:
        self.data, self.error = data, error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self.data), 1000):
            yield self.data[i : i + 1000]
        if self.error:
            raise self.error


Fault = Callable[[httpx.Request, bytes], "httpx.Response | None"]


@dataclass
class FakeEdge:
    """Serves `objects` with single-range support; `fault` may replace any response."""

    objects: dict[str, bytes]
    fault: Fault | None = None
    requests: list[httpx.Request] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        body = self.objects.get(request.url.path)
        if body is None:
            return httpx.Response(404, json={"error": {"message": "no such artifact"}})
        if self.fault and (response := self.fault(request, body)) is not None:
            return response
        return serve(request, body)

    def blob_requests(self) -> list[httpx.Request]:
        return [r for r in self.requests if "/blobs/" in r.url.path]

    def requested(self, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path == path]


def serve(request: httpx.Request, body: bytes, stream: Callable[[bytes], httpx.AsyncByteStream] | None = None) -> httpx.Response:
    stream = stream or (lambda data: ChunkedStream(data, None))
    rng = request.headers.get("range")
    if not rng:
        return httpx.Response(200, stream=stream(body))
    first, last = rng.removeprefix("bytes=").split("-")
    start, end = int(first), min(int(last), len(body) - 1)
    if start >= len(body):
        return httpx.Response(416, headers={"content-range": f"bytes */{len(body)}"})
    part = body[start : end + 1]
    headers = {"content-range": f"bytes {start}-{end}/{len(body)}"}
    return httpx.Response(206, headers=headers, stream=stream(part))


@dataclass
class Harness:
    edge: FakeEdge
    out: Path
    sleeps: list[float] = field(default_factory=list)
    stderr: io.StringIO = field(default_factory=io.StringIO)

    async def pull(self, parallel: int = 2, retry: RetryPolicy = RetryPolicy(), name: str = NAME, **options: Any) -> Any:
        async def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)

        transport = httpx.MockTransport(self.edge.handle)
        async with httpx.AsyncClient(transport=transport) as client:
            downloader = Downloader(client, parallel=parallel, chunk_size=1500, retry=retry, sleep=sleep, rand=lambda: 0.0, stderr=self.stderr, **options)
            return await downloader.pull(BASE, name, self.out)


@pytest.fixture
def model_and_objects() -> tuple[bytes, dict[str, bytes]]:
    return build_model()


def harness(tmp_path: Path, objects: dict[str, bytes], fault: Fault | None = None) -> Harness:
    return Harness(FakeEdge(dict(objects), fault), tmp_path / "out")


def shard_paths(objects: dict[str, bytes]) -> list[str]:
    manifest = json.loads(objects[f"/models/{NAME}/manifest.json"])
    return [f"/models/{NAME}/{s['path']}" for s in manifest["shards"]]


# --- the happy path ---------------------------------------------------------------------------


async def test_pull_writes_the_model_and_its_files_verified(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    h = harness(tmp_path, objects)
    result = await h.pull()
    assert (h.out / "model.gguf").read_bytes() == model
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "manifest.json"):
        assert (h.out / name).read_bytes() == objects[f"/models/{NAME}/{name}"]
    assert sorted(p.name for p in h.out.iterdir()) == ["config.json", "manifest.json", "model.gguf", "tokenizer.json", "tokenizer_config.json"]
    assert [r.headers["range"] for r in h.edge.blob_requests()] == ["bytes=0-4095", "bytes=0-4095", "bytes=0-1807"]
    assert (result.size, result.fetched, result.shards, result.shards_reused) == (10_000, 10_000, 3, 0)
    assert h.sleeps == []


async def test_a_second_pull_of_a_complete_model_fetches_nothing_but_the_manifest(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    h = harness(tmp_path, objects)
    await h.pull()
    h.edge.requests.clear()
    result = await h.pull()
    assert [r.url.path for r in h.edge.requests] == [f"/models/{NAME}/manifest.json"]
    assert (result.fetched, result.shards_reused) == (0, 3)
    assert (h.out / "model.gguf").read_bytes() == model


# --- retries ----------------------------------------------------------------------------------


def fail_first(times: int, status: int, headers: dict[str, str] | None = None, only: str = "/blobs/") -> Fault:
    count = {"n": 0}

    def fault(request: httpx.Request, body: bytes) -> httpx.Response | None:
        if only in request.url.path and count["n"] < times:
            count["n"] += 1
            return httpx.Response(status, headers=headers or {}, json={"error": {"message": "busy"}})
        return None

    return fault


async def test_503_with_retry_after_waits_as_told(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    h = harness(tmp_path, objects, fail_first(2, 503, {"retry-after": "7"}))
    await h.pull(parallel=1)
    assert h.sleeps == [7.0, 7.0]
    assert (h.out / "model.gguf").read_bytes() == model
    assert "HTTP 503; retrying in 7.0 s" in h.stderr.getvalue()


async def test_429_is_retried_and_the_manifest_is_retried_too(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    h = harness(tmp_path, objects, fail_first(1, 429, {"retry-after": "2"}, only="manifest.json"))
    await h.pull()
    assert h.sleeps == [2.0]
    assert (h.out / "model.gguf").read_bytes() == model


async def test_5xx_backoff_is_exponential_capped_and_bounded(tmp_path: Path, model_and_objects: Any) -> None:
    _, objects = model_and_objects
    h = harness(tmp_path, objects, fail_first(100, 502))
    policy = RetryPolicy(attempts=5, base_delay=1.0, max_delay=4.0)
    with pytest.raises(PullError, match=r"giving up after 5 failed attempts; last: HTTP 502"):
        await h.pull(parallel=1, retry=policy)
    assert h.sleeps == [0.5, 1.0, 2.0, 2.0]  # rand=0: half of 1, 2, 4, 4 (capped)


@pytest.mark.parametrize(
    "attempt, retry_after, rand, expected",
    [
        (1, None, 0.0, 0.25),
        (1, None, 0.999, 0.49975),
        (3, None, 0.0, 1.0),
        (10, None, 1.0, 20.0),  # capped at max_delay
        (1, 7.0, 0.5, 7.0),  # the server's word wins
        (1, 9999.0, 0.5, 300.0),  # within reason
        (1, -3.0, 0.5, 0.0),
    ],
)
def test_retry_delay(attempt: int, retry_after: float | None, rand: float, expected: float) -> None:
    assert RetryPolicy(base_delay=0.5, max_delay=20.0).delay(attempt, retry_after, rand) == pytest.approx(expected)


@pytest.mark.parametrize(
    "value, expected",
    [(None, None), ("5", 5.0), (" 12 ", 12.0), ("soon", None), ("-1", None), ("Thu, 01 Jan 1970 00:01:40 GMT", 40.0), ("Thu, 01 Jan 1970 00:00:10 GMT", 0.0)],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, now=60.0) == expected


@pytest.mark.parametrize(
    "value, expected",
    [("bytes 0-9/10", (0, 9, 10)), ("bytes 5-9/*", (5, 9, None)), ("bytes */10", None), ("items 0-1/2", None), (None, None), ("bytes 1-2/3 junk", None)],
)
def test_parse_content_range(value: str | None, expected: Any) -> None:
    assert parse_content_range(value) == expected


def test_range_header_asks_for_the_rest() -> None:
    assert range_header(0, 10) == "bytes=0-9"
    assert range_header(7, 10) == "bytes=7-9"


def dropping(after: int, error: Exception | None, times: int = 1, index: int = 0, paths: list[str] | None = None) -> Fault:
    """Shard `index` breaks `after` bytes into its body, `times` times."""
    count = {"n": 0}

    def fault(request: httpx.Request, body: bytes) -> httpx.Response | None:
        if paths and request.url.path == paths[index] and count["n"] < times:
            count["n"] += 1
            return serve(request, body, stream=lambda part: ChunkedStream(part[:after], error))
        return None

    return fault


@pytest.mark.parametrize("error", [httpx.ReadError("connection reset by peer"), None], ids=["reset", "truncated"])
async def test_a_broken_body_resumes_with_a_range_from_the_bytes_received(tmp_path: Path, model_and_objects: Any, error: Exception | None) -> None:
    model, objects = model_and_objects
    paths = shard_paths(objects)
    h = harness(tmp_path, objects, dropping(2500, error, paths=paths))
    await h.pull(parallel=1)
    assert [r.headers["range"] for r in h.edge.requested(paths[0])] == ["bytes=0-4095", "bytes=2500-4095"]
    assert (h.out / "model.gguf").read_bytes() == model
    assert h.sleeps == [0.25]


async def test_retries_that_make_progress_do_not_use_up_the_attempts(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    paths = shard_paths(objects)
    h = harness(tmp_path, objects, dropping(1000, httpx.ReadError("reset"), times=3, paths=paths))
    await h.pull(parallel=1, retry=RetryPolicy(attempts=2))
    ranges = [r.headers["range"] for r in h.edge.requested(paths[0])]
    assert ranges == ["bytes=0-4095", "bytes=1000-4095", "bytes=2000-4095", "bytes=3000-4095"]
    assert (h.out / "model.gguf").read_bytes() == model


async def test_connect_errors_are_retried(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    count = {"n": 0}

    def fault(request: httpx.Request, body: bytes) -> httpx.Response | None:
        if "/blobs/" in request.url.path and count["n"] < 2:
            count["n"] += 1
            raise httpx.ConnectError("connection refused", request=request)
        return None

    h = harness(tmp_path, objects, fault)
    await h.pull(parallel=1)
    assert h.sleeps == [0.25, 0.5]
    assert "ConnectError: connection refused" in h.stderr.getvalue()
    assert (h.out / "model.gguf").read_bytes() == model


async def test_a_server_that_ignores_range_on_resume_is_read_from_the_start(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    paths = shard_paths(objects)
    broke = dropping(2500, httpx.ReadError("reset"), paths=paths)

    def fault(request: httpx.Request, body: bytes) -> httpx.Response | None:
        if request.headers.get("range", "").startswith("bytes=2500-"):
            return serve(httpx.Request("GET", request.url), body)
        return broke(request, body)

    h = harness(tmp_path, objects, fault)
    result = await h.pull(parallel=1)
    assert (h.out / "model.gguf").read_bytes() == model
    assert result.fetched == 10_000 + 2500


# --- corruption -------------------------------------------------------------------------------


def corrupting(times: int, index: int, paths: list[str], how: Callable[[bytes], bytes] = lambda b: b[:-1] + bytes([b[-1] ^ 1])) -> Fault:
    count = {"n": 0}

    def fault(request: httpx.Request, body: bytes) -> httpx.Response | None:
        if request.url.path == paths[index] and count["n"] < times:
            count["n"] += 1
            return serve(request, how(body))
        return None

    return fault


async def test_a_corrupt_shard_is_reported_discarded_and_fetched_again(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    paths = shard_paths(objects)
    h = harness(tmp_path, objects, corrupting(1, 1, paths))
    result = await h.pull()
    assert (h.out / "model.gguf").read_bytes() == model
    second = h.edge.requested(paths[1])
    assert [r.headers["range"] for r in second] == ["bytes=0-4095", "bytes=0-4095"]
    assert second[1].headers["cache-control"] == "no-cache"
    assert "shard 1 (blobs/sha256-" in h.stderr.getvalue() and "is corrupt (sha256 is" in h.stderr.getvalue()
    assert (result.fetched, result.reused) == (10_000 + 4096, 0)  # the discarded copy was fetched too


@pytest.mark.parametrize(
    "how, reason",
    [
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "sha256 is"),
        (lambda b: b + b"extra", "has 4101 bytes, the manifest says 4096"),
        (lambda b: b[:100], "has 100 bytes, the manifest says 4096"),
    ],
    ids=["flipped-bit", "longer", "shorter"],
)
async def test_a_shard_that_stays_corrupt_fails_the_pull_clearly(tmp_path: Path, model_and_objects: Any, how: Any, reason: str) -> None:
    _, objects = model_and_objects
    paths = shard_paths(objects)
    h = harness(tmp_path, objects, corrupting(100, 0, paths, how))
    with pytest.raises(PullError, match="shard 0 .* is corrupt on the server") as info:
        await h.pull()
    assert reason in str(info.value)
    assert len(h.edge.requested(paths[0])) == 3
    assert not (h.out / "model.gguf").exists() and not (h.out / "manifest.json").exists()


async def test_a_manifest_whose_shards_do_not_make_the_model_is_caught(tmp_path: Path, model_and_objects: Any) -> None:
    _, objects = model_and_objects
    key = f"/models/{NAME}/manifest.json"
    manifest = json.loads(objects[key])
    manifest["model"]["sha256"] = "0" * 64
    objects = {**objects, key: json.dumps(manifest).encode()}
    h = harness(tmp_path, objects)
    with pytest.raises(PullError, match="whole file's sha256 does not match"):
        await h.pull(verify_full=True)
    assert not (h.out / "model.gguf").exists() and not (h.out / "model.gguf.partial").exists()


async def test_every_byte_is_hashed_once_unless_verify_full(tmp_path: Path, model_and_objects: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shard is checked as it arrives; only --verify-full reads the file back for a second hash."""
    import edgellm_local.hub.model_download as download_module

    model, objects = model_and_objects
    reread: list[int] = []
    real = download_module.hash_range

    def spy(fd: int, offset: int, length: int, hasher: Any, *args: Any) -> Any:
        reread.append(length)
        return real(fd, offset, length, hasher, *args)

    monkeypatch.setattr(download_module, "hash_range", spy)
    h = harness(tmp_path, objects)
    await h.pull()
    assert (h.out / "model.gguf").read_bytes() == model and reread == []
    shutil.rmtree(h.out)
    await harness(tmp_path, objects).pull(verify_full=True)
    assert sum(reread) == len(model)


async def test_limit_rate_paces_the_whole_download(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    now = [0.0]
    h = harness(tmp_path, objects)

    def clock() -> float:
        return now[0]

    async def sleep(seconds: float) -> None:
        h.sleeps.append(seconds)
        now[0] += seconds

    transport = httpx.MockTransport(h.edge.handle)
    async with httpx.AsyncClient(transport=transport) as client:
        downloader = Downloader(client, parallel=2, chunk_size=1500, sleep=sleep, clock=clock, stderr=h.stderr, limit_rate=1000.0)
        await downloader.pull(BASE, NAME, h.out)
    assert (h.out / "model.gguf").read_bytes() == model
    # 10,000 bytes at 1,000 B/s with a quarter-second burst: 9.75 s of waiting, never much more
    assert 9.7 <= now[0] <= 9.8, now[0]


# --- resume -----------------------------------------------------------------------------------


async def test_an_interrupted_pull_resumes_without_refetching_verified_shards(tmp_path: Path) -> None:
    model, objects = build_model(size=40_000, shard_size=4096)
    paths = shard_paths(objects)  # 10 shards

    def die_on_shard_6(request: httpx.Request, body: bytes) -> httpx.Response | None:
        if request.url.path == paths[6]:
            return httpx.Response(404)
        return None

    h = harness(tmp_path, objects, die_on_shard_6)
    with pytest.raises(PullError, match="not found"):
        await h.pull(parallel=1)
    state = json.loads((h.out / "model.gguf.partial.state").read_text())
    assert state["verified"] == [0, 1, 2, 3, 4, 5]

    h.edge.fault = None
    h.edge.requests.clear()
    result = await h.pull(parallel=3)
    assert sorted(r.url.path for r in h.edge.blob_requests()) == sorted(paths[6:])
    assert (result.shards_reused, result.fetched) == (6, 40_000 - 6 * 4096)
    assert (h.out / "model.gguf").read_bytes() == model
    assert not (h.out / "model.gguf.partial.state").exists()


async def test_a_partly_received_shard_resumes_from_its_length(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    paths = shard_paths(objects)
    h = harness(tmp_path, objects, dropping(3000, httpx.ReadError("reset"), times=99, index=1, paths=paths))
    with pytest.raises(PullError, match="giving up"):
        await h.pull(parallel=1, retry=RetryPolicy(attempts=1))
    assert json.loads((h.out / "model.gguf.partial.state").read_text())["received"] == {"1": 3000}

    h.edge.fault = None
    h.edge.requests.clear()
    result = await h.pull(parallel=2)
    assert [(r.url.path, r.headers["range"]) for r in h.edge.blob_requests()] == [(paths[1], "bytes=3000-4095"), (paths[2], "bytes=0-1807")]
    assert result.fetched == 10_000 - 4096 - 3000
    assert (h.out / "model.gguf").read_bytes() == model


async def test_a_state_file_for_another_model_is_ignored(tmp_path: Path, model_and_objects: Any) -> None:
    model, objects = model_and_objects
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.gguf.partial").write_bytes(b"\0" * 10_000)
    (out / "model.gguf.partial.state").write_text(json.dumps({"model_sha256": "f" * 64, "verified": [0, 1, 2], "received": {}}))
    h = harness(tmp_path, objects)
    await h.pull()
    assert len(h.edge.blob_requests()) == 3
    assert (out / "model.gguf").read_bytes() == model


def test_resume_state_trusts_only_what_fits_the_manifest(model_and_objects: Any) -> None:
    _, objects = model_and_objects
    manifest = Manifest.parse(objects[f"/models/{NAME}/manifest.json"])
    digest = manifest.model.sha256
    state = ResumeState(digest, {0}, {1: 100})
    assert ResumeState.from_json(state.to_json(), manifest) == state
    for raw in ["", "[]", '{"model_sha256": 1}', json.dumps({"model_sha256": digest, "verified": [7], "received": {}})]:
        assert ResumeState.from_json(raw, manifest) == ResumeState(digest)
    odd = json.dumps({"model_sha256": digest, "verified": [0], "received": {"0": 5, "1": 4096, "2": 9}})
    assert ResumeState.from_json(odd, manifest) == ResumeState(digest, {0}, {2: 9})


# --- manifests and other refusals ---------------------------------------------------------------


def edited(change: Callable[[dict[str, Any]], Any]) -> bytes:
    _, objects = build_model()
    manifest = json.loads(objects[f"/models/{NAME}/manifest.json"])
    change(manifest)
    return json.dumps(manifest).encode()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = manifest
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return change


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"not json", "not valid JSON"),
        (b"[]", "manifest must be an object"),
        (edited(_set("schema", "edgellm.manifest/2")), "manifest.schema must be"),
        (edited(_set("name", "../etc")), "not a valid model name"),
        (edited(_set("model.file", "../model.gguf")), "must be a plain file name"),
        (edited(_set("model.file", "sub/model.gguf")), "must be a plain file name"),
        (edited(_set("files.0.path", "../../.bashrc")), "manifest.files[0].path '../../.bashrc' must be a plain file name"),
        (edited(_set("files.0.path", "manifest.json")), "file names collide"),
        (edited(_set("model.size", -1)), "manifest.model.size must be a non-negative integer"),
        (edited(_set("model.size", True)), "manifest.model.size must be a non-negative integer"),
        (edited(_set("model.sha256", "ABC")), "manifest.model.sha256 must be 64 lowercase hex"),
        (edited(_set("shards.1.index", 2)), "manifest.shards[1].index is 2"),
        (edited(_set("shards.1.offset", 4000)), "manifest.shards[1].offset is 4000, expected 4096"),
        (edited(_set("shards.1.path", "blobs/sha256-" + "0" * 64)), "manifest.shards[1].path must be"),
        (edited(_set("shards.2.size", 2000)), "shards add up to 10192 bytes but model.size is 10000"),
        (edited(_set("shard_size", 100)), "is not in 1..shard_size"),
        (edited(_set("shards", {})), "manifest.shards must be a list"),
        (edited(_set("files.0", "tokenizer.json")), "manifest.files[0] must be an object"),
    ],
)
def test_malformed_manifests_are_rejected_by_field(raw: bytes, message: str) -> None:
    with pytest.raises(ManifestError) as info:
        Manifest.parse(raw)
    assert message in str(info.value)


async def test_a_malformed_manifest_stops_the_pull_before_any_write(tmp_path: Path, model_and_objects: Any) -> None:
    _, objects = model_and_objects
    objects = {**objects, f"/models/{NAME}/manifest.json": edited(_set("files.0.path", "../evil"))}
    h = harness(tmp_path, objects)
    with pytest.raises(PullError, match=r"manifest.json: manifest.files\[0\].path '../evil' must be a plain file name"):
        await h.pull()
    assert not (tmp_path / "evil").exists() and not h.out.exists()
    assert [r.url.path for r in h.edge.requests] == [f"/models/{NAME}/manifest.json"]


async def test_an_unknown_model_is_a_clear_error_listing_the_published_names(tmp_path: Path) -> None:
    index = json.dumps({"object": "list", "data": [{"name": "smollm2-135m"}, {"name": "other"}]}).encode()
    h = harness(tmp_path, {"/models": index})
    with pytest.raises(PullError, match=r"no model 'tiny' is published on http://edge.test; published: smollm2-135m, other$"):
        await h.pull()
    empty = harness(tmp_path, {"/models": b'{"object": "list", "data": []}'})
    with pytest.raises(PullError, match="publishes no models yet"):
        await empty.pull()


@pytest.mark.parametrize("name, message", [("Tiny", "lowercase"), ("../x", "lowercase"), ("", "empty"), ("a" * 65, "longer than 64")])
async def test_a_bad_model_name_is_refused_before_any_request(tmp_path: Path, name: str, message: str) -> None:
    h = harness(tmp_path, {})
    with pytest.raises(PullError, match=message):
        await h.pull(name=name)
    assert h.edge.requests == []


async def test_out_pointing_at_a_file_is_a_clear_error(tmp_path: Path, model_and_objects: Any) -> None:
    h = harness(tmp_path, model_and_objects[1])
    h.out.write_text("not a directory")
    with pytest.raises(PullError, match="is a file; give a directory"):
        await h.pull()
    h.out = tmp_path / "out" / "deeper"
    with pytest.raises(PullError, match="is a file, not a directory"):
        await h.pull()
    assert h.edge.requests == []


@pytest.mark.parametrize("url", ["127.0.0.1:8787", "localhost", "ftp://edge.test", "http://"])
def test_a_url_without_a_scheme_or_host_is_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(PullError, match="is not an edge URL"):
        check_arguments(url, NAME, tmp_path / "out")


async def test_a_refused_connection_fails_at_once_without_retrying(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("cannot connect to edge.test:80: [Errno 111] Connection refused", request=request)

    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(PullError, match="cannot reach the edge: .*Connection refused; is it running"):
            await Downloader(client, sleep=sleep, stderr=io.StringIO()).pull(BASE, NAME, tmp_path / "out")
    assert sleeps == []


def test_the_command_reports_pull_errors_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgellm_local.cli import main

    (tmp_path / "file").write_text("x")
    assert main(["pull", "http://127.0.0.1:9", NAME, "--out", str(tmp_path / "file")]) == 1
    assert main(["pull", "127.0.0.1:8787", NAME, "--out", str(tmp_path / "o")]) == 1
    assert main(["pull", "http://127.0.0.1:9", NAME, "--out", str(tmp_path / "o"), "--limit-rate", "fast"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("edgellm pull: error: --out") and "is a file" in err[0]
    assert "is not an edge URL" in err[1] and "--limit-rate 'fast'" in err[2]
    assert len(err) == 3 and "Traceback" not in "".join(err)


async def test_a_manifest_for_another_name_is_refused(tmp_path: Path, model_and_objects: Any) -> None:
    _, objects = model_and_objects
    objects = {**objects, f"/models/{NAME}/manifest.json": edited(_set("name", "other"))}
    with pytest.raises(PullError, match="describes 'other', not 'tiny'"):
        await harness(tmp_path, objects).pull()


async def test_memory_per_stream_is_bounded_by_the_chunk_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes land in chunk-sized pieces however large the shard: nothing holds a shard."""
    model, objects = build_model(size=200_000, shard_size=100_000)
    h = harness(tmp_path, objects)
    import edgellm_local.hub.object_fetch as pull_module

    sizes: list[int] = []
    real = pull_module._write_and_hash

    def spy(fd: int, pieces: list[Any], offset: int, hasher: Any) -> int:
        sizes.append(sum(map(len, pieces)))
        return real(fd, pieces, offset, hasher)

    monkeypatch.setattr(pull_module, "_write_and_hash", spy)
    await h.pull()
    assert (h.out / "model.gguf").read_bytes() == model
    assert max(sizes) < 1500 + 1000 and sum(sizes) >= 200_000


# --- progress -----------------------------------------------------------------------------------


@pytest.mark.parametrize("done, total, bar", [(0, 100, "[----------]   0.0%"), (50, 100, "[#####-----]  50.0%"), (100, 100, "[##########] 100.0%"), (0, 0, "[##########] 100.0%")])
def test_format_bar(done: int, total: int, bar: str) -> None:
    assert format_bar(done, total, width=10) == bar


def test_progress_redraws_in_place_on_a_tty_and_prints_lines_in_a_log() -> None:
    now = {"t": 0.0}
    tty, log = io.StringIO(), io.StringIO()
    bars = [Progress(4 << 20, 4, s, is_tty=(s is tty), clock=lambda: now["t"], log_interval=5.0) for s in (tty, log)]
    for _ in range(4):
        now["t"] += 1.0
        for bar in bars:
            bar.advance(1 << 20)
    assert tty.getvalue().count("\r") == 4 and "\n" not in tty.getvalue()
    assert log.getvalue().count("\n") == 1  # the first draw; the next is due after 5 s
    assert "4.0/4.0 MiB" in bars[0].line() and "1.0 MB/s" in bars[0].line()


def test_a_dead_port_fails_at_once_through_the_real_transport(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listening: one line, exit 1, no retries (the old pull retried for ~12 s)."""
    import socket

    from edgellm_local.cli import main

    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["pull", f"http://127.0.0.1:{port}", NAME, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the edge: cannot connect to 127.0.0.1:{port}" in err and "is it running" in err
    assert "retrying" not in err and "Traceback" not in err
