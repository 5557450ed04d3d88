"""Small protocol promises the openai SDK leans on in a first hour, through the local edge:
every id `models.list` lists can be retrieved, `responses.input_items.list` works, refusals
name the parameter and say what is accepted or how to raise a limit."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import openai
import pytest

from edgellm.config import Config
from edgellm.deps import Deps, SystemClock
from edgellm_local.emulator.conversation_sqlite import conversation_factory
from edgellm_local.emulator.durable import LocalDurableObjectNamespace
from edgellm_local.emulator.server import EdgeServer

MODEL = "@cf/meta/llama-2-7b-chat-int8"
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def client(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], tmp_path: Path) -> Iterator[openai.OpenAI]:
    config = Config(open_access=True)
    conversations = LocalDurableObjectNamespace(conversation_factory(tmp_path / "conversations", config, SystemClock()),
                                                class_name="Conversation")
    with openai.OpenAI(base_url=f"{start_edge(make_deps(config=config, conversations=conversations)).url}/v1", api_key="unused-locally", max_retries=0, timeout=60) as client:
        yield client


def test_every_listed_model_id_can_be_retrieved(client: openai.OpenAI) -> None:
    listed = [m.id for m in client.models.list()]
    assert "gpt-4o-mini" in listed
    for model_id in listed:
        assert client.models.retrieve(model_id).id == model_id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_input_items_list_the_turns_input(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, instructions="Be brief.",
                                       input=[{"role": "user", "content": "Hello"},
                                              {"role": "assistant", "content": "Hi."},
                                              {"role": "user", "content": "My name is Ada."}], max_output_tokens=4)
    items = client.responses.input_items.list(response.id)
    assert [(i.role, i.content[0].text) for i in items.data] == [("user", "My name is Ada."), ("assistant", "Hi."), ("user", "Hello")]
    assert all(i.type == "message" and i.id for i in items.data)
    ascending = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [i.content[0].text for i in ascending.data] == ["Hello", "Hi."] and ascending.has_more
    rest = client.responses.input_items.list(response.id, order="asc", after=ascending.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["My name is Ada."] and not rest.has_more
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(response.id, limit=0)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nosuchthing")


def test_logprobs_with_tools_is_unsupported_and_names_logprobs(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[TOOL], logprobs=True)
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "unsupported_parameter" and error["param"] == "logprobs"


def test_a_role_error_lists_every_role_accepted(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "bot", "content": "hi"}])  # type: ignore[list-item]
    message = caught.value.message
    for role in ("system", "developer", "user", "assistant", "tool"):
        assert f"{role}" in message.split("got")[0], message


def test_max_tokens_past_the_slot_says_how_to_raise_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4000)
    assert "--ctx-size" in caught.value.message and "--slots" in caught.value.message
