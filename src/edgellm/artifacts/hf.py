"""The published artifacts in the Hugging Face Hub's layout, so HF clients load from the edge unchanged.

With `HF_ENDPOINT` pointing at the edge, `huggingface_hub`, `transformers` and transformers.js
look for repo `models/{name}` at:
- `GET|HEAD /models/{name}/resolve/{revision}/{file}`: the file, with the headers they read:
  `X-Repo-Commit` (the revision they cache under), `ETag` and `Content-Length`, and for the large
  file `X-Linked-Etag`/`X-Linked-Size` (the Hub's LFS headers; the ETag is the file's SHA-256);
- `GET /api/models/models/{name}[/revision/{revision}]`: repo info (`sha`, `siblings`);
- `GET /api/models/models/{name}/tree/{revision}[/{path}]`: the file list `snapshot_download` uses.
The same repo answers as `{name}` too (`/{name}/resolve/...`, `/api/models/{name}...`), as the Hub
answers a repo id without a namespace (`gpt2`): a user who types the bare name gets the model, not
huggingface_hub's "check your connection" (its word for any 404 without the Hub's error code). A
repo id in another namespace is a `RepoNotFound` whose message names the ids this edge serves.

The repo is a view of the manifest: its files are the tokenizer files the manifest lists plus
`model.gguf`, which is not stored whole but streamed from its shards in order (one `Range` may
cross shard boundaries). The commit is the first 40 hex digits of the manifest's SHA-256, so a
republish is a new commit and a pinned revision can be cached forever. Missing repos, revisions and
files answer 404 with the Hub's `X-Error-Code`, which the clients turn into their own exceptions
(`transformers` relies on `EntryNotFound` to skip optional files).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator

from ..errors import ErrorKind, GatewayError, RetryAfter
from ..context import RequestContext
from ..http import Request, Response, json_response
from ..ports import R2Range
from ..deps import Deps
from ..stream import close_source, owns
from .conditional import ByteRange, none_match, parse_range, range_applies
from .names import BLOB, FILES, IMMUTABLE, JSON, OCTETS, REVALIDATE, ArtifactPath, validate_name
from .routes import _call, _store

MAIN = "main"
MANIFEST = "manifest.json"
GGUF = "model.gguf"  # the weights, whatever the published file was called (as `edgellm pull` writes them)
LFS_POINTER_SIZE = 134  # what a git-lfs pointer file of a sha256 and a size takes; clients only display it
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_MANIFEST_BYTES = 4 << 20


@dataclass(frozen=True)
class Piece:
    """`size` bytes of the R2 object `key`, read whole."""

    key: str
    size: int


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int
    sha256: str
    pieces: tuple[Piece, ...]
    content_type: str
    large: bool = False  # the Hub's LFS file: X-Linked-* headers and an `lfs` entry in the tree

    @property
    def etag(self) -> str:
        return f'"{self.sha256}"'


@dataclass(frozen=True)
class Snapshot:
    """One model as an HF repo at one commit."""

    name: str
    commit: str
    files: dict[str, RepoFile]
    namespace: str = "models/"  # as the client asked for it: "models/" or "" (the bare id)

    @property
    def repo_id(self) -> str:
        return f"{self.namespace}{self.name}"


def _hub_error(status: ErrorKind, code: str, message: str) -> GatewayError:
    return GatewayError(status, message, code=code.lower(), headers={"x-error-code": code, "x-error-message": message})


def _bad_manifest(name: str, why: str, detail: str | None = None) -> GatewayError:
    return GatewayError(ErrorKind.UPSTREAM, f"The manifest of {name!r} is invalid: {why}.", code="invalid_manifest", retry_after=RetryAfter.UNCONFIGURED,
                        detail=detail)


def parse_snapshot(name: str, raw: bytes) -> Snapshot:
    """The repo view of a published manifest (`edgellm.manifest/1`); an inconsistent one is a 502."""
    try:
        data = json.loads(raw)
        model = data["model"]
        size, sha = model["size"], model["sha256"]
        shards = data["shards"]
        files = data["files"]
        if not (isinstance(size, int) and isinstance(sha, str) and _HEX64.fullmatch(sha)):
            raise ValueError("model.size or model.sha256")
        pieces, offset = [], 0
        for shard in shards:
            if shard["offset"] != offset or not isinstance(shard["size"], int) or shard["size"] <= 0:
                raise ValueError(f"shard {shard.get('index')} is not contiguous")
            if not BLOB.fullmatch(str(shard["path"]).removeprefix("blobs/")) or not shard["path"].startswith("blobs/"):
                raise ValueError(f"shard {shard.get('index')} has a bad path")
            pieces.append(Piece(ArtifactPath(name, shard["path"]).key, shard["size"]))
            offset += shard["size"]
        if offset != size:
            raise ValueError("the shards do not add up to model.size")
        repo: dict[str, RepoFile] = {}
        for f in files:
            path, fsize, fsha = f["path"], f["size"], f["sha256"]
            if path not in FILES or path == MANIFEST or not isinstance(fsize, int) or not _HEX64.fullmatch(str(fsha)):
                raise ValueError(f"files entry {path!r}")
            repo[path] = RepoFile(path, fsize, fsha, (Piece(ArtifactPath(name, path).key, fsize),), FILES[path])
        repo[GGUF] = RepoFile(GGUF, size, sha, tuple(pieces), OCTETS, large=True)
    except ValueError as exc:  # the checks above, in the edge's own words (or the JSON parser's position)
        raise _bad_manifest(name, str(exc) or type(exc).__name__) from None
    except KeyError as exc:  # the field's name, in the edge's words
        raise _bad_manifest(name, f"the field {str(exc.args[0])[:80]!r} is missing") from None
    except (TypeError, AttributeError) as exc:  # Python's own words about a value: the log's
        raise _bad_manifest(name, "a field has the wrong type", f"manifest of {name!r}: {type(exc).__name__}: {exc}") from None
    return Snapshot(name, hashlib.sha256(raw).hexdigest()[:40], repo)


async def load_snapshot(deps: Deps, name: str, namespace: str = "models/") -> Snapshot:
    validate_name(name)
    obj = await _call(_store(deps).get(ArtifactPath(name, MANIFEST).key))
    if obj is None or obj.body is None:
        raise _hub_error(ErrorKind.NOT_FOUND, "RepoNotFound", f"Repository {namespace}{name} not found: no model {name!r} is published on this edge.")
    raw = bytearray()
    async for chunk in obj.body:
        raw += chunk
        if len(raw) > _MAX_MANIFEST_BYTES:
            raise _bad_manifest(name, "it is larger than 4 MiB")
    return replace(parse_snapshot(name, bytes(raw)), namespace=namespace)


async def _requested_snapshot(ctx: RequestContext, deps: Deps) -> Snapshot:
    """The routes of `models/{name}` name the model `name`; the bare routes (repo id `{name}`) `bare`."""
    params = ctx.params
    if "name" in params:
        return await load_snapshot(deps, params["name"])
    return await load_snapshot(deps, params["bare"], namespace="")


async def foreign_repo(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """A repo id in a namespace this edge does not have: the Hub's `RepoNotFound` (which
    huggingface_hub raises with this message) rather than a bare 404 it calls a connection problem."""
    owner, repo = ctx.params["owner"], ctx.params["repo"]
    raise _hub_error(
        ErrorKind.NOT_FOUND, "RepoNotFound",
        f"Repository {owner}/{repo} not found: this edge serves its published models as repo ids "
        f"models/{{name}} (or {{name}}), e.g. models/{repo}; GET /models lists them.",
    )


def _check_revision(snapshot: Snapshot, revision: str) -> None:
    if revision not in (MAIN, snapshot.commit):
        raise _hub_error(
            ErrorKind.NOT_FOUND, "RevisionNotFound",
            f"Revision {revision!r} not found in {snapshot.repo_id}: it has {MAIN!r} and commit {snapshot.commit}.",
        )


def _file_headers(snapshot: Snapshot, file: RepoFile, revision: str) -> dict[str, str]:
    headers = {
        "etag": file.etag,
        "x-repo-commit": snapshot.commit,
        "accept-ranges": "bytes",
        "cache-control": IMMUTABLE if revision == snapshot.commit else REVALIDATE,
        "x-content-type-options": "nosniff",
    }
    if file.large:
        headers["x-linked-etag"] = file.etag
        headers["x-linked-size"] = str(file.size)
    return headers


def _spans(pieces: tuple[Piece, ...], first: int, last: int) -> list[tuple[Piece, int, int]]:
    """(piece, offset in it, length) for the bytes first..last (inclusive) of the concatenation."""
    spans, start = [], 0
    for piece in pieces:
        end = start + piece.size  # exclusive
        if end > first and start <= last:
            lo, hi = max(first, start), min(last + 1, end)
            spans.append((piece, lo - start, hi - lo))
        start = end
    return spans


async def _open(deps: Deps, piece: Piece, offset: int, length: int) -> AsyncIterator[bytes]:
    whole = offset == 0 and length == piece.size
    obj = await _call(_store(deps).get(piece.key, range=None if whole else R2Range(offset=offset, length=length)))
    if obj is None or obj.body is None or obj.size != piece.size:
        raise _bad_manifest(piece.key.split("/")[1], f"{piece.key} is missing from R2 or not the size the manifest says")
    return obj.body


@owns("first_body")
async def _concatenated(deps: Deps, first_body: AsyncIterator[bytes], rest: list[tuple[Piece, int, int]]) -> AsyncIterator[bytes]:
    """The spans' bytes in order. The first span was opened before the headers went out (so a
    missing first shard is a clean 502); a later one that fails cuts the body short, which the
    client sees as a Content-Length mismatch rather than a silently wrong file."""
    body: Any = first_body
    try:
        while True:
            async for chunk in body:
                yield chunk
            await close_source(body)
            if not rest:
                return
            piece, offset, length = rest.pop(0)
            try:
                body = await _open(deps, piece, offset, length)
            except GatewayError as exc:
                deps.log.error("model.gguf stream cut short: %s", exc.detail or exc.message)
                body = None
                return
    finally:
        await close_source(body)


async def resolve_file(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    params = ctx.params
    snapshot = await _requested_snapshot(ctx, deps)
    revision = params["revision"]
    _check_revision(snapshot, revision)
    file = snapshot.files.get(params["file"])
    if file is None:
        raise _hub_error(ErrorKind.NOT_FOUND, "EntryNotFound", f"{snapshot.repo_id} has no file {params['file']!r}; it has {', '.join(sorted(snapshot.files))}.")
    headers = _file_headers(snapshot, file, revision)
    if none_match(request.header("if-none-match"), file.etag):
        return Response(304, headers, b"")
    byte_range: ByteRange | None = None
    if request.method == "GET" and range_applies(request.header("if-range"), file.etag):
        byte_range = parse_range(request.header("range"), file.size)
    headers["content-type"] = file.content_type
    headers["content-length"] = str(byte_range.length if byte_range else file.size)
    status = 206 if byte_range else 200
    if byte_range:
        headers["content-range"] = byte_range.content_range(file.size)
    if request.method == "HEAD" or file.size == 0:
        return Response(status, headers, b"")
    first, last = (byte_range.first, byte_range.last) if byte_range else (0, file.size - 1)
    spans = _spans(file.pieces, first, last)
    body = await _open(deps, *spans[0])
    return Response(status, headers, _concatenated(deps, body, spans[1:]))


def _tree_entry(file: RepoFile) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "oid": file.sha256[:40], "size": file.size, "path": file.path}
    if file.large:
        entry["lfs"] = {"oid": file.sha256, "size": file.size, "pointerSize": LFS_POINTER_SIZE}
    return entry


async def get_repo_info(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """`HfApi.model_info` / `repo_info`: what `snapshot_download` resolves a revision with."""
    snapshot = await _requested_snapshot(ctx, deps)
    revision = ctx.params.get("revision", MAIN)
    _check_revision(snapshot, revision)
    files = sorted(snapshot.files.values(), key=lambda f: f.path)
    return json_response({
        "_id": snapshot.commit[:24],
        "id": snapshot.repo_id,
        "modelId": snapshot.repo_id,
        "sha": snapshot.commit,
        "private": False,
        "disabled": False,
        "gated": False,
        "downloads": 0,
        "likes": 0,
        "library_name": "gguf",
        "tags": ["gguf"],
        "siblings": [{"rfilename": f.path, "size": f.size} for f in files],
        "usedStorage": sum(f.size for f in files),
    }, headers={"cache-control": REVALIDATE, "content-type": JSON})


async def list_repo_tree(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """`HfApi.list_repo_tree`: the repo is flat, so a sub-folder never exists (the Hub's 404)."""
    snapshot = await _requested_snapshot(ctx, deps)
    _check_revision(snapshot, ctx.params["revision"])
    folder = ctx.params.get("path", "").strip("/")
    if folder:
        raise _hub_error(ErrorKind.NOT_FOUND, "EntryNotFound", f"{snapshot.repo_id} has no folder {folder!r}.")
    entries = [_tree_entry(f) for f in sorted(snapshot.files.values(), key=lambda f: f.path)]
    return json_response(entries, headers={"cache-control": REVALIDATE})
