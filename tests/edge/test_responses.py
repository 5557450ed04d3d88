"""The Responses API and sessions through the real local edge, driven by the official `openai`
SDK: stored conversations continued with `previous_response_id` (state in the conversation
Durable Objects), the Responses event stream, sessions keeping a llama.cpp slot warm, and the
answer cache keyed on the resolved conversation."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import asyncio
import os
import secrets

import httpx
import openai
import pytest
from pydantic import BaseModel

from edgellm.access.keys import KeyRing, new_key
from edgellm.config import Config
from edgellm.conversations import conversation_of
from edgellm.deps import Deps
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.emulator.conversation_sqlite import conversation_factory
from edgellm_local.emulator.durable import DEFAULT_MAX_LIVE, LocalDurableObjectNamespace
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.llama.slot_pool import SlotPool
from tests.conftest import ManualClock

MODEL = "@cf/meta/llama-2-7b-chat-int8"
NO_CACHE = {"cf-aig-skip-cache": "true"}


@pytest.fixture(scope="module")
def pooled_runner(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> LlamaCppRunner:
    return LlamaCppRunner(tiny_model, n_ctx=2048, n_parallel=2, threads=1,
                          slot_dir=tmp_path_factory.mktemp("edge-slots"), cache_ram_mib=0).load()


@pytest.fixture
def conversational(make_deps: Callable[..., Deps], pooled_runner: LlamaCppRunner, tmp_path: Path) -> Callable[..., Deps]:
    """Deps of the local edge as `edgellm dev` builds them: a slot pool and conversation objects."""

    def make(config: Config | None = None, clock: Any = None, max_live: int = DEFAULT_MAX_LIVE, **overrides: Any) -> Deps:
        config = config or Config(open_access=True)  # keys are tenant tests' own (below, and test_access.py)
        clock = clock or ManualClock()
        ai = LlamaCppAI.for_config(config, pooled_runner)
        ai.slots = SlotPool(pooled_runner)
        namespace = LocalDurableObjectNamespace(conversation_factory(tmp_path / "conversations", config, clock),
                                                class_name="Conversation", max_live=max_live)
        return make_deps(config=config, clock=clock, ai=ai, conversations=namespace, **overrides)

    return make


@pytest.fixture
def server(start_edge: Callable[..., EdgeServer], conversational: Callable[..., Deps]) -> EdgeServer:
    return start_edge(conversational())


@pytest.fixture
def client(server: EdgeServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused-locally", max_retries=0, timeout=60) as sdk:
        yield sdk


def test_responses_create_retrieve_and_models_retrieve(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Say hello", max_output_tokens=8, temperature=0,
                                       extra_headers=NO_CACHE)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == MODEL
    assert response.output_text and response.status == "incomplete"  # the tiny model always uses its whole budget
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 8 and response.usage.input_tokens > 0
    assert response.usage.input_tokens_details.cached_tokens == 0
    stored = client.responses.retrieve(response.id)
    assert stored.output_text == response.output_text and stored.id == response.id
    assert stored.output[0].id == response.output[0].id and stored.usage == response.usage
    model = client.models.retrieve(MODEL)  # model ids hold slashes
    assert model.id == MODEL and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("@cf/no/such-model")


def test_a_streamed_response_has_the_responses_events(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="Tell me a story", max_output_tokens=6, temperature=0,
                                          stream=True, extra_headers=NO_CACHE))
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.incomplete"
    assert types.count("response.output_text.delta") >= 1 and "response.output_text.done" in types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response  # type: ignore[union-attr]
    assert text == done.text == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert client.responses.retrieve(final.id).output_text == text  # stored before the stream ended
    whole = client.responses.create(model=MODEL, input="Tell me a story", max_output_tokens=6, temperature=0, extra_headers=NO_CACHE)
    assert whole.output_text == text


def test_the_sdks_stream_helper_accumulates_the_events(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Hi there", max_output_tokens=5, temperature=0, extra_headers=NO_CACHE) as stream:
        events = list(stream)  # the helper rebuilds the response from every event, item and part
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and deltas[-1].snapshot == "".join(e.delta for e in deltas)
    # a budget-capped answer ends with `response.incomplete`, as OpenAI's does (the helper's
    # get_final_response() only accepts `response.completed`, for OpenAI too)
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == deltas[-1].snapshot  # type: ignore[union-attr]


def test_five_turns_via_previous_response_id_equal_the_whole_history_and_reuse_the_cache(client: openai.OpenAI) -> None:
    previous: str | None = None
    history: list[dict[str, str]] = [{"role": "system", "content": "You are terse."}]
    cached, inputs = [], []
    for turn in range(5):
        question = f"Question number {turn}: what comes next after {turn}?"
        response = client.responses.create(model=MODEL, input=question, instructions="You are terse.", previous_response_id=previous,
                                           max_output_tokens=6, temperature=0, extra_headers=NO_CACHE)
        history.append({"role": "user", "content": question})
        whole = client.chat.completions.create(model=MODEL, messages=history, max_tokens=6, temperature=0,  # type: ignore[arg-type]
                                               extra_headers=NO_CACHE)
        assert response.output_text == whole.choices[0].message.content, turn
        history.append({"role": "assistant", "content": response.output_text})
        assert response.previous_response_id == previous
        assert response.usage is not None
        cached.append(response.usage.input_tokens_details.cached_tokens)
        inputs.append(response.usage.input_tokens + response.usage.output_tokens)
        previous = response.id
    assert cached[0] == 0
    for turn in range(1, 5):
        # each turn reused the whole previous turn, prompt and answer, and more: the slot was
        # readied for it (the answer's end and this message's opening computed after the answer)
        assert cached[turn] > inputs[turn - 1] and cached[turn] > cached[turn - 1], (cached, inputs)


def test_store_false_is_not_retrievable_nor_continuable(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="x", store=False, max_output_tokens=3, temperature=0)
    assert response.store is False
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(response.id)
    assert info.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="y", previous_response_id=response.id, max_output_tokens=3)


def test_delete_removes_a_response(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="one", max_output_tokens=3, temperature=0)
    second = client.responses.create(model=MODEL, input="two", previous_response_id=first.id, max_output_tokens=3, temperature=0)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    # as on OpenAI, a response GET still finds can be continued: GET and continue agree (the
    # deleted turn is gone from the history)
    assert client.responses.retrieve(second.id).id == second.id
    third = client.responses.create(model=MODEL, input="three", previous_response_id=second.id, max_output_tokens=3)
    assert third.previous_response_id == second.id
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_not-an-id")


def test_stored_responses_expire_after_the_ttl(start_edge: Callable[..., EdgeServer], conversational: Callable[..., Deps]) -> None:
    clock = ManualClock()
    server = start_edge(conversational(config=Config(open_access=True, conversation_ttl=3600), clock=clock))
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk:
        response = sdk.responses.create(model=MODEL, input="x", max_output_tokens=3, temperature=0)
        clock.advance(3599)
        assert sdk.responses.retrieve(response.id).id == response.id
        clock.advance(1)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(response.id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.create(model=MODEL, input="y", previous_response_id=response.id, max_output_tokens=3)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))  # the server runs in this process, on a thread


def unknown_response_id() -> str:
    return f"resp_{secrets.token_hex(16)}{secrets.token_hex(8)}"  # well formed: it reaches a conversation object


def test_unknown_response_ids_leave_no_descriptor_file_or_instance_behind(start_edge: Callable[..., EdgeServer],
                                                                         conversational: Callable[..., Deps], tmp_path: Path) -> None:
    """Any client may look up random ids: each lands on an object of its own, which must not keep
    a SQLite connection, a file, or itself for the life of the server."""
    server = start_edge(conversational(max_live=8))
    namespace = server.app.deps.conversations
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.get(f"/v1/responses/{unknown_response_id()}").status_code == 404  # the connection is open now
        before = open_fds()
        assert [http.get(f"/v1/responses/{unknown_response_id()}").status_code for _ in range(300)] == [404] * 300
        assert open_fds() - before <= 2
    assert len(namespace.names) <= 8 and namespace.evictions >= 301 - 8
    assert not list((tmp_path / "conversations").glob("*.sqlite3"))


def test_an_evicted_conversation_still_answers_from_its_stored_data(start_edge: Callable[..., EdgeServer],
                                                                    conversational: Callable[..., Deps]) -> None:
    server = start_edge(conversational(max_live=2))
    namespace = server.app.deps.conversations
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60) as sdk:
        first = sdk.responses.create(model=MODEL, input="one", max_output_tokens=3, temperature=0, extra_headers=NO_CACHE)
        second = sdk.responses.create(model=MODEL, input="two", previous_response_id=first.id, max_output_tokens=3,
                                      temperature=0, extra_headers=NO_CACHE)
        conversation = conversation_of(first.id)
        assert conversation is not None
        for _ in range(3):
            with pytest.raises(openai.NotFoundError):
                sdk.responses.retrieve(unknown_response_id())
        assert not any(name.endswith(conversation) for name in namespace.names)  # its instance was evicted
        assert sdk.responses.retrieve(second.id).output_text == second.output_text  # rebuilt from its file
        third = sdk.responses.create(model=MODEL, input="three", previous_response_id=second.id, max_output_tokens=3,
                                     temperature=0, extra_headers=NO_CACHE)  # the whole chain read back
        assert third.previous_response_id == second.id and third.usage is not None
        assert third.usage.input_tokens > second.usage.input_tokens  # type: ignore[union-attr]


def test_a_conversation_past_its_size_cap_is_a_400(start_edge: Callable[..., EdgeServer], conversational: Callable[..., Deps]) -> None:
    server = start_edge(conversational(config=Config(open_access=True, conversation_max_bytes=3500)))
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk:
        bulky = {f"k{i}": "v" * 500 for i in range(4)}  # stored with the response, never seen by the model
        first = sdk.responses.create(model=MODEL, input="a", metadata=bulky, max_output_tokens=3, temperature=0)
        with pytest.raises(openai.BadRequestError) as info:
            sdk.responses.create(model=MODEL, input="b", metadata=bulky, previous_response_id=first.id, max_output_tokens=3, temperature=0)
        small = sdk.responses.create(model=MODEL, input="c", previous_response_id=first.id, max_output_tokens=3, temperature=0)
        assert small.previous_response_id == first.id
    assert info.value.code == "conversation_too_large"


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}, "input[0].content[0]"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
])
def test_unsupported_fields_are_a_clear_400(client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": "x", **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**body)
    assert info.value.param == param and param.split("[")[0] in info.value.message


class Weather(BaseModel):
    temperature: int
    sunny: bool


def test_text_format_gives_json_of_the_schema_plain_streamed_and_parsed(client: openai.OpenAI) -> None:
    """Structured outputs on the Responses API: `text.format` goes through chat's response_format
    (llama.cpp grammars locally), so even the tiny model answers JSON that fits the schema."""
    fmt = {"type": "json_schema", "name": "weather", "schema": Weather.model_json_schema(), "strict": True}
    ask = {"model": MODEL, "input": "What is the weather in Paris?", "max_output_tokens": 120, "temperature": 0, "extra_headers": NO_CACHE}
    whole = client.responses.create(text={"format": fmt}, **ask)  # type: ignore[arg-type]
    Weather.model_validate_json(whole.output_text)
    assert whole.text is not None and whole.text.format.type == "json_schema"
    assert client.responses.retrieve(whole.id).text.format.type == "json_schema"  # type: ignore[union-attr]
    events = list(client.responses.create(text={"format": fmt}, stream=True, **ask))  # type: ignore[arg-type]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    parsed = client.responses.parse(text_format=Weather, **ask)  # the SDK's own helper builds the format
    assert isinstance(parsed.output_parsed, Weather)
    loose = client.responses.create(text={"format": {"type": "json_object"}}, **ask)  # type: ignore[arg-type]
    assert loose.output_text.startswith("{")  # grammar-constrained (the tiny model's strings may outrun the budget)


def test_text_format_is_refused_by_name_where_the_model_cannot_honour_it(start_edge: Callable[..., EdgeServer],
                                                                        conversational: Callable[..., Deps]) -> None:
    server = start_edge(conversational(config=Config(open_access=True, model_capabilities={MODEL: []})))
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused-locally", max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as info:
            sdk.responses.create(model=MODEL, input="x", text={"format": {"type": "json_object"}})
    assert (info.value.param, info.value.code) == ("text.format", "unsupported_parameter")
    assert "'text.format' is not supported by the model" in info.value.message


def test_deterministic_responses_are_cached_keyed_on_the_resolved_conversation(server: EdgeServer) -> None:
    url = f"{server.url}/v1/responses"
    body = {"model": MODEL, "input": "Cache me", "max_output_tokens": 4, "temperature": 0}
    with httpx.Client(timeout=60) as http:
        first, again = http.post(url, json=body), None
        server.drain()
        again = http.post(url, json=body)
        assert (first.headers["cf-aig-cache-status"], again.headers["cf-aig-cache-status"]) == ("MISS", "HIT")
        assert again.json()["output"][0]["content"] == first.json()["output"][0]["content"]
        assert again.json()["id"] != first.json()["id"]
        # two conversations with the same history continue from the same cache entry
        follow = {**body, "input": "And then?"}
        one = http.post(url, json={**follow, "previous_response_id": first.json()["id"]})
        server.drain()
        two = http.post(url, json={**follow, "previous_response_id": again.json()["id"]})
        assert (one.headers["cf-aig-cache-status"], two.headers["cf-aig-cache-status"]) == ("MISS", "HIT")
        # and the same input on a different history is a different entry
        other = http.post(url, json={**follow, "previous_response_id": one.json()["id"]})
        assert other.headers["cf-aig-cache-status"] == "MISS"
        # the stored chain continues from a cached answer too
        chain = http.get(f"{server.url}/v1/responses/{two.json()['id']}").json()
        assert chain["previous_response_id"] == again.json()["id"]


def test_chat_completions_reuse_the_cache_through_a_session(client: openai.OpenAI) -> None:
    messages: list[dict[str, str]] = [{"role": "user", "content": "Start a long conversation about rivers and lakes"}]
    cached, prompts = [], []
    for turn in range(3):
        completion = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,  # type: ignore[arg-type]
                                                    extra_headers={**NO_CACHE, "x-session-affinity": "chat-session-1"})
        usage = completion.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached.append(usage.prompt_tokens_details.cached_tokens)
        prompts.append(usage.prompt_tokens)
        messages += [{"role": "assistant", "content": completion.choices[0].message.content or ""},
                     {"role": "user", "content": f"and then {turn}?"}]
    assert cached[0] == 0 and all(cached[t] >= prompts[t - 1] - 1 for t in (1, 2)), (cached, prompts)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,  # type: ignore[arg-type]
                                           extra_body={"prompt_cache_key": "other"}, extra_headers=NO_CACHE)
    assert plain.usage is not None and plain.usage.prompt_tokens_details is not None
    assert plain.usage.prompt_tokens_details.cached_tokens == 0  # another session never reuses this one's cache


def keyed_tenants(deps: Deps, *tenants: str, **limits: Any) -> dict[str, dict[str, str]]:
    """A key per tenant in the edge's KV; the headers that present it."""
    headers = {}
    for tenant in tenants:
        made = new_key(tenant, deps.clock.now(), **limits)
        asyncio.run(KeyRing(deps.kv).put(made.record))
        headers[tenant] = {"authorization": f"Bearer {made.api_key}"}
    return headers


