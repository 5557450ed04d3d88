"""`edgellm publish`: a GGUF becomes the artifacts an edge serves (`edgellm.artifacts` routes).

    models/{name}/tokenizer.json, tokenizer_config.json, config.json   built from GGUF metadata
    models/{name}/blobs/sha256-<hex>                                  the weights, in shards
    models/{name}/manifest.json                                       written last

Blobs are named by their SHA-256, so a blob that is already there is never sent again, and the
manifest goes last so that a reader who sees a manifest can fetch everything it lists. The
weights are read twice, in chunks (once to hash, once to upload what is missing), never whole:
memory is the chunk size plus the parsed GGUF metadata (the vocabulary), whatever the model's size.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgellm.artifacts.names import JSON, OCTETS, validate_name
from edgellm.errors import GatewayError
from edgellm.ports import BindingError

from edgellm_local.llama.model_file import ModelFileError, check_gguf
from edgellm_local.hub.manifest import ArtifactFile, Manifest, ModelFile, Shard
from edgellm_local.hub.sinks import CHUNK_SIZE, ArtifactSink, BlobStoreSink, Body, FileSlice, SinkError, WranglerSink, wrangler_bucket

if TYPE_CHECKING:  # gguf, numpy and tokenizers cost ~0.4 s to import: only `publish` pays it
    import gguf

MODEL_FILE = "model.gguf"  # the name pull writes, independent of the local file's name
DEFAULT_SHARD_SIZE = 64 * 1024 * 1024
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"(\d+)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


class PublishError(Exception):
    """Publishing cannot go on; the CLI prints the message and exits non-zero."""


def parse_size(text: str) -> int:
    """`512K`, `16M`, `1G` (binary units; `16MiB`, `16mb` too) or a number of bytes."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or int(match[1]) == 0:
        raise PublishError(f"invalid size {text!r}: expected a positive number of bytes or e.g. 512K, 16M, 1G")
    return int(match[1]) * _UNITS[match[2].lower()]


@dataclass(frozen=True)
class Weights:
    size: int
    sha256: str
    shards: tuple[Shard, ...]


def hash_weights(path: Path, shard_size: int, chunk_size: int = CHUNK_SIZE) -> Weights:
    """Each shard's SHA-256 and the whole file's, in one pass of `chunk_size` reads."""
    whole, shards, offset = hashlib.sha256(), [], 0
    with open(path, "rb") as f:
        while True:
            digest, size = hashlib.sha256(), 0
            while size < shard_size and (chunk := f.read(min(chunk_size, shard_size - size))):
                digest.update(chunk)
                whole.update(chunk)
                size += len(chunk)
            if size == 0:
                break
            sha256 = digest.hexdigest()
            shards.append(Shard(len(shards), offset, size, sha256, f"blobs/sha256-{sha256}"))
            offset += size
    return Weights(offset, whole.hexdigest(), tuple(shards))


def encode_json(value: Any) -> bytes:
    """Stable bytes for a JSON file: same content, same SHA-256, nothing re-uploaded."""
    return json.dumps(value, indent=2, ensure_ascii=False).encode() + b"\n"


def model_files(reader: gguf.GGUFReader) -> dict[str, bytes]:
    from edgellm_local.hub.gguf_tokenizer import build_tokenizer, model_config, tokenizer_config

    return {
        "tokenizer.json": build_tokenizer(reader).to_str().encode(),
        "tokenizer_config.json": encode_json(tokenizer_config(reader)),
        "config.json": encode_json(model_config(reader)),
    }


def build_manifest(name: str, weights: Weights, shard_size: int, files: dict[str, bytes]) -> dict[str, Any]:
    return Manifest(
        name,
        ModelFile(MODEL_FILE, weights.size, weights.sha256),
        shard_size,
        weights.shards,
        tuple(ArtifactFile(path, len(data), hashlib.sha256(data).hexdigest(), JSON) for path, data in files.items()),
    ).to_json()


@dataclass
class PublishReport:
    name: str
    files: int = 0
    shards: int = 0
    uploaded_bytes: int = 0
    skipped_bytes: int = 0
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"published {self.name}: {self.files} files, {self.shards} shards; "
            f"uploaded {len(self.uploaded)} objects ({self.uploaded_bytes:,} bytes), "
            f"skipped {len(self.skipped)} already there ({self.skipped_bytes:,} bytes)"
        )


