"""The local AI binding checks inputs against the model's published JSON schema (data in
`edgellm_local/schemas/`), not with the gateway's validation: the two can disagree, and the
gateway is held to the schema here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgellm.config import Config
from edgellm.errors import GatewayError
from edgellm.ports import InvalidModelInput
from edgellm.workers_ai import SAMPLING, validate_inputs
from edgellm_local.llama.input_schema import InputSchema
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner

MODEL = "@cf/meta/llama-2-7b-chat-int8"
MESSAGES = [{"role": "user", "content": "hi"}]

# (inputs, accepted by Workers AI's published schema)
CASES: list[tuple[dict[str, Any], bool]] = [
    ({"prompt": "hi"}, True),
    ({"messages": MESSAGES}, True),
    ({"prompt": "hi", "messages": MESSAGES}, False),  # exactly one of the two
    ({}, False),
    ({"prompt": ""}, False),
    ({"prompt": 3}, False),
    ({"messages": []}, False),
    ({"messages": [{"role": "user"}]}, False),
    ({"messages": [{"role": "user", "content": 1}]}, False),
    ({"prompt": "hi", "temperature": 0}, True),
    ({"prompt": "hi", "temperature": 5}, True),
    ({"prompt": "hi", "temperature": 5.01}, False),
    ({"prompt": "hi", "temperature": -0.1}, False),
    ({"prompt": "hi", "temperature": "0.5"}, False),
    ({"prompt": "hi", "top_k": 1}, True),
    ({"prompt": "hi", "top_k": 50}, True),
    ({"prompt": "hi", "top_k": 51}, False),
    ({"prompt": "hi", "top_k": 0}, False),
    ({"prompt": "hi", "top_k": 2.5}, False),
    ({"prompt": "hi", "seed": 9_999_999_999}, True),
    ({"prompt": "hi", "seed": 10_000_000_000}, False),
    ({"prompt": "hi", "seed": 0}, False),
    ({"prompt": "hi", "repetition_penalty": 2}, True),
    ({"prompt": "hi", "repetition_penalty": 2.5}, False),
    ({"prompt": "hi", "top_p": 2}, True),
    ({"prompt": "hi", "top_p": 2.1}, False),
    ({"prompt": "hi", "frequency_penalty": -2}, True),
    ({"prompt": "hi", "presence_penalty": 2.1}, False),
    ({"prompt": "hi", "max_tokens": 1}, True),
    ({"prompt": "hi", "max_tokens": 0}, False),
    ({"prompt": "hi", "max_tokens": True}, False),  # a JSON boolean is not an integer
    ({"prompt": "hi", "raw": "yes"}, False),
    ({"prompt": "hi", "stream": True}, True),
]


@pytest.fixture(scope="module")
def ai() -> LlamaCppAI:
    # _prepare refuses or translates before the runner is ever loaded: no model file is needed
    return LlamaCppAI.for_config(Config(), LlamaCppRunner(Path("never-loaded.gguf")))


@pytest.mark.parametrize(("inputs", "accepted"), CASES)
def test_the_local_binding_refuses_what_the_published_schema_refuses(ai: LlamaCppAI, inputs: dict[str, Any], accepted: bool) -> None:
    if accepted:
        ai._prepare(MODEL, inputs)
    else:
        with pytest.raises(InvalidModelInput, match="^5006: "):
            ai._prepare(MODEL, inputs)


def test_the_published_defaults_are_applied_by_the_binding(ai: LlamaCppAI) -> None:
    _runner, kind, body = ai._prepare(MODEL, {"prompt": "hi"})
    assert kind == "chat" and body["temperature"] == 0.6 and body["max_tokens"] == 256


@pytest.mark.parametrize(("inputs", "accepted"), CASES)
def test_the_gateway_agrees_with_the_published_schema(inputs: dict[str, Any], accepted: bool) -> None:
    """What the gateway lets through, the binding accepts; what the schema refuses, the gateway
    refuses first, with its own 400 naming the parameter."""
    try:
        validate_inputs(inputs, Config())
        gateway_accepts = True
    except GatewayError:
        gateway_accepts = False
    assert gateway_accepts is accepted


def test_the_gateways_ranges_are_the_published_ones() -> None:
    published = InputSchema.load().schema["properties"]
    for name, (kind, lo, hi) in SAMPLING.items():
        assert published[name]["type"] == ("integer" if kind == "int" else "number"), name
        assert (published[name].get("minimum"), published[name].get("maximum")) == (lo, hi), name
