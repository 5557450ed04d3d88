"""`edgellm publish`: the manifest describes the bytes exactly, re-publishing sends nothing, the
GGUF is read in chunks, and the wrangler and local-R2 destinations get the agreed layout."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import gguf
import pytest
from tokenizers import Tokenizer

from edgellm.ports import R2Object
from edgellm_local.cli import main
from edgellm_local.hub.gguf_tokenizer import build_tokenizer
from edgellm_local.hub.manifest import Manifest
from edgellm_local.hub.publish import PublishError, hash_weights, parse_size, publish
from edgellm_local.emulator.r2 import FileR2
from edgellm_local.hub.sinks import BlobStoreSink, FileSlice, SinkError, WranglerSink
from tests.support.tiny_gguf import write_tiny_gguf

KiB = 1024
SHARD = 64 * KiB


@dataclass
class MemoryBlobStore:
    """The slice of `BlobStore` that publishing uses, remembering what arrived and how."""

    objects: dict[str, R2Object] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)
    puts: list[str] = field(default_factory=list)
    largest_chunk: int = 0
    streamed: set[str] = field(default_factory=set)

    async def head(self, key: str) -> R2Object | None:
        return self.objects.get(key)

    async def put(self, key: str, data: bytes | AsyncIterator[bytes], *, http_metadata: dict[str, str] | None = None,
                  custom_metadata: dict[str, str] | None = None, sha256: str | None = None) -> R2Object:
        if isinstance(data, bytes):
            body = data
        else:
            self.streamed.add(key)
            parts = [chunk async for chunk in data]
            self.largest_chunk = max([self.largest_chunk, *map(len, parts)])
            body = b"".join(parts)
        assert sha256 == hashlib.sha256(body).hexdigest(), "publish must send the checksum R2 verifies"
        self.puts.append(key)
        self.data[key] = body
        self.objects[key] = R2Object(key, len(body), hashlib.md5(body).hexdigest(), 0.0, dict(http_metadata or {}),
                                     dict(custom_metadata or {}), sha256)
        return self.objects[key]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tiny GGUF padded to ~0.9 MB with random bytes, so it makes a dozen or so shards."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("publish") / "tiny.gguf", vocab="spm")
    with open(path, "ab") as f:
        f.write(os.urandom(900 * KiB - path.stat().st_size + 123))
    return path


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("text, size", [
    ("512K", 512 * KiB), ("16M", 16 * KiB**2), ("1G", KiB**3), ("1048576", 1048576), ("64m", 64 * KiB**2),
    ("16MiB", 16 * KiB**2), ("2kb", 2 * KiB), (" 7 ", 7),
])
def test_sizes_parse_in_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "0M", "-1", "1.5M", "12X", "M", "1 G B"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(PublishError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize("size, shard, chunk", [
    (10, 4, 3), (12, 4, 3), (3, 4, 1), (4, 4, 8), (1000, 100, 7), (1, 1, 1),
])
def test_shards_tile_the_file_whatever_the_sizes(tmp_path: Path, size: int, shard: int, chunk: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    weights = hash_weights(path, shard, chunk)
    assert (weights.size, weights.sha256) == (size, hashlib.sha256(data).hexdigest())
    assert [s.offset for s in weights.shards] == list(range(0, size, shard))
    for s in weights.shards:
        piece = data[s.offset : s.offset + s.size]
        assert s.size == min(shard, size - s.offset)
        assert (s.sha256, s.path) == (hashlib.sha256(piece).hexdigest(), f"blobs/sha256-{s.sha256}")
        assert b"".join(FileSlice(path, s.offset, s.size).chunks(chunk)) == piece


def test_the_manifest_describes_every_byte_published(model: Path) -> None:
    store = MemoryBlobStore()
    report = run(publish(model, "tiny-spm", BlobStoreSink(store, chunk_size=8 * KiB), shard_size=SHARD, chunk_size=8 * KiB))
    prefix = "models/tiny-spm/"
    raw = store.data[prefix + "manifest.json"]
    manifest = json.loads(raw)
    Manifest.parse(raw)  # pull's own validator accepts it
    gguf_bytes = model.read_bytes()
    assert manifest["schema"] == "edgellm.manifest/1" and manifest["name"] == "tiny-spm"
    assert manifest["model"] == {"file": "model.gguf", "size": len(gguf_bytes), "sha256": hashlib.sha256(gguf_bytes).hexdigest()}
    assert manifest["shard_size"] == SHARD and len(manifest["shards"]) == -(-len(gguf_bytes) // SHARD)
    offset = 0
    for index, shard in enumerate(manifest["shards"]):
        blob = store.data[prefix + shard["path"]]
        assert (shard["index"], shard["offset"], shard["size"]) == (index, offset, len(blob))
        assert shard["path"] == "blobs/sha256-" + shard["sha256"] == "blobs/sha256-" + hashlib.sha256(blob).hexdigest()
        assert store.objects[prefix + shard["path"]].http_metadata == {"contentType": "application/octet-stream"}
        offset += shard["size"]
    assert b"".join(store.data[prefix + s["path"]] for s in manifest["shards"]) == gguf_bytes
    assert [f["path"] for f in manifest["files"]] == ["tokenizer.json", "tokenizer_config.json", "config.json"]
    for entry in manifest["files"]:
        body = store.data[prefix + entry["path"]]
        assert (entry["size"], entry["sha256"], entry["content_type"]) == (len(body), hashlib.sha256(body).hexdigest(), "application/json")
        assert store.objects[prefix + entry["path"]].http_metadata == {"contentType": "application/json"}
    assert store.puts[-1] == prefix + "manifest.json", "the manifest goes last: what it lists is already there"
    assert (report.files, report.shards, report.uploaded_bytes, report.skipped_bytes) == (
        4, len(manifest["shards"]), sum(map(len, store.data.values())), 0)


def test_the_published_tokenizer_is_the_ggufs(model: Path) -> None:
    store = MemoryBlobStore()
    run(publish(model, "tiny-spm", BlobStoreSink(store), shard_size=SHARD))
    shipped = Tokenizer.from_str(store.data["models/tiny-spm/tokenizer.json"].decode())
    reference = build_tokenizer(gguf.GGUFReader(model))
    for text in ["Hello world", "  the\n😀 日本", "<s>[INST] hi [/INST]"]:
        assert shipped.encode(text).ids == reference.encode(text).ids
    config = json.loads(store.data["models/tiny-spm/config.json"])
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == ("llama", 2, 454)


def test_republishing_unchanged_content_uploads_nothing(model: Path) -> None:
    store = MemoryBlobStore()
    first = run(publish(model, "tiny-spm", BlobStoreSink(store), shard_size=SHARD))
    count = len(store.puts)
    again = run(publish(model, "tiny-spm", BlobStoreSink(store), shard_size=SHARD))
    assert len(store.puts) == count
    assert (again.uploaded, again.uploaded_bytes, again.skipped_bytes) == ([], 0, first.uploaded_bytes)
    before = set(store.objects)
    resharded = run(publish(model, "tiny-spm", BlobStoreSink(store), shard_size=2 * SHARD))
    files = {f"models/tiny-spm/{f}" for f in ("tokenizer.json", "tokenizer_config.json", "config.json")}
    assert files <= set(resharded.skipped) <= before  # the same tail shard (same bytes) is skipped too
    assert resharded.uploaded and all(k not in before or k.endswith("manifest.json") for k in resharded.uploaded)


def test_a_blob_with_the_wrong_bytes_under_its_name_is_replaced(model: Path) -> None:
    store = MemoryBlobStore()
    run(publish(model, "tiny-spm", BlobStoreSink(store), shard_size=SHARD))
    victim = next(k for k in store.objects if "/blobs/" in k)
    store.objects[victim].checksum_sha256 = "0" * 64
    store.objects[victim].custom_metadata = {}
    report = run(publish(model, "tiny-spm", BlobStoreSink(store), shard_size=SHARD))
    assert report.uploaded == [victim]


def test_shards_are_streamed_in_chunks_not_held_whole(model: Path) -> None:
    store = MemoryBlobStore()
    run(publish(model, "tiny-spm", BlobStoreSink(store, chunk_size=4 * KiB), shard_size=SHARD))
    blobs = {k for k in store.puts if "/blobs/" in k}
    assert blobs and blobs <= store.streamed and store.largest_chunk == 4 * KiB


def test_hashing_and_uploading_memory_is_bounded_by_the_chunk_not_the_shard(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        for _ in range(16):
            f.write(os.urandom(512 * KiB))  # 8 MiB, two 4 MiB shards

    async def upload_all(shards: Any) -> None:
        sink = BlobStoreSink(DiscardingStore(), chunk_size=64 * KiB)
        for s in shards:
            await sink.put(f"k/{s.path}", FileSlice(path, s.offset, s.size), content_type="x", sha256=s.sha256)

    tracemalloc.start()
    try:
        weights = hash_weights(path, 4 * 1024 * KiB, chunk_size=64 * KiB)
        run(upload_all(weights.shards))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(weights.shards) == 2
    assert peak < 1024 * KiB, f"peak {peak} bytes while handling 4 MiB shards in 64 KiB chunks"


class DiscardingStore:
    async def head(self, key: str) -> None:
        return None

    async def put(self, key: str, data: AsyncIterator[bytes], **_: Any) -> None:
        async for _chunk in data:
            pass


@pytest.mark.parametrize("name", ["", "Upper", "a/b", "a..b", "-lead", "x" * 65])
def test_bad_names_are_refused_before_anything_is_read(model: Path, name: str) -> None:
    store = MemoryBlobStore()
    with pytest.raises(PublishError, match="invalid --name"):
        run(publish(model, name, BlobStoreSink(store)))
    assert store.puts == []


def test_a_file_that_is_not_a_gguf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"not a model")
    with pytest.raises(PublishError, match="not a GGUF"):
        run(publish(tmp_path / "x.gguf", "x", BlobStoreSink(MemoryBlobStore())))


# --- wrangler ---------------------------------------------------------------------------------


@dataclass
class FakeWrangler:
    """Stands in for `npx wrangler r2 object get|put --remote`: records every command, keeps what
    was put (reading `--file` while it still exists), and can fail puts."""

    objects: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)
    fail_puts: bool = False

    def __call__(self, args: list[str], *, capture_output: bool) -> subprocess.CompletedProcess[bytes]:
        assert capture_output and args[:4] == ["npx", "wrangler", "r2", "object"] and args[-1] == "--remote"
        self.calls.append(args)
        verb, path = args[4], args[5]
        if verb == "get":
            assert args[6] == "--pipe"
            if path not in self.objects:
                return subprocess.CompletedProcess(args, 1, b"", b"The specified key does not exist.")
            return subprocess.CompletedProcess(args, 0, self.objects[path][0], b"")
        assert verb == "put" and args[6] == "--file" and args[8] == "--content-type"
        if self.fail_puts:
            return subprocess.CompletedProcess(args, 1, b"", b"Authentication error [code: 10000]")
        self.objects[path] = (Path(args[7]).read_bytes(), args[9])
        return subprocess.CompletedProcess(args, 0, b"", b"")

    def puts(self) -> list[str]:
        return [c[5] for c in self.calls if c[4] == "put"]


def test_wrangler_uploads_the_layout_then_nothing_when_republished(model: Path) -> None:
    wrangler = FakeWrangler()
    run(publish(model, "tiny", WranglerSink("artifacts", run=wrangler), shard_size=SHARD))
    manifest = json.loads(wrangler.objects["artifacts/models/tiny/manifest.json"][0])
    assert wrangler.puts()[-1] == "artifacts/models/tiny/manifest.json"
    shards = [wrangler.objects[f"artifacts/models/tiny/{s['path']}"] for s in manifest["shards"]]
    assert b"".join(body for body, _ in shards) == model.read_bytes()
    assert {ctype for _, ctype in shards} == {"application/octet-stream"}
    assert wrangler.objects["artifacts/models/tiny/tokenizer.json"][1] == "application/json"

    wrangler.calls.clear()
    report = run(publish(model, "tiny", WranglerSink("artifacts", run=wrangler), shard_size=SHARD))
    assert report.uploaded == [] and wrangler.puts() == []
    assert {c[4] for c in wrangler.calls} == {"get"} and len(wrangler.calls) <= 2, "only the manifest is read back"


def test_wrangler_failures_name_the_object_and_the_reason(model: Path) -> None:
    with pytest.raises(SinkError, match=r"models/tiny/blobs/sha256-.*exit 1.*Authentication error"):
        run(publish(model, "tiny", WranglerSink("artifacts", run=FakeWrangler(fail_puts=True)), shard_size=SHARD))


def test_shards_too_big_for_wrangler_are_refused_before_uploading(model: Path) -> None:
    wrangler = FakeWrangler()
    with pytest.raises(PublishError, match="larger than this target accepts"):
        run(publish(model, "tiny", WranglerSink("artifacts", run=wrangler), shard_size=parse_size("512M")))
    assert wrangler.calls == []


# --- the command line, into the local edge's R2 ----------------------------------------------


def test_cli_publishes_into_the_local_edge_r2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf", vocab="bpe")
    state = tmp_path / "state"
    argv = ["publish", str(model), "--name", "tiny-bpe", "--target", "local", "--state", str(state), "--shard-size", "64K"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    second = capsys.readouterr().out
    assert "skipped 0 already there" in first
    assert "uploaded 0 objects (0 bytes)" in second

    async def read(key: str) -> bytes:
        obj = await r2.get(key)
        assert obj is not None and obj.body is not None
        return b"".join([chunk async for chunk in obj.body])

    r2 = FileR2(state / "r2")
    try:
        manifest = Manifest.parse(run(read("models/tiny-bpe/manifest.json")))
        blobs = b"".join(run(read(f"models/tiny-bpe/{s.path}")) for s in manifest.shards)
        assert blobs == model.read_bytes() and len(manifest.shards) == -(-len(blobs) // (64 * KiB))
        head = run(r2.head(f"models/tiny-bpe/{manifest.shards[0].path}"))
        assert head.checksum_sha256 == manifest.shards[0].sha256
    finally:
        r2.close()


def test_cli_reports_bad_input_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", str(tmp_path / "missing.gguf"), "--name", "m", "--state", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("edgellm: error: model file not found")
