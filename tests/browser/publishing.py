"""Publishing a real model's artifacts into a local edge's R2 for the browser tests.

The tokenizer page is only worth testing against a real vocabulary, so this publishes
SmolLM2-135M (the GGUF the local edge runs by default): `tokenizer.json` and
`tokenizer_config.json` built from the GGUF by the same code `edgellm publish` uses, the
weights as content-addressed shards, and a manifest in the agreed layout, so `GET /models`
lists the model exactly as it would after a real publish.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gguf
from tokenizers import Tokenizer

from edgellm.ports import BlobStore
from edgellm_local.gguf_tokenizer import build_tokenizer, tokenizer_config

SHARD_SIZE = 64 * 1024 * 1024
JSON = {"contentType": "application/json"}
BLOB = {"contentType": "application/octet-stream"}


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_json: bytes
    config_json: bytes

    def tokenizer(self) -> Tokenizer:
        """The Python reference the browser's ids are compared with."""
        return Tokenizer.from_str(self.tokenizer_json.decode())


def tokenizer_files(gguf_path: Path) -> TokenizerFiles:
    reader = gguf.GGUFReader(gguf_path)
    tokenizer_json = build_tokenizer(reader).to_str().encode()
    config_json = json.dumps(tokenizer_config(reader), ensure_ascii=False).encode()
    return TokenizerFiles(tokenizer_json, config_json)


def _shards(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(SHARD_SIZE):
            yield chunk


def _file_entry(name: str, data: bytes) -> dict[str, Any]:
    return {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "content_type": "application/json"}


async def publish(r2: BlobStore, name: str, gguf_path: Path, files: TokenizerFiles) -> dict[str, Any]:
    """Write `models/{name}/...` into `r2`; the manifest goes last, as it marks the model published."""
    prefix = f"models/{name}/"
    whole, shards, offset = hashlib.sha256(), [], 0
    for index, data in enumerate(_shards(gguf_path)):
        digest = hashlib.sha256(data).hexdigest()
        whole.update(data)
        await r2.put(f"{prefix}blobs/sha256-{digest}", data, http_metadata=BLOB, custom_metadata={"sha256": digest}, sha256=digest)
        shards.append({"index": index, "offset": offset, "size": len(data), "sha256": digest, "path": f"blobs/sha256-{digest}"})
        offset += len(data)
    named = {"tokenizer.json": files.tokenizer_json, "tokenizer_config.json": files.config_json}
    for file_name, data in named.items():
        await r2.put(prefix + file_name, data, http_metadata=JSON)
    manifest = {
        "schema": "edgellm.manifest/1",
        "name": name,
        "model": {"file": "model.gguf", "size": offset, "sha256": whole.hexdigest()},
        "shard_size": SHARD_SIZE,
        "shards": shards,
        "files": [_file_entry(n, d) for n, d in named.items()],
    }
    await r2.put(prefix + "manifest.json", json.dumps(manifest, indent=2).encode(), http_metadata=JSON)
    return manifest


def publish_sync(r2: BlobStore, name: str, gguf_path: Path, files: TokenizerFiles) -> dict[str, Any]:
    """`publish` from synchronous test code (on its own thread: Playwright's sync API already
    runs an event loop on the main one)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, publish(r2, name, gguf_path, files)).result()