async def publish(
    model: Path,
    name: str,
    sink: ArtifactSink,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    chunk_size: int = CHUNK_SIZE,
    progress: Callable[[str], None] = lambda line: None,
) -> PublishReport:
    """Publish `model` as `models/{name}/...` into `sink`; blobs and files first, manifest last."""
    try:
        validate_name(name)
    except GatewayError as exc:
        raise PublishError(f"invalid --name {name!r}: {exc.message}") from None
    if shard_size > sink.max_object_size:
        raise PublishError(f"--shard-size {shard_size} is larger than this target accepts ({sink.max_object_size} bytes)")
    import gguf

    from edgellm_local.hub.gguf_tokenizer import UnsupportedVocabulary, parity_warnings

    try:
        reader = gguf.GGUFReader(check_gguf(model))
        files, warnings = model_files(reader), parity_warnings(reader)
        del reader  # the parsed metadata is the largest thing publish holds: free it before uploading
    except (ModelFileError, UnsupportedVocabulary) as exc:
        raise PublishError(str(exc)) from None
    except (ValueError, KeyError) as exc:
        raise PublishError(f"cannot read {model} as a GGUF: {exc}") from None
    weights = hash_weights(model, shard_size, chunk_size)
    manifest = encode_json(build_manifest(name, weights, shard_size, files))
    uploads: list[tuple[str, Body, int, str, str]] = [
        (s.path, FileSlice(model, s.offset, s.size), s.size, s.sha256, OCTETS) for s in weights.shards
    ]
    uploads += [(path, data, len(data), hashlib.sha256(data).hexdigest(), JSON) for path, data in files.items()]
    uploads.append(("manifest.json", manifest, len(manifest), hashlib.sha256(manifest).hexdigest(), JSON))

    report = PublishReport(name, files=len(files) + 1, shards=len(weights.shards), warnings=warnings)
    for path, body, size, sha256, content_type in uploads:
        key = f"models/{name}/{path}"
        try:
            if key in report.uploaded or key in report.skipped or await sink.exists(key, sha256, size):
                report.skipped.append(key)
                report.skipped_bytes += size
                progress(f"  have   {key} ({size:,} bytes)")
                continue
            await sink.put(key, body, content_type=content_type, sha256=sha256)
        except BindingError as exc:
            raise PublishError(f"could not store {key}: {exc}") from None
        report.uploaded.append(key)
        report.uploaded_bytes += size
        progress(f"  upload {key} ({size:,} bytes)")
    return report


def run(args: argparse.Namespace) -> int:
    """The `edgellm publish` command."""
    store = None
    try:
        if args.target == "r2":
            bucket = args.bucket or wrangler_bucket()
            if not bucket:
                raise PublishError("--target r2 needs --bucket (or an ARTIFACTS r2_bucket in wrangler.toml)")
            sink: ArtifactSink = WranglerSink(bucket)
        else:
            from edgellm_local.emulator.r2 import FileR2

            store = FileR2(Path(args.state) / "r2")
            sink = BlobStoreSink(store)
        shard_size = parse_size(args.shard_size)
        report = asyncio.run(publish(Path(args.model), args.name, sink, shard_size=shard_size, progress=print))
    except (PublishError, SinkError) as exc:
        print(f"edgellm: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if store is not None:
            store.close()
    for warning in report.warnings:
        print(f"edgellm: warning: {warning}", file=sys.stderr)
    print(report.summary(), flush=True)
    return 0


def add_parser(sub: Any) -> None:
    """Register `publish` on the CLI's subcommands."""
    pub = sub.add_parser("publish", help="publish a GGUF's tokenizer, config and content-addressed shards to R2")
    pub.add_argument("model", metavar="MODEL.gguf")
    pub.add_argument("--name", required=True, help="model name: 1-64 of [a-z0-9._-], starting with a letter or digit")
    pub.add_argument("--shard-size", default="64M", help="shard size: 512K, 16M, 1G or bytes (default 64M)")
    pub.add_argument("--target", choices=("local", "r2"), default="local", help="the local edge's R2 or a real bucket")
    pub.add_argument("--state", default=".state", help="the local edge's state directory (--target local)")
    pub.add_argument("--bucket", help="R2 bucket for --target r2 (default: ARTIFACTS in wrangler.toml)")
    pub.set_defaults(run=run)
