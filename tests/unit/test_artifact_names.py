"""Artifact path parsing: every path either names exactly one R2 key or is refused."""

from __future__ import annotations

import json

import pytest

from edgellm.artifacts.names import ArtifactPath, name_from_prefix, parse_artifact_path, validate_name
from edgellm.errors import GatewayError

DIGEST = "ab" * 32

VALID = [
    ("/models/smollm2-135m/manifest.json", "smollm2-135m", "manifest.json", "application/json", "must-revalidate"),
    ("/models/a/tokenizer.json", "a", "tokenizer.json", "application/json", "must-revalidate"),
    ("/models/llama-2.7b_q4/tokenizer_config.json", "llama-2.7b_q4", "tokenizer_config.json", "application/json", "must-revalidate"),
    ("/models/0/config.json", "0", "config.json", "application/json", "must-revalidate"),
    (f"/models/m/blobs/sha256-{DIGEST}", "m", f"blobs/sha256-{DIGEST}", "application/octet-stream", "immutable"),
    ("/models/" + "n" * 64 + "/manifest.json", "n" * 64, "manifest.json", "application/json", "must-revalidate"),
]


@pytest.mark.parametrize("raw, name, file, content_type, caching", VALID)
def test_valid_paths(raw: str, name: str, file: str, content_type: str, caching: str) -> None:
    path = parse_artifact_path(raw)
    assert path == ArtifactPath(name, file)
    assert path.key == raw.removeprefix("/")
    assert path.content_type == content_type
    assert caching in path.cache_control


# (raw path, status, code)
REFUSED = [
    ("/models/../secrets/manifest.json", 400, "invalid_path"),
    ("/models/m/../../x/manifest.json", 400, "invalid_path"),
    ("/models/./manifest.json", 400, "invalid_path"),
    ("/models/%2e%2e/manifest.json", 400, "invalid_path"),
    ("/models/%2E%2E/manifest.json", 400, "invalid_path"),
    ("/models/a%2Fb/manifest.json", 400, "invalid_path"),
    ("/models/a%2fb/manifest.json", 400, "invalid_path"),
    ("/models/a%5Cb/manifest.json", 400, "invalid_path"),
    ("/models/a\\b/manifest.json", 400, "invalid_path"),
    ("/models/m/blobs%2Fsha256-" + DIGEST, 400, "invalid_path"),
    ("/models/m%00/manifest.json", 400, "invalid_path"),
    ("/models//manifest.json", 400, "invalid_model_name"),
    ("/models/" + "n" * 65 + "/manifest.json", 400, "invalid_model_name"),
    ("/models/SmolLM/manifest.json", 400, "invalid_model_name"),
    ("/models/-lead/manifest.json", 400, "invalid_model_name"),
    ("/models/.hidden/manifest.json", 400, "invalid_model_name"),
    ("/models/a..b/manifest.json", 400, "invalid_model_name"),
    ("/models/a b/manifest.json", 400, "invalid_model_name"),
    ("/models/é/manifest.json", 400, "invalid_model_name"),
    ("/models/m/blobs/sha256-" + "AB" * 32, 400, "invalid_digest"),
    ("/models/m/blobs/sha256-" + "ab" * 31, 400, "invalid_digest"),
    ("/models/m/blobs/sha256-" + "ab" * 33, 400, "invalid_digest"),
    ("/models/m/blobs/sha256-" + "zz" * 32, 400, "invalid_digest"),
    ("/models/m/blobs/sha256-", 400, "invalid_digest"),
    ("/models/m/blobs/md5-" + "ab" * 16, 404, "artifact_not_found"),
    ("/models/m/blobs/", 404, "artifact_not_found"),
    ("/models/m/blobs", 404, "artifact_not_found"),
    ("/models/m/model.gguf", 404, "artifact_not_found"),
    ("/models/m/index.sqlite3", 404, "artifact_not_found"),
    ("/models/m/manifest.json/", 404, "artifact_not_found"),
    ("/models/m/sub/manifest.json", 404, "artifact_not_found"),
    ("/models/m", 404, "artifact_not_found"),
    ("/models/m/", 404, "artifact_not_found"),
    ("/elsewhere/m/manifest.json", 404, "artifact_not_found"),
]


@pytest.mark.parametrize("raw, status, code", REFUSED)
def test_refused_paths(raw: str, status: int, code: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse_artifact_path(raw)
    assert (info.value.status, info.value.code) == (status, code)


@pytest.mark.parametrize("name", ["a", "smollm2-135m", "x.y_z-1", "9" * 64])
def test_validate_name_accepts(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "A", "a/b", "..", "a..b", "_a", "a" * 65, "a\n"])
def test_validate_name_refuses(name: str) -> None:
    with pytest.raises(GatewayError) as info:
        validate_name(name)
    assert info.value.status == 400 and info.value.param == "name"


@pytest.mark.parametrize("prefix, name", [
    ("models/m/", "m"), ("models/Bad/", None), ("models/", None), ("other/m/", None), ("models/a/b/", None),
])
def test_name_from_prefix(prefix: str, name: str | None) -> None:
    assert name_from_prefix(prefix) == name


@pytest.mark.parametrize(
    "name", ["m", "0", "llama-2.7b_q4", "n" * 64, "n" * 65, "", "SmolLM", "-lead", ".hidden", "a..b", "a b", "a/b", "é"]
)
def test_a_manifest_takes_exactly_the_names_the_routes_serve(name: str) -> None:
    """One model-name rule: `edgellm pull` never accepts a manifest the edge could not serve."""
    from edgellm_local.hub.manifest import Manifest, ManifestError, ModelFile

    try:
        validate_name(name)
        served = True
    except GatewayError:
        served = False
    raw = json.dumps(Manifest(name, ModelFile("m.gguf", 0, DIGEST), 1, (), ()).to_json())
    try:
        Manifest.parse(raw)
        parsed = True
    except ManifestError:
        parsed = False
    assert parsed is served
