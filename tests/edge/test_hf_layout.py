"""The Hugging Face clients load a published model from the local edge unchanged: `huggingface_hub`
(`hf_hub_download`, `snapshot_download`), `transformers` `AutoTokenizer` (in a process whose only hub
is `HF_ENDPOINT`, the edge), with the same token ids as `tokenizers`; `model.gguf` streams from its
shards byte-identical, and one Range may cross shard boundaries. The Cloudflare SDK's
`ai.models.list` reads the served models."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from tokenizers import Tokenizer

from edgellm_local.cli import main
from edgellm_local.emulator.server import EdgeServer
from tests.support.tiny_gguf import write_tiny_gguf

NAME = "tiny-hf"
REPO = f"models/{NAME}"
SHARD = 256 * 1024
TEXT = "Hello world, the edge serves tokenizers to transformers."


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A real tiny GGUF padded to a little over four shards."""
    path = write_tiny_gguf(tmp_path / "model.gguf", vocab="bpe")
    with open(path, "ab") as f:
        f.write(os.urandom(4 * SHARD - path.stat().st_size + 777))
    return path


@pytest.fixture
def hub(start_edge: Callable[..., EdgeServer], model_file: Path, tmp_path: Path) -> EdgeServer:
    edge = start_edge()
    command = ["publish", str(model_file), "--name", NAME, "--shard-size", "256K", "--target", "local", "--state", str(tmp_path)]
    assert main(command) == 0
    return edge


def manifest(edge: EdgeServer) -> dict[str, Any]:
    return httpx.get(f"{edge.url}/models/{NAME}/manifest.json").json()


def test_hf_hub_download_fetches_every_file_and_the_gguf_byte_identical(hub: EdgeServer, model_file: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    gguf = hf_hub_download(REPO, "model.gguf", endpoint=hub.url, cache_dir=cache)
    assert Path(gguf).read_bytes() == model_file.read_bytes()
    for entry in manifest(hub)["files"]:
        path = hf_hub_download(REPO, entry["path"], endpoint=hub.url, cache_dir=cache)
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == entry["sha256"]
    # cached under the edge's commit, which is what X-Repo-Commit said
    commit = httpx.head(f"{hub.url}/{REPO}/resolve/main/model.gguf").headers["x-repo-commit"]
    assert (cache / f"models--models--{NAME}" / "refs" / "main").read_text() == commit
    assert Path(gguf).parent.name == commit


def test_snapshot_download_lists_and_fetches_the_repo(hub: EdgeServer, model_file: Path, tmp_path: Path) -> None:
    folder = Path(snapshot_download(REPO, endpoint=hub.url, cache_dir=tmp_path / "hf-cache"))
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["config.json", "model.gguf", "tokenizer.json", "tokenizer_config.json"]
    assert (folder / "model.gguf").read_bytes() == model_file.read_bytes()
    local = Path(snapshot_download(REPO, endpoint=hub.url, local_dir=tmp_path / "flat", allow_patterns=["*.json"]))
    assert sorted(p.name for p in local.iterdir() if p.is_file()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]


def test_missing_repo_revision_and_file_are_the_hubs_errors(hub: EdgeServer, tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "special_tokens_map.json", endpoint=hub.url, cache_dir=cache)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="v2", endpoint=hub.url, cache_dir=cache)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("models/nobody", "config.json", endpoint=hub.url, cache_dir=cache)
    bad = httpx.get(f"{hub.url}/models/{NAME}/resolve/main/nothing.bin")
    assert bad.status_code == 404 and bad.headers["x-error-code"] == "EntryNotFound"
    assert bad.json()["error"]["type"] == "not_found_error"  # still the gateway's one error shape


def test_the_repo_id_without_the_models_prefix_is_the_same_repo(hub: EdgeServer, model_file: Path, tmp_path: Path) -> None:
    """`tiny-hf` as well as `models/tiny-hf`, as the Hub serves `gpt2`: the same bytes and commit."""
    cache = tmp_path / "hf-cache"
    gguf = hf_hub_download(NAME, "model.gguf", endpoint=hub.url, cache_dir=cache)
    assert Path(gguf).read_bytes() == model_file.read_bytes()
    commit = httpx.head(f"{hub.url}/{REPO}/resolve/main/model.gguf").headers["x-repo-commit"]
    assert Path(gguf).parent.name == commit
    folder = Path(snapshot_download(NAME, endpoint=hub.url, cache_dir=cache))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.gguf", "tokenizer.json", "tokenizer_config.json"]
    info = HfApi(endpoint=hub.url).model_info(NAME)
    assert info.id == NAME and info.sha == commit
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(NAME, "special_tokens_map.json", endpoint=hub.url, cache_dir=cache)
    with pytest.raises(RepositoryNotFoundError, match="nobody"):
        hf_hub_download("nobody", "config.json", endpoint=hub.url, cache_dir=cache)


