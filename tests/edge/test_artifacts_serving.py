"""Model artifacts served from the local edge's R2 through the real HTTP server."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
import pytest

from edgellm.ports import BindingError, BlobStore, R2Conditional, R2Object, R2Range
from edgellm_local.emulator.r2 import FileR2
from edgellm_local.emulator.server import EdgeServer

DIGEST_BLOB = os.urandom(300_000)
BLOB_HEX = hashlib.sha256(DIGEST_BLOB).hexdigest()
BLOB_PATH = f"/models/tiny/blobs/sha256-{BLOB_HEX}"
TOKENIZER = json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}}}).encode()


def put(store: BlobStore, key: str, data: bytes, content_type: str = "application/json") -> R2Object:
    return asyncio.run(store.put(key, data, http_metadata={"contentType": content_type}))


def publish(store: BlobStore, name: str = "tiny") -> None:
    manifest = {"schema": "edgellm.manifest/1", "name": name, "shards": [{"path": f"blobs/sha256-{BLOB_HEX}"}]}
    put(store, f"models/{name}/manifest.json", json.dumps(manifest).encode())
    put(store, f"models/{name}/tokenizer.json", TOKENIZER)
    put(store, f"models/{name}/tokenizer_config.json", b"{}")
    put(store, f"models/{name}/config.json", b'{"n_ctx": 2048}')
    put(store, f"models/{name}/blobs/sha256-{BLOB_HEX}", DIGEST_BLOB, "application/octet-stream")


@dataclass
class RecordingR2:
    """A BlobStore that records every call before passing it on (proves R2 was not touched)."""

    inner: BlobStore
    calls: list[tuple[str, str]] = field(default_factory=list)
    got: list[R2Object | None] = field(default_factory=list)
    before_get: Callable[[], Any] | None = None

    async def head(self, key: str) -> R2Object | None:
        self.calls.append(("head", key))
        return await self.inner.head(key)

    async def get(self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None) -> R2Object | None:
        self.calls.append(("get", key))
        if self.before_get:
            await self.before_get()
        obj = await self.inner.get(key, range=range, only_if=only_if)
        self.got.append(obj)
        return obj

    async def put(self, key: str, data: bytes | AsyncIterator[bytes], **kwargs: Any) -> R2Object:
        self.calls.append(("put", key))
        return await self.inner.put(key, data, **kwargs)

    async def delete(self, key: str) -> None:
        self.calls.append(("delete", key))
        await self.inner.delete(key)

    async def list(self, prefix: str = "", **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("list", prefix))
        return await self.inner.list(prefix, **kwargs)


class FailingR2(RecordingR2):
    def __init__(self, retryable: bool) -> None:
        super().__init__(inner=None)  # type: ignore[arg-type]
        self.retryable = retryable

    async def head(self, key: str) -> R2Object | None:
        error = BindingError("R2 head failed: 500 internal error (10001)")
        error.retryable = self.retryable
        raise error

    async def list(self, prefix: str = "", **kwargs: Any) -> dict[str, Any]:
        return await self.head(prefix)  # type: ignore[return-value]


@pytest.fixture
def bucket(tmp_path: Path) -> RecordingR2:
    store = RecordingR2(FileR2(tmp_path / "bucket"))
    publish(store.inner)
    return store


@pytest.fixture
def served(start_edge: Callable[..., EdgeServer], bucket: RecordingR2) -> EdgeServer:
    return start_edge(r2=bucket)


@pytest.fixture
def client(served: EdgeServer) -> httpx.Client:
    with httpx.Client(base_url=served.url, timeout=30) as c:
        yield c


# --- full reads, HEAD and the headers browsers and caches rely on -----------------------

FILES = [
    ("/models/tiny/manifest.json", "application/json", "public, max-age=0, must-revalidate"),
    ("/models/tiny/tokenizer.json", "application/json", "public, max-age=0, must-revalidate"),
    ("/models/tiny/tokenizer_config.json", "application/json", "public, max-age=0, must-revalidate"),
    ("/models/tiny/config.json", "application/json", "public, max-age=0, must-revalidate"),
    (BLOB_PATH, "application/octet-stream", "public, max-age=31536000, immutable"),
]


@pytest.mark.parametrize("path, content_type, cache_control", FILES)
def test_get_and_head(client: httpx.Client, bucket: RecordingR2, path: str, content_type: str, cache_control: str) -> None:
    stored = asyncio.run(bucket.inner.head(path[1:]))
    assert stored is not None
    r = client.get(path)
    assert r.status_code == 200
    assert len(r.content) == stored.size and hashlib.md5(r.content).hexdigest() == stored.etag
    assert r.headers["etag"] == f'"{stored.etag}"'
    assert r.headers["content-type"] == content_type
    assert r.headers["cache-control"] == cache_control
    assert r.headers["accept-ranges"] == "bytes"
    assert r.headers["content-length"] == str(stored.size)
    assert r.headers["access-control-allow-origin"] == "*"
    exposed = {h.strip() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"etag", "content-length", "content-range", "accept-ranges"} <= exposed

    h = client.head(path)
    assert h.status_code == 200 and h.content == b""
    assert h.headers["content-length"] == str(stored.size)
    assert h.headers["etag"] == r.headers["etag"] and h.headers["content-type"] == content_type


def test_missing_artifact_is_a_json_404(client: httpx.Client) -> None:
    for path in ("/models/tiny/blobs/sha256-" + "0" * 64, "/models/absent/manifest.json"):
        r = client.get(path)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "artifact_not_found"


# --- conditional requests --------------------------------------------------------------


def test_if_none_match(client: httpx.Client) -> None:
    etag = client.head(BLOB_PATH).headers["etag"]
    for header in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
        r = client.get(BLOB_PATH, headers={"if-none-match": header})
        assert r.status_code == 304, header
        assert r.content == b"" and r.headers["etag"] == etag
        assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert client.head(BLOB_PATH, headers={"if-none-match": header}).status_code == 304
    r = client.get(BLOB_PATH, headers={"if-none-match": '"stale"'})
    assert r.status_code == 200 and r.content == DIGEST_BLOB


def test_republished_file_gets_a_new_etag(client: httpx.Client, bucket: RecordingR2) -> None:
    old = client.get("/models/tiny/tokenizer.json").headers["etag"]
    put(bucket.inner, "models/tiny/tokenizer.json", b'{"v": 2}')
    r = client.get("/models/tiny/tokenizer.json", headers={"if-none-match": old})
    assert r.status_code == 200 and r.content == b'{"v": 2}' and r.headers["etag"] != old


# --- ranges ----------------------------------------------------------------------------

SIZE = len(DIGEST_BLOB)

# (Range header, expected (first, last) or None for the whole 200)
RANGES = [
    ("bytes=0-0", (0, 0)),
    ("bytes=0-65535", (0, 65535)),
    ("bytes=1000-199999", (1000, 199999)),
    (f"bytes={SIZE - 10}-", (SIZE - 10, SIZE - 1)),
    ("bytes=-100", (SIZE - 100, SIZE - 1)),
    (f"bytes=5-{SIZE * 2}", (5, SIZE - 1)),
    (f"bytes=-{SIZE * 2}", (0, SIZE - 1)),
    ("bytes=0-1,5-9", None),  # several ranges: the whole representation
    ("bytes=9-5", None),  # malformed: ignored
    ("lines=1-2", None),
    ("bytes=abc", None),
]


@pytest.mark.parametrize("header, expected", RANGES)
def test_range(client: httpx.Client, header: str, expected: tuple[int, int] | None) -> None:
    r = client.get(BLOB_PATH, headers={"range": header})
    assert r.headers["accept-ranges"] == "bytes"
    if expected is None:
        assert r.status_code == 200 and r.content == DIGEST_BLOB
        assert "content-range" not in r.headers
        return
    first, last = expected
    assert r.status_code == 206
    assert r.content == DIGEST_BLOB[first : last + 1]
    assert r.headers["content-range"] == f"bytes {first}-{last}/{SIZE}"
    assert r.headers["content-length"] == str(last - first + 1)
    assert r.headers["content-type"] == "application/octet-stream"


@pytest.mark.parametrize("header", [f"bytes={SIZE}-", f"bytes={SIZE + 5}-{SIZE + 10}", "bytes=-0"])
def test_unsatisfiable_range(client: httpx.Client, header: str) -> None:
    r = client.get(BLOB_PATH, headers={"range": header})
    assert r.status_code == 416
    assert r.headers["content-range"] == f"bytes */{SIZE}"
    assert r.json()["error"]["code"] == "range_not_satisfiable"


def test_if_range(client: httpx.Client) -> None:
    etag = client.head(BLOB_PATH).headers["etag"]
    r = client.get(BLOB_PATH, headers={"range": "bytes=10-19", "if-range": etag})
    assert r.status_code == 206 and r.content == DIGEST_BLOB[10:20]
    for stale in ('"other"', f"W/{etag}", "Wed, 21 Oct 2015 07:28:00 GMT"):
        r = client.get(BLOB_PATH, headers={"range": "bytes=10-19", "if-range": stale})
        assert r.status_code == 200 and r.content == DIGEST_BLOB, stale


def test_head_ignores_range(client: httpx.Client) -> None:
    r = client.head(BLOB_PATH, headers={"range": "bytes=0-9"})
    assert r.status_code == 200 and r.headers["content-length"] == str(SIZE)


def test_object_replaced_between_head_and_get_is_served_consistently(
    start_edge: Callable[..., EdgeServer], bucket: RecordingR2
) -> None:
    """The decision (size, Content-Range, ETag) and the bytes always come from one version."""
    replacement = os.urandom(5000)
    key = "models/tiny/config.json"

    async def replace_once() -> None:
        bucket.before_get = None
        await bucket.inner.put(key, replacement)

    bucket.before_get = replace_once
    server = start_edge(r2=bucket)
    r = httpx.get(f"{server.url}/{key}", headers={"range": "bytes=10-"})
    assert r.status_code == 206
    assert r.content == replacement[10:]
    assert r.headers["content-range"] == "bytes 10-4999/5000"
    assert r.headers["etag"] == f'"{hashlib.md5(replacement).hexdigest()}"'
    assert [c[0] for c in bucket.calls] == ["head", "get", "head", "get"]


# --- large objects stream --------------------------------------------------------------


def test_large_object_streams_in_full_and_in_ranges(client: httpx.Client, bucket: RecordingR2) -> None:
    size = 20 * 1024 * 1024
    data = os.urandom(size)
    key = f"models/big/blobs/sha256-{hashlib.sha256(data).hexdigest()}"

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, size, 1 << 20):
            yield data[i : i + (1 << 20)]

    asyncio.run(bucket.inner.put(key, chunks(), sha256=hashlib.sha256(data).hexdigest()))
    received = hashlib.sha256()
    pieces = 0
    with client.stream("GET", f"/{key}") as r:
        assert r.status_code == 200 and r.headers["content-length"] == str(size)
        assert "transfer-encoding" not in r.headers
        for piece in r.iter_raw():
            received.update(piece)
            pieces += 1
    assert received.hexdigest() == hashlib.sha256(data).hexdigest()
    assert pieces > 1

    step = 7 * 1024 * 1024 + 3
    parts = [client.get(f"/{key}", headers={"range": f"bytes={o}-{min(o + step, size) - 1}"}) for o in range(0, size, step)]
    assert all(p.status_code == 206 for p in parts)
    assert b"".join(p.content for p in parts) == data


# --- CORS ------------------------------------------------------------------------------


def test_cors_preflight(client: httpx.Client) -> None:
    r = client.options(BLOB_PATH, headers={
        "origin": "https://example.org",
        "access-control-request-method": "GET",
        "access-control-request-headers": "range, if-none-match",
    })
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "*"
    methods = {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
    assert {"GET", "HEAD", "OPTIONS"} <= methods
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "range" in allowed and "if-none-match" in allowed
    exposed = r.headers["access-control-expose-headers"].lower()
    for name in ("etag", "content-length", "content-range", "accept-ranges"):
        assert name in exposed


def test_wrong_method_is_405(client: httpx.Client) -> None:
    r = client.post("/models/tiny/manifest.json", content=b"{}")
    assert r.status_code == 405 and "GET" in r.headers["allow"]


# --- bad names never reach R2 ----------------------------------------------------------

# (raw path as sent on the wire, status)
BAD_PATHS = [
    ("/models/../secret/manifest.json", 400),
    ("/models/tiny/../../index.sqlite3", 400),
    ("/models/%2e%2e/manifest.json", 400),
    ("/models/%2E%2E/tiny/manifest.json", 400),
    ("/models/tiny%2F..%2F..%2Fx/manifest.json", 400),
    ("/models/tiny/blobs%2Fsha256-" + BLOB_HEX, 400),
    ("/models/tiny%5Cx/manifest.json", 400),
    ("/models/tiny\\x/manifest.json", 400),
    ("/models//manifest.json", 400),
    ("/models/" + "a" * 65 + "/manifest.json", 400),
    ("/models/TINY/manifest.json", 400),
    ("/models/ti%20ny/manifest.json", 400),
    ("/models/tiny/blobs/sha256-" + BLOB_HEX.upper(), 400),
    ("/models/tiny/blobs/sha256-" + BLOB_HEX[:-1], 400),
    ("/models/tiny/blobs/sha256-" + BLOB_HEX + "0", 400),
    ("/models/tiny/blobs/sha256-" + "g" * 64, 400),
    ("/models/tiny/model.gguf", 404),
    ("/models/tiny/blobs/" + BLOB_HEX, 404),
    ("/models/tiny/manifest.json/x", 404),
    ("/models/tiny", 404),
]


def raw_get(server: EdgeServer, path: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    """Send `path` byte for byte (httpx would normalise dot segments away)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        conn.endheaders()
        response = conn.getresponse()
        body = response.read()
        return response.status, (json.loads(body) if body else {})
    finally:
        conn.close()


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_bad_names_are_refused_before_r2(served: EdgeServer, bucket: RecordingR2, method: str) -> None:
    for path, status in BAD_PATHS:
        got, body = raw_get(served, path, method)
        assert got == status, path
        if method == "GET":
            assert body["error"]["type"] in ("invalid_request_error", "not_found_error"), path
    assert bucket.calls == []
    assert raw_get(served, "/models/tiny/manifest.json")[0] == 200  # the same server does serve good names
    assert bucket.calls


