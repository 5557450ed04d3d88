"""The official `openai` Python SDK pointed at the local edge: what users will actually run."""

from __future__ import annotations

from typing import Callable, Iterator

import openai
import pytest

from edgellm.ports import CapacityExceeded
from edgellm_local.emulator.server import EdgeServer
from tests.conftest import target_headers
from edgellm_local.doubles.scripted import ScriptedAI

MODEL = "@cf/meta/llama-2-7b-chat-int8"
MESSAGES = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
def client(edge_url: Callable[..., str]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{edge_url(kv=None)}/v1", default_headers=target_headers(kv=None), api_key="unused-locally", max_retries=0, timeout=30) as sdk:
        yield sdk


def test_chat(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 8


def test_chat_stream(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    ))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert text == whole.choices[0].message.content


def test_completions(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0)
    assert completion.object == "text_completion"
    assert completion.choices[0].text and completion.usage and completion.usage.completion_tokens == 6


def test_models(client: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in client.models.list()]


def test_errors_surface_as_the_sdks_own_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=9)  # type: ignore[arg-type]
    assert bad.value.status_code == 400
    assert bad.value.param == "temperature" and bad.value.code == "out_of_range"
    assert "temperature" in bad.value.message

    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="@cf/no/such-model", messages=MESSAGES)  # type: ignore[arg-type]
    assert missing.value.param == "model" and missing.value.code == "model_not_found"


def test_an_overloaded_binding_is_the_sdks_internal_server_error(start_edge: Callable[..., EdgeServer]) -> None:
    server = start_edge(ai=ScriptedAI(fail=CapacityExceeded("3040: Capacity temporarily exceeded"), description=None), kv=None)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk:
        with pytest.raises(openai.InternalServerError) as info:
            sdk.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.status_code == 503
    assert int(info.value.response.headers["retry-after"]) > 0