def test_a_repo_id_in_another_namespace_is_a_repo_not_found_naming_the_edges_ids(hub: EdgeServer, tmp_path: Path) -> None:
    """Not huggingface_hub's "check your connection": its RepositoryNotFoundError, with our message."""
    cache = tmp_path / "hf-cache"
    with pytest.raises(RepositoryNotFoundError, match=f"models/{NAME}"):
        hf_hub_download(f"someone/{NAME}", "config.json", endpoint=hub.url, cache_dir=cache)
    with pytest.raises(RepositoryNotFoundError, match=f"models/{NAME}"):
        snapshot_download(f"someone/{NAME}", endpoint=hub.url, cache_dir=cache)


def test_a_range_crosses_shard_boundaries(hub: EdgeServer, model_file: Path) -> None:
    data = model_file.read_bytes()
    url = f"{hub.url}/{REPO}/resolve/main/model.gguf"
    head = httpx.head(url)
    sha = hashlib.sha256(data).hexdigest()
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))
    assert head.headers["etag"] == head.headers["x-linked-etag"] == f'"{sha}"'
    assert head.headers["x-linked-size"] == str(len(data)) and head.headers["accept-ranges"] == "bytes"
    for first, last in [(SHARD - 10, SHARD + 9), (SHARD - 1, 3 * SHARD), (0, 0), (4 * SHARD, len(data) - 1), (SHARD, 2 * SHARD - 1)]:
        part = httpx.get(url, headers={"range": f"bytes={first}-{last}"})
        assert part.status_code == 206, (first, last)
        assert part.headers["content-range"] == f"bytes {first}-{last}/{len(data)}"
        assert part.content == data[first : last + 1], (first, last)
    suffix = httpx.get(url, headers={"range": "bytes=-1000"})
    assert suffix.status_code == 206 and suffix.content == data[-1000:]
    assert httpx.get(url, headers={"range": f"bytes={len(data)}-"}).status_code == 416
    assert httpx.get(url, headers={"if-none-match": head.headers["etag"]}).status_code == 304
    assert httpx.get(url, headers={"range": "bytes=0-9", "if-range": '"other"'}).content == data  # If-Range mismatch: the whole file


def test_a_pinned_revision_is_immutable_and_main_revalidates(hub: EdgeServer) -> None:
    main_head = httpx.head(f"{hub.url}/{REPO}/resolve/main/tokenizer.json")
    commit = main_head.headers["x-repo-commit"]
    assert len(commit) == 40 and "max-age=0" in main_head.headers["cache-control"]
    pinned = httpx.head(f"{hub.url}/{REPO}/resolve/{commit}/tokenizer.json")
    assert "immutable" in pinned.headers["cache-control"] and pinned.headers["etag"] == main_head.headers["etag"]
    info = httpx.get(f"{hub.url}/api/models/{REPO}/revision/main").json()
    assert info["sha"] == commit and info["id"] == REPO
    assert sorted(s["rfilename"] for s in info["siblings"]) == ["config.json", "model.gguf", "tokenizer.json", "tokenizer_config.json"]


TRANSFORMERS_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps({"ids": tok(sys.argv[2], add_special_tokens=False)["input_ids"], "class": type(tok).__name__}))
"""


def test_transformers_auto_tokenizer_loads_from_the_edge_with_the_same_ids_as_tokenizers(hub: EdgeServer, tmp_path: Path) -> None:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "NO_PROXY": "127.0.0.1"}
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([sys.executable, "-c", TRANSFORMERS_SCRIPT, REPO, TEXT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    expected = Tokenizer.from_str(httpx.get(f"{hub.url}/models/{NAME}/tokenizer.json").text).encode(TEXT, add_special_tokens=False).ids
    assert got["ids"] == expected and len(expected) > 5


def test_cloudflare_sdk_lists_the_served_models(edge: EdgeServer) -> None:
    from cloudflare import Cloudflare

    client = Cloudflare(api_token="unused", base_url=f"{edge.url}/client/v4")
    models = list(client.ai.models.list(account_id="any"))
    config = edge.app.deps.config
    assert [m["name"] for m in models] == list(config.models)
    assert all(m["task"]["name"] == "Text Generation" for m in models)
    page = client.ai.models.list(account_id="any", per_page=1, search=config.model)
    assert [m["name"] for m in page.result] == [config.model]
    bad = httpx.get(f"{edge.url}/client/v4/accounts/any/ai/models/search", params={"per_page": "0"})
    assert bad.status_code == 400 and bad.json()["success"] is False