# --- failing or missing R2 -------------------------------------------------------------


def test_no_r2_bound_is_503(start_edge: Callable[..., EdgeServer]) -> None:
    server = start_edge(r2=None)
    for path in ("/models/tiny/manifest.json", "/models"):
        r = httpx.get(server.url + path)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert r.json()["error"]["code"] == "r2_unavailable"


@pytest.mark.parametrize("retryable, status", [(False, 502), (True, 503)])
def test_r2_failure_is_a_json_5xx(start_edge: Callable[..., EdgeServer], retryable: bool, status: int) -> None:
    server = start_edge(r2=FailingR2(retryable))
    for path in (BLOB_PATH, "/models"):
        r = httpx.get(server.url + path)
        assert r.status_code == status and r.headers["retry-after"]
        assert r.json()["error"]["type"] in ("upstream_error", "unavailable_error")


# --- the model index -------------------------------------------------------------------


def test_models_index_lists_published_models(client: httpx.Client, bucket: RecordingR2) -> None:
    publish(bucket.inner, "second")
    put(bucket.inner, "models/half-published/blobs/sha256-" + "1" * 64, b"x", "application/octet-stream")
    put(bucket.inner, "models/Bad Name/manifest.json", b"{}")
    r = client.get("/models")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body == {"object": "list", "data": [
        {"name": "second", "manifest": "/models/second/manifest.json"},
        {"name": "tiny", "manifest": "/models/tiny/manifest.json"},
    ]}
    assert client.get(body["data"][0]["manifest"]).json()["name"] == "second"


def test_handler_hands_the_r2_body_over_unread(make_deps: Callable[..., Any], bucket: RecordingR2) -> None:
    """The response body IS the R2 object's iterator: the core never buffers an artifact."""
    from edgellm.app import handle
    from edgellm.http import Request

    async def fetch() -> bytes:
        response = await handle(Request("GET", f"http://edge{BLOB_PATH}", {"range": "bytes=100-"}), make_deps(r2=bucket))
        assert response.status == 206 and response.is_streaming
        assert len(bucket.got) == 1 and response.body is bucket.got[0].body  # type: ignore[union-attr]
        return b"".join([chunk async for chunk in response.body])  # type: ignore[union-attr]

    assert asyncio.run(fetch()) == DIGEST_BLOB[100:]
