"""Where `edgellm publish` puts artifacts: one small interface, one class per destination.

`publish` only asks a sink two things: does this key already hold these bytes (so re-publishing
unchanged content uploads nothing), and store these bytes. Bodies are either small `bytes`
(JSON files) or a `FileSlice` of the GGUF that is read in chunks, so a shard is never held whole
in memory whatever its size.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, Protocol, Sequence

from edgellm.ports import BlobStore

CHUNK_SIZE = 1024 * 1024
R2_MAX_PUT = 5 * 1024**3 - 5 * 1024**2  # R2's single-request upload limit (5 GiB - 5 MiB)
WRANGLER_MAX_PUT = 300 * 1024**2  # `wrangler r2 object put` refuses larger files


class SinkError(Exception):
    """A destination refused or failed an upload; the message says which object and why."""


@dataclass(frozen=True)
class FileSlice:
    """`size` bytes of the file at `path` from `offset`: a shard, read only when uploaded."""

    path: Path
    offset: int
    size: int

    def chunks(self, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            left = self.size
            while left > 0:
                chunk = f.read(min(chunk_size, left))
                if not chunk:
                    raise SinkError(f"{self.path} ended {left} bytes early (was it changed while publishing?)")
                left -= len(chunk)
                yield chunk

    async def achunks(self, chunk_size: int = CHUNK_SIZE) -> AsyncIterator[bytes]:
        for chunk in self.chunks(chunk_size):
            yield chunk


Body = bytes | FileSlice


class ArtifactSink(Protocol):
    max_object_size: int

    async def exists(self, key: str, sha256: str, size: int) -> bool:
        """True when `key` is known to hold exactly these bytes (False when unsure)."""
        ...

    async def put(self, key: str, body: Body, *, content_type: str, sha256: str) -> None: ...


@dataclass
class BlobStoreSink:
    """Any `BlobStore` (the local edge's FileR2, or a test's): R2 checks the SHA-256 on put, and
    stores it, so `exists` is one `head`."""

    store: BlobStore
    chunk_size: int = CHUNK_SIZE
    max_object_size: int = R2_MAX_PUT

    async def exists(self, key: str, sha256: str, size: int) -> bool:
        obj = await self.store.head(key)
        if obj is None or obj.size != size:
            return False
        return sha256 in (obj.checksum_sha256, obj.custom_metadata.get("sha256"))

    async def put(self, key: str, body: Body, *, content_type: str, sha256: str) -> None:
        data = body if isinstance(body, bytes) else body.achunks(self.chunk_size)
        await self.store.put(
            key, data, http_metadata={"contentType": content_type}, custom_metadata={"sha256": sha256}, sha256=sha256
        )


Runner = Callable[..., "subprocess.CompletedProcess[bytes]"]


@dataclass
class WranglerSink:
    """A real R2 bucket through `wrangler r2 object get|put --remote` (wrangler holds the
    credentials). Wrangler cannot `head` an object or set custom metadata, so what is already
    there is learnt from the model's published manifest: it is written last, so every blob and
    file it lists was uploaded before it. `run` is `subprocess.run`'s signature; tests record it."""

    bucket: str
    run: Runner = subprocess.run
    command: Sequence[str] = ("npx", "wrangler")
    chunk_size: int = CHUNK_SIZE
    max_object_size: int = WRANGLER_MAX_PUT
    _manifests: dict[str, dict[str, Any] | None] = field(default_factory=dict, init=False, repr=False)

    async def _wrangler(self, *args: str) -> "subprocess.CompletedProcess[bytes]":
        return await asyncio.to_thread(self.run, [*self.command, "r2", "object", *args, "--remote"], capture_output=True)

    async def _get(self, key: str) -> bytes | None:
        done = await self._wrangler("get", f"{self.bucket}/{key}", "--pipe")
        return done.stdout if done.returncode == 0 else None

    async def _published_manifest(self, prefix: str) -> dict[str, Any] | None:
        if prefix not in self._manifests:
            raw = await self._get(prefix + "manifest.json")
            try:
                self._manifests[prefix] = json.loads(raw) if raw else None
            except ValueError:
                self._manifests[prefix] = None
        return self._manifests[prefix]

    async def exists(self, key: str, sha256: str, size: int) -> bool:
        parts = key.split("/", 2)
        if len(parts) < 3 or parts[0] != "models" or parts[2] == "manifest.json":
            body = await self._get(key)  # small objects only: the manifest itself
            return body is not None and len(body) == size and hashlib.sha256(body).hexdigest() == sha256
        manifest = await self._published_manifest(f"models/{parts[1]}/")
        if manifest is None:
            return False
        listed = [*manifest.get("shards", []), *manifest.get("files", [])]
        return any(e.get("path") == parts[2] and e.get("sha256") == sha256 and e.get("size") == size for e in listed)

    async def put(self, key: str, body: Body, *, content_type: str, sha256: str) -> None:
        size = len(body) if isinstance(body, bytes) else body.size
        if size > self.max_object_size:
            raise SinkError(f"{key} is {size} bytes; wrangler uploads at most {self.max_object_size} (use a smaller --shard-size)")
        with tempfile.TemporaryDirectory(prefix="edgellm-publish-") as tmp:
            source = Path(tmp) / "object"
            digest = hashlib.sha256()
            with open(source, "wb") as out:  # wrangler reads a whole file; copy the slice in chunks
                for chunk in [body] if isinstance(body, bytes) else body.chunks(self.chunk_size):
                    out.write(chunk)
                    digest.update(chunk)
            if digest.hexdigest() != sha256:  # R2 would check this on a binding put; wrangler cannot
                raise SinkError(f"{key}: the bytes read do not match SHA-256 {sha256} (did the file change?)")
            done = await self._wrangler("put", f"{self.bucket}/{key}", "--file", str(source), "--content-type", content_type)
        if done.returncode != 0:
            detail = (done.stderr or done.stdout or b"").decode(errors="replace").strip().splitlines()[-3:]
            raise SinkError(f"wrangler could not upload {key} (exit {done.returncode}): {' / '.join(detail)}")


def wrangler_bucket(config: Path = Path("wrangler.toml"), binding: str = "ARTIFACTS") -> str | None:
    """The bucket bound as `binding` in the project's wrangler.toml, if there is one."""
    import tomllib

    try:
        data = tomllib.loads(config.read_text())
    except (OSError, ValueError):
        return None
    for bucket in data.get("r2_buckets", []):
        if bucket.get("binding") == binding:
            return bucket.get("bucket_name")
    return None


__all__ = ["ArtifactSink", "BlobStoreSink", "Body", "FileSlice", "SinkError", "WranglerSink", "wrangler_bucket"]
