"""Publishing real models into a local edge's R2 for the browser tests, with `edgellm publish`.

The tokenizer page is only worth testing against a real vocabulary, so SmolLM2-135M (the GGUF
the local edge runs by default) is published exactly as a user would publish it, and the Python
reference tokenizer is built from the very `tokenizer.json` bytes the edge then serves.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Coroutine, TypeVar

from tokenizers import Tokenizer

from edgellm.ports import BlobStore
from edgellm_local.hub.publish import PublishReport, publish
from edgellm_local.hub.sinks import BlobStoreSink

T = TypeVar("T")


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_json: bytes
    config_json: bytes

    def tokenizer(self) -> Tokenizer:
        """The Python reference the browser's ids are compared with."""
        return Tokenizer.from_str(self.tokenizer_json.decode())


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine from synchronous fixtures, on its own thread, so it works whether or not
    the calling thread has a loop running (an async browser test's may be)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def publish_model(r2: BlobStore, name: str, gguf_path: Path) -> PublishReport:
    return run_sync(publish(gguf_path, name, BlobStoreSink(r2)))


async def _read(r2: BlobStore, key: str) -> bytes:
    obj = await r2.get(key)
    assert obj is not None and obj.body is not None, f"{key} was not published"
    return b"".join([chunk async for chunk in obj.body])


def published_tokenizer(r2: BlobStore, name: str) -> TokenizerFiles:
    async def read() -> TokenizerFiles:
        prefix = f"models/{name}/"
        return TokenizerFiles(await _read(r2, prefix + "tokenizer.json"), await _read(r2, prefix + "tokenizer_config.json"))

    return run_sync(read())
