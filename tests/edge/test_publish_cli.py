"""The real commands end to end: `edgellm publish --target local` writes into the R2 a local edge
serves, the edge serves what was published, and `edgellm pull` gets the same bytes back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import gguf
import httpx
import pytest
from tokenizers import Tokenizer

from edgellm_local.cli import main
from edgellm_local.hub.gguf_tokenizer import build_tokenizer
from edgellm_local.emulator.server import EdgeServer
from tests.support.tiny_gguf import write_tiny_gguf


@pytest.mark.parametrize("vocab", ["bpe", "spm"])
def test_published_model_is_served_and_pulled_byte_for_byte(
    start_edge: Callable[..., EdgeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str], vocab: str
) -> None:
    edge = start_edge()  # its R2 lives in tmp_path / "r2", the layout `--state tmp_path` writes
    model = write_tiny_gguf(tmp_path / "tiny.gguf", vocab=vocab)  # type: ignore[arg-type]
    with open(model, "ab") as f:
        f.write(os.urandom(200_000))
    name = f"tiny-{vocab}"
    assert main(["publish", str(model), "--name", name, "--state", str(tmp_path), "--shard-size", "64K"]) == 0
    shards = -(-model.stat().st_size // 65536)
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith(f"published {name}: 4 files, {shards} shards; uploaded {shards + 4} objects")

    manifest = httpx.get(f"{edge.url}/models/{name}/manifest.json").json()
    served = httpx.get(f"{edge.url}/models/{name}/tokenizer.json")
    assert served.headers["content-type"].startswith("application/json")
    reference = build_tokenizer(gguf.GGUFReader(model))
    text = "Hello world, the café 😀 <|im_start|> [INST]"
    assert Tokenizer.from_str(served.text).encode(text).ids == reference.encode(text).ids
    blob = httpx.get(f"{edge.url}/models/{name}/{manifest['shards'][1]['path']}", headers={"Range": "bytes=0-9"})
    assert blob.status_code == 206 and blob.content == model.read_bytes()[65536:65546]

    out = tmp_path / "pulled"
    assert main(["pull", edge.url, name, "--out", str(out)]) == 0
    assert (out / "model.gguf").read_bytes() == model.read_bytes()
    assert (out / "tokenizer.json").read_text() == served.text
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
