"""The model manifest (`edgellm.manifest/1`) as validated values.

`pull` writes files named by the manifest into the user's directory, so everything that becomes a
path or a URL is checked here, once: names are single safe segments, blob paths are exactly
`blobs/sha256-<the shard's digest>`, shards are contiguous and add up to the model's size. A
manifest that breaks any rule is rejected with a message naming the field, before a byte is fetched.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from edgellm.artifacts.names import is_model_name

SCHEMA = "edgellm.manifest/1"
_HEX = re.compile(r"[0-9a-f]{64}")
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")


class ManifestError(ValueError):
    """The manifest is not valid JSON or breaks the schema."""


@dataclass(frozen=True)
class ModelFile:
    file: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Shard:
    index: int
    offset: int
    size: int
    sha256: str
    path: str


@dataclass(frozen=True)
class ArtifactFile:
    path: str
    size: int
    sha256: str
    content_type: str = "application/octet-stream"


@dataclass(frozen=True)
class Manifest:
    name: str
    model: ModelFile
    shard_size: int
    shards: tuple[Shard, ...]
    files: tuple[ArtifactFile, ...]

    @classmethod
    def parse(cls, raw: bytes | str) -> "Manifest":
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"manifest is not valid JSON: {exc}") from None
        obj = _object(data, "manifest")
        if obj.get("schema") != SCHEMA:
            raise ManifestError(f"manifest.schema must be {SCHEMA!r}, got {obj.get('schema')!r}")
        name = _str(obj, "name", "manifest")
        if not is_model_name(name):
            raise ManifestError(f"manifest.name {name!r} is not a valid model name")
        model_obj = _object(obj.get("model"), "manifest.model")
        model = ModelFile(
            _file_name(model_obj, "file", "manifest.model"),
            _size(model_obj, "size", "manifest.model"),
            _digest(model_obj, "sha256", "manifest.model"),
        )
        shard_size = _size(obj, "shard_size", "manifest")
        shards = tuple(_shard(s, i) for i, s in enumerate(_list(obj, "shards", "manifest")))
        files = tuple(_artifact(f, i) for i, f in enumerate(_list(obj, "files", "manifest")))
        manifest = cls(name, model, shard_size, shards, files)
        manifest._check_layout()
        return manifest

    def to_json(self) -> dict[str, Any]:
        """The manifest as published: `parse(json.dumps(m.to_json())) == m`."""
        return {
            "schema": SCHEMA,
            "name": self.name,
            "model": asdict(self.model),
            "shard_size": self.shard_size,
            "shards": [asdict(s) for s in self.shards],
            "files": [asdict(f) for f in self.files],
        }

    def _check_layout(self) -> None:
        offset = 0
        for shard in self.shards:
            if shard.offset != offset:
                raise ManifestError(f"manifest.shards[{shard.index}].offset is {shard.offset}, expected {offset} (shards must be contiguous)")
            if shard.size == 0 or shard.size > self.shard_size:
                raise ManifestError(f"manifest.shards[{shard.index}].size {shard.size} is not in 1..shard_size ({self.shard_size})")
            offset += shard.size
        if offset != self.model.size:
            raise ManifestError(f"manifest shards add up to {offset} bytes but model.size is {self.model.size}")
        names = [f.path for f in self.files] + [self.model.file, "manifest.json"]
        if len(set(names)) != len(names):
            raise ManifestError(f"manifest file names collide: {sorted(names)}")


def _shard(value: Any, position: int) -> Shard:
    where = f"manifest.shards[{position}]"
    obj = _object(value, where)
    index = _size(obj, "index", where)
    if index != position:
        raise ManifestError(f"{where}.index is {index}; shards must be listed in order")
    sha = _digest(obj, "sha256", where)
    path = _str(obj, "path", where)
    if path != f"blobs/sha256-{sha}":
        raise ManifestError(f"{where}.path must be 'blobs/sha256-<its sha256>', got {path!r}")
    return Shard(index, _size(obj, "offset", where), _size(obj, "size", where), sha, path)


def _artifact(value: Any, position: int) -> ArtifactFile:
    where = f"manifest.files[{position}]"
    obj = _object(value, where)
    content_type = obj.get("content_type", "application/octet-stream")
    if not isinstance(content_type, str):
        raise ManifestError(f"{where}.content_type must be a string")
    return ArtifactFile(_file_name(obj, "path", where), _size(obj, "size", where), _digest(obj, "sha256", where), content_type)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"{where} must be an object")
    return value


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise ManifestError(f"{where}.{key} must be a list")
    return value


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ManifestError(f"{where}.{key} must be a string")
    return value


def _size(obj: dict[str, Any], key: str, where: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"{where}.{key} must be a non-negative integer, got {value!r}")
    return value


def _digest(obj: dict[str, Any], key: str, where: str) -> str:
    value = _str(obj, key, where)
    if not _HEX.fullmatch(value):
        raise ManifestError(f"{where}.{key} must be 64 lowercase hex digits, got {value!r}")
    return value


def _file_name(obj: dict[str, Any], key: str, where: str) -> str:
    """A single path segment: the file lands in the output directory and nowhere else."""
    value = _str(obj, key, where)
    if not _FILE_NAME.fullmatch(value) or ".." in value:
        raise ManifestError(f"{where}.{key} {value!r} must be a plain file name (no directories, no '..')")
    return value
