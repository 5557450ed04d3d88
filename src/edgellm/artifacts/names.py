"""Which artifact a URL names, decided from the raw path before R2 is touched.

The R2 key of an artifact is its URL path without the leading slash, so the only thing standing
between a request and an arbitrary key is this parser. It reads the still percent-encoded path:
a model name never needs encoding, so any `%` (an encoded dot, slash or backslash), a backslash,
or a dot segment is refused outright instead of being decoded into something that looks valid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ErrorKind, GatewayError, invalid

PREFIX = "/models/"
MAX_NAME_LENGTH = 64
NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
BLOB = re.compile(r"sha256-([0-9a-f]{64})")
BLOB_LIKE = re.compile(r"sha256-.*", re.IGNORECASE)

JSON = "application/json"
OCTETS = "application/octet-stream"
REVALIDATE = "public, max-age=0, must-revalidate"
IMMUTABLE = "public, max-age=31536000, immutable"

# file name -> content type; everything a model publishes besides its blobs
FILES = {
    "manifest.json": JSON,
    "tokenizer.json": JSON,
    "tokenizer_config.json": JSON,
    "config.json": JSON,
}


@dataclass(frozen=True)
class ArtifactPath:
    """A validated artifact: `file` is relative to `/models/{name}/`."""

    name: str
    file: str

    @property
    def key(self) -> str:
        return f"models/{self.name}/{self.file}"

    @property
    def is_blob(self) -> bool:
        return self.file.startswith("blobs/")

    @property
    def content_type(self) -> str:
        return OCTETS if self.is_blob else FILES[self.file]

    @property
    def cache_control(self) -> str:
        # a blob's name is its digest, so its bytes can never change; the rest can be republished
        return IMMUTABLE if self.is_blob else REVALIDATE


def is_model_name(name: str) -> bool:
    """The model-name rule, here once: 1..64 of `[a-z0-9][a-z0-9._-]*`, and no `..`."""
    return len(name) <= MAX_NAME_LENGTH and ".." not in name and NAME.fullmatch(name) is not None


def validate_name(name: str) -> str:
    """Return `name` if it is a model name (`is_model_name`), else a 400 saying which part is wrong."""
    if is_model_name(name):
        return name
    if not name:
        raise invalid("The model name is empty.", "name", "invalid_model_name")
    if len(name) > MAX_NAME_LENGTH:
        raise invalid(f"The model name is longer than {MAX_NAME_LENGTH} characters.", "name", "invalid_model_name")
    raise invalid(
        "The model name must be lowercase letters, digits, '.', '_' or '-', start with a letter or digit, "
        "and contain no '..'.",
        "name",
        "invalid_model_name",
    )


def _not_found(path: str) -> GatewayError:
    return GatewayError(ErrorKind.NOT_FOUND, f"No artifact at {path}.", code="artifact_not_found")


def parse_artifact_path(raw_path: str) -> ArtifactPath:
    """Map a raw request path `/models/{name}/{file}` to an `ArtifactPath`.

    400 for anything that tries to escape (encodings, backslashes, dot segments) or is not a
    valid name or digest; 404 for well-formed paths that name no artifact kind.
    """
    if not raw_path.startswith(PREFIX):
        raise _not_found(raw_path)
    rest = raw_path[len(PREFIX):]
    if "%" in rest or "\\" in rest:
        raise invalid("Artifact paths must not contain percent-encoded characters or backslashes.", "path", "invalid_path")
    segments = rest.split("/")
    if any(s in (".", "..") for s in segments):
        raise invalid("Artifact paths must not contain '.' or '..' segments.", "path", "invalid_path")
    name = validate_name(segments[0])
    tail = segments[1:]
    if len(tail) == 1 and tail[0] in FILES:
        return ArtifactPath(name, tail[0])
    if len(tail) == 2 and tail[0] == "blobs":
        if BLOB.fullmatch(tail[1]):
            return ArtifactPath(name, f"blobs/{tail[1]}")
        if BLOB_LIKE.fullmatch(tail[1]):
            raise invalid("A blob is named sha256-<64 lowercase hex digits>.", "digest", "invalid_digest")
    raise _not_found(raw_path)


def name_from_prefix(prefix: str) -> str | None:
    """The model name of an R2 delimited prefix `models/{name}/`, or None if it is not one."""
    if not (prefix.startswith("models/") and prefix.endswith("/")):
        return None
    name = prefix[len("models/"):-1]
    try:
        return validate_name(name)
    except GatewayError:
        return None