def test_a_tenant_never_reads_continues_or_deletes_another_tenants_responses(start_edge: Callable[..., EdgeServer],
                                                                              conversational: Callable[..., Deps]) -> None:
    deps = conversational(Config())  # keys required
    keys = keyed_tenants(deps, "alice", "bob")
    server = start_edge(deps)
    url = f"{server.url}/v1/responses"
    body = {"model": MODEL, "input": "Alice's plan", "max_output_tokens": 4, "temperature": 0}
    with httpx.Client(timeout=60) as http:
        made = http.post(url, json=body, headers=keys["alice"])
        assert made.status_code == 200, made.text
        rid = made.json()["id"]
        assert http.get(f"{url}/{rid}", headers=keys["bob"]).status_code == 404
        assert http.post(url, json={**body, "previous_response_id": rid}, headers=keys["bob"]).json()["error"]["code"] == "response_not_found"
        assert http.delete(f"{url}/{rid}", headers=keys["bob"]).status_code == 404
        assert http.get(f"{url}/{rid}", headers=keys["alice"]).json()["id"] == rid  # untouched by bob's delete
        assert http.post(url, json={**body, "previous_response_id": rid}, headers=keys["alice"]).status_code == 200


def test_responses_hold_the_keys_model_list_like_chat(start_edge: Callable[..., EdgeServer], conversational: Callable[..., Deps]) -> None:
    deps = conversational(Config())
    keys = keyed_tenants(deps, "carol", models=("@cf/meta/llama-2-7b-chat-hf-lora",))
    server = start_edge(deps)
    refused = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2},
                         headers=keys["carol"], timeout=60)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"


def test_two_tenants_naming_the_same_session_never_share_a_prompt_cache(start_edge: Callable[..., EdgeServer],
                                                                        conversational: Callable[..., Deps]) -> None:
    deps = conversational(Config())
    keys = keyed_tenants(deps, "alice", "bob")
    server = start_edge(deps)
    messages = [{"role": "user", "content": "A long question about rivers, lakes and the sea"}]

    def ask(tenant: str) -> int:
        response = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                              json={"model": MODEL, "messages": messages, "max_tokens": 3, "temperature": 0},
                              headers={**keys[tenant], **NO_CACHE, "x-session-affinity": "shared-name"})
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert ask("alice") == 0
    assert ask("alice") > 0  # the session is warm for alice
    assert ask("bob") == 0  # the same name, the same prompt: bob's session is his own
