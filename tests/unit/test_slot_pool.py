"""The local edge's llama.cpp slot pool, with a real llama.cpp runner of 2 slots: conversations
keep their slot warm, an evicted one's state is saved and restored on its next turn, and a
stale, corrupted or foreign state file is never restored into a conversation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest

from edgellm.config import Config
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.slot_pool import SlotPool
from tests.support.tiny_gguf import write_tiny_gguf

CONFIG = Config()
MODEL = CONFIG.model
SAMPLING = {"temperature": 0, "max_tokens": 6}


@pytest.fixture(scope="module")
def pooled_runner(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppRunner]:
    runner = LlamaCppRunner(tiny_model, n_ctx=1024, n_parallel=2, threads=1,
                            slot_dir=tmp_path_factory.mktemp("slots"), cache_ram_mib=0)
    yield runner.load()


@pytest.fixture
async def pool(pooled_runner: LlamaCppRunner) -> AsyncIterator[SlotPool]:
    pool = SlotPool(pooled_runner)
    yield pool
    await asyncio.wait_for(pool.idle(), 60)  # no save or readying of this test's left to write into the next one's directory


@pytest.fixture
def pooled(pooled_runner: LlamaCppRunner, pool: SlotPool) -> LlamaCppAI:
    return LlamaCppAI({model: pooled_runner for model in CONFIG.models}, CONFIG, slots=pool)


@pytest.fixture
def reference(tiny_runner: LlamaCppRunner) -> LlamaCppAI:
    """The same model with no sessions: every turn computes the whole history."""
    return LlamaCppAI.for_config(CONFIG, tiny_runner)


class Conversation:
    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: list[dict[str, str]] = [{"role": "system", "content": f"You are helper {name}."}]
        self.last_prompt_tokens = 0
        self.last_completion_tokens = 0

    async def turn(self, ai: LlamaCppAI, reference: LlamaCppAI, i: int) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": f"Question {i} from {self.name}: tell me about {self.name * (i + 1)}"})
        result = await ai.run(MODEL, {"messages": self.messages, **SAMPLING}, session=self.name)
        expected = await reference.run(MODEL, {"messages": self.messages, **SAMPLING})
        assert result["response"] == expected["response"], (self.name, i)
        self.messages.append({"role": "assistant", "content": result["response"]})
        usage = result["usage"]
        previous, self.last_prompt_tokens = self.last_prompt_tokens, usage["prompt_tokens"]
        held, self.last_completion_tokens = previous + self.last_completion_tokens, usage["completion_tokens"]
        # `held`: the previous turn's prompt and answer. A slot left as its generation ended holds
        # at most held - 1 of them (the last token sampled is never computed), so reusing more
        # than `held` means the slot was readied for this turn (llama.cpp computed the previous
        # answer's end and this message's opening after that answer).
        return {"cached": usage["prompt_tokens_details"]["cached_tokens"], "previous_prompt": previous, "held": held}


async def test_six_interleaved_conversations_on_two_slots_each_restore_their_own_state(
    pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool,
) -> None:
    conversations = [Conversation(name) for name in "abcdef"]
    for i in range(4):
        for conversation in conversations:
            seen = await conversation.turn(pooled, reference, i)
            if i == 0:
                assert seen["cached"] == 0  # a new conversation never starts from another's cache
            else:  # its own state came back, as readied for this turn after its last answer
                assert seen["cached"] > seen["held"], (conversation.name, i, seen)
    await pool.idle()
    assert pool.stats.restores == 6 * 3 and pool.stats.refused == 0
    assert pool.stats.prepared == 6 * 4  # each readied before it was saved
    # every turn's state was saved once: a's and b's first when c and d took their slots, every
    # later one as its generation ended (written behind, once conversations shared slots)
    assert pool.stats.saves == 6 * 4
    assert pool.describe()["saved_states"] == 6


async def test_two_conversations_on_two_slots_stay_warm(pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool) -> None:
    conversations = [Conversation("x"), Conversation("y")]
    for i in range(3):
        for conversation in conversations:
            seen = await conversation.turn(pooled, reference, i)
            assert i == 0 or seen["cached"] >= seen["previous_prompt"] - 1
    assert (pool.stats.warm, pool.stats.saves, pool.stats.restores) == (4, 0, 0)


async def evict(pooled: LlamaCppAI, reference: LlamaCppAI, *names: str) -> None:
    for name in names:
        await Conversation(name).turn(pooled, reference, 0)


@pytest.mark.parametrize("damage", ["corrupt", "foreign", "truncated", "missing", "directory"])
async def test_a_damaged_or_foreign_state_file_is_refused(
    pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool, damage: str,
) -> None:
    a, b = Conversation("a"), Conversation("b")
    await a.turn(pooled, reference, 0)
    await b.turn(pooled, reference, 0)
    await evict(pooled, reference, "c", "d")  # both a and b are saved to disk now
    target, other = pool.saved("a"), pool.saved("b")
    assert target is not None and other is not None
    data = target.path.read_bytes()
    if damage == "corrupt":
        middle = len(data) // 2
        target.path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    elif damage == "foreign":
        target.path.write_bytes(other.path.read_bytes())
    elif damage == "truncated":
        target.path.write_bytes(data[: len(data) - 100])
    elif damage == "directory":  # the file replaced by a directory of its name
        target.path.unlink()
        target.path.mkdir()
        (target.path / "inside").write_bytes(b"x")
    else:
        target.path.unlink()
    damaged = target.path.read_bytes() if target.path.is_file() else None
    seen = await a.turn(pooled, reference, 1)  # the text is still right: computed in full
    assert seen["cached"] == 0
    assert pool.stats.refused == 1 and pool.stats.restores == 0
    await pool.idle()
    assert pool.saved("a") is not target  # the refused file is not kept: a copy now is this turn's own
    assert damaged is None or not target.path.exists() or target.path.read_bytes() != damaged
    seen = await b.turn(pooled, reference, 1)  # b's own, intact state still restores
    assert seen["cached"] >= seen["previous_prompt"] - 1 and pool.stats.restores == 1


@pytest.fixture(scope="module")
def other_runners(pooled_runner: LlamaCppRunner, tmp_path_factory: pytest.TempPathFactory) -> dict[str, LlamaCppRunner]:
    """Runners a saved state must not be restored into, each writing its slot states into the
    pool's own directory: another GGUF of the very same shape (another seed: llama.cpp would load
    the state without complaint), the same GGUF with a larger context, the same GGUF under
    another chat template."""
    other_gguf = write_tiny_gguf(tmp_path_factory.mktemp("other-model") / "tiny-bpe-seed1.gguf", vocab="bpe", seed=1)
    same = dict(n_parallel=2, threads=1, slot_dir=pooled_runner.slot_dir, cache_ram_mib=0)
    return {
        "another-gguf": LlamaCppRunner(other_gguf, n_ctx=1024, **same).load(),  # type: ignore[arg-type]
        "another-context": LlamaCppRunner(pooled_runner.path, n_ctx=2048, **same).load(),  # type: ignore[arg-type]
        "another-template": LlamaCppRunner(pooled_runner.path, n_ctx=1024, chat_template="zephyr", **same).load(),  # type: ignore[arg-type]
    }


@pytest.mark.parametrize("change", ["another-gguf", "another-context", "another-template"])
async def test_a_state_saved_under_another_model_is_refused(
    pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool, other_runners: dict[str, LlamaCppRunner], change: str,
) -> None:
    """The pool's runner replaced (a reload, a rebuilt runner): a state the previous model saved
    is never restored into the new one, which computes the turn in full."""
    a = Conversation("a")
    await a.turn(pooled, reference, 0)
    await evict(pooled, reference, "b", "c")  # c took a's slot: a's state is on disk
    saved = pool.saved("a")
    assert saved is not None and saved.path.is_file()
    original, other = pool.runner, other_runners[change]
    pool.runner = other
    try:
        ai = LlamaCppAI({model: other for model in CONFIG.models}, CONFIG, slots=pool)
        a.messages.append({"role": "user", "content": "And the next question?"})
        result = await ai.run(MODEL, {"messages": a.messages, **SAMPLING}, session="a")
        assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, change
        assert (pool.stats.refused, pool.stats.restores) == (1, 0), change
        await pool.idle()
    finally:
        pool.runner = original


async def test_saved_states_stay_within_the_disk_budget(pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool) -> None:
    conversations = [Conversation(name) for name in "pqrs"]
    for conversation in conversations:
        await conversation.turn(pooled, reference, 0)
    first = pool.saved("p")
    assert first is not None
    pool.disk_budget = first.size + 10  # room for one saved state
    for conversation in conversations[:2]:
        await conversation.turn(pooled, reference, 1)
    await pool.idle()
    assert pool.stats.dropped >= 1
    assert sum(1 for _ in pool.directory.glob("*.slot")) <= 1
    assert pool.describe()["saved_bytes"] <= pool.disk_budget


async def test_a_pooled_stream_holds_its_slot_until_it_ends(pooled: LlamaCppAI, pool: SlotPool) -> None:
    events = await pooled.stream(MODEL, {"messages": [{"role": "user", "content": "hi"}], **SAMPLING}, session="s")
    assert pool.owner(0) == "s" or pool.owner(1) == "s"
    chunks = [e async for e in events]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    events = await pooled.stream(MODEL, {"messages": [{"role": "user", "content": "hi"}], **SAMPLING}, session="s")
    chunks = [e async for e in events]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert pool.stats.warm == 1


async def test_a_request_without_a_session_never_starts_from_another_ones_cache(pooled: LlamaCppAI, pool: SlotPool) -> None:
    body = {"messages": [{"role": "user", "content": "the same long question, asked twice"}], **SAMPLING}
    for _ in range(3):
        result = await pooled.run(MODEL, body)
        assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_requests_without_a_session_reuse_their_own_tenants_prefix_never_anothers(pooled: LlamaCppAI, pool: SlotPool) -> None:
    """A tenant's sessionless requests reuse the prompt prefix its earlier ones left in
    a slot (llama.cpp's `cache_prompt`), and a slot is erased before another tenant's request
    uses it, so the same prompt from tenant c, landing on the slot a's prompt is in, computes all."""
    body = {"messages": [{"role": "user", "content": "the same long question, asked by several tenants"}], **SAMPLING}

    async def cached(scope: str) -> int:
        return (await pooled.run(MODEL, body, prefix_scope=scope))["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert await cached("a") == 0
    assert await cached("a") > 0  # its own earlier prompt
    assert await cached("b") == 0  # the other slot, empty
    assert await cached("c") == 0  # a's slot (the least recently used), erased first
    assert await cached("b") > 0
    assert await cached("a") == 0  # c's slot now: erased again
    assert pool.stats.scoped == 2

    async def new_conversation(tenant: str) -> int:
        as_tenant(tenant)
        result = await pooled.run(MODEL, body, session=f"{tenant}:new")
        return result["usage"]["prompt_tokens_details"]["cached_tokens"]

    # a new conversation (no state of its own) starts from its tenant's state, never another's:
    # a's goes to a's slot, not to b's (the least recently used), and keeps it in place; d's then
    # lands on b's, erased
    assert await new_conversation("a") > 0
    assert await new_conversation("d") == 0
    assert pool.stats.shared == 1


def test_requests_waiting_for_a_slot_share_no_io_under_request_isolation(pooled_runner: LlamaCppRunner) -> None:
    """Five requests from five sessions on 2 slots, each in its own request context on the local
    edge's isolating loop: three must wait, and are woken without one request resolving another's future."""
    from edgellm_local.emulator.isolation import request_context, run

    async def main() -> list[int]:
        ai = LlamaCppAI({MODEL: pooled_runner}, CONFIG, slots=SlotPool(pooled_runner))

        async def one(name: str) -> int:
            with request_context(name):
                body = {"messages": [{"role": "user", "content": f"hello from {name}"}], **SAMPLING}
                return (await ai.run(MODEL, body, session=name))["usage"]["completion_tokens"]

        return await asyncio.gather(*[asyncio.ensure_future(one(f"s{i}")) for i in range(5)])

    assert run(main()) == [SAMPLING["max_tokens"]] * 5


async def test_a_conversations_slot_is_readied_for_its_next_turn(pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool) -> None:
    """After each answer, llama.cpp computes the answer's end and the next user message's
    opening into the slot: the next turn reuses them (the text staying that of the whole history)."""
    conversation = Conversation("ready")
    for i in range(3):
        seen = await conversation.turn(pooled, reference, i)
        assert i == 0 or seen["cached"] > seen["held"], (i, seen)
        await pool.idle()
        assert pool.stats.prepared == i + 1
    events = await pooled.stream(MODEL, {"messages": conversation.messages + [{"role": "user", "content": "and a streamed one"}],
                                         **SAMPLING}, session="ready")
    chunks = [e async for e in events]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > conversation.last_prompt_tokens + conversation.last_completion_tokens
    await pool.idle()
    assert pool.stats.prepared == 4


async def test_no_slot_is_readied_for_a_stream_that_was_left_nor_without_a_session(pooled: LlamaCppAI, pool: SlotPool) -> None:
    body = {"messages": [{"role": "user", "content": "hello there"}], "temperature": 0, "max_tokens": 20}
    events = await pooled.stream(MODEL, body, session="left")
    await anext(events)
    await events.aclose()  # the client left: the answer it would send back is not this one
    await pooled.run(MODEL, body)  # nobody's conversation
    await pool.idle()
    assert pool.stats.prepared == 0


async def test_a_slot_is_not_readied_while_a_request_waits_for_one(pooled_runner: LlamaCppRunner, pool: SlotPool) -> None:
    readied: list[int] = []

    async def ready(slot: int) -> None:
        readied.append(slot)

    first, second = await pool.acquire("p"), await pool.acquire("q")
    third = asyncio.ensure_future(pool.acquire("r"))
    while pool.waiting == 0:  # the third request is queued for a slot
        await asyncio.sleep(0)
    await pool.release(first.slot, ready)  # readying would keep the waiting request from its slot
    lease = await third
    assert lease.slot == first.slot and readied == [] and pool.stats.prepared == 0
    await pool.release(second.slot, ready)  # nobody waits now
    await pool.release(lease.slot)
    await pool.idle()
    assert readied == [second.slot] and pool.stats.prepared == 1


async def test_a_failing_readying_frees_the_slot_and_fails_nothing(pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool) -> None:
    async def broken(slot: int) -> None:
        raise RuntimeError("llama.cpp refused the prefill")

    lease = await pool.acquire("f")
    await pool.release(lease.slot, broken)
    await pool.idle()  # the slot is free again
    assert pool.stats.prepared == 0
    seen = await Conversation("f").turn(pooled, reference, 0)
    assert seen["cached"] == 0


async def test_one_conversation_never_holds_two_slots(pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool) -> None:
    """Its second request, arriving while its slot is still being prepared (the previous owner's
    state being saved), waits for that slot instead of taking the other."""
    await evict(pooled, reference, "a", "b")  # both slots owned, neither saved yet
    first, second = asyncio.ensure_future(pool.acquire("S")), asyncio.ensure_future(pool.acquire("S"))
    lease = await first
    assert not second.done() and [pool.owner(s) for s in (0, 1)].count("S") == 1
    await pool.release(lease.slot)
    again = await second
    assert again.slot == lease.slot and again.warm
    await pool.release(again.slot)


async def test_a_stream_closed_before_its_first_read_frees_its_slot(pooled: LlamaCppAI, pool: SlotPool) -> None:
    events = await pooled.stream(MODEL, {"messages": [{"role": "user", "content": "hi"}], **SAMPLING}, session="unread")
    await events.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(pool.idle(), 30)


async def test_a_cancelled_close_still_frees_the_slot(pooled: LlamaCppAI, pool: SlotPool) -> None:
    events = await pooled.stream(MODEL, {"messages": [{"role": "user", "content": "tell me everything"}],
                                         "temperature": 0, "max_tokens": 400}, session="cancelled-close")
    await anext(events)  # type: ignore[call-overload]
    closing = asyncio.ensure_future(events.aclose())  # type: ignore[attr-defined]
    await asyncio.sleep(0)  # it is inside the close now, waiting for llama.cpp to stop
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await asyncio.wait_for(pool.idle(), 30)


async def test_requests_waiting_for_a_slot_count_in_the_runners_queue(pooled_runner: LlamaCppRunner, pooled: LlamaCppAI, pool: SlotPool) -> None:
    """Beyond the runner's bound a request is refused at once (a 503 with Retry-After at the
    gateway), not queued for a slot without end."""
    from edgellm.ports import CapacityExceeded

    body = {"messages": [{"role": "user", "content": "a long answer please"}], "temperature": 0, "max_tokens": 200}
    pooled_runner.max_waiting = 2
    held = []
    try:
        held = [await pooled.stream(MODEL, body, session=name) for name in ("q1", "q2")]  # both slots generating
        with pytest.raises(CapacityExceeded):
            await asyncio.wait_for(pooled.run(MODEL, body, session="q3"), 30)
    finally:
        pooled_runner.max_waiting = None
        for events in held:
            await events.aclose()  # type: ignore[attr-defined]
    await pool.idle()


async def test_a_sessionless_prompt_goes_to_its_tenants_slot_that_starts_most_like_it(pooled: LlamaCppAI, pool: SlotPool) -> None:
    """llama.cpp's server sends a prompt to the slot whose cache it shares the most
    with (slot similarity); the pool did least-recently-used among the tenant's slots, so two
    alternating conversations without a session (an OpenAI client sends the whole history and no
    session) each recomputed their history on every turn. Among its own tenant's slots only, the
    one whose prompt this one continues now wins: each conversation's second turn reuses its
    first; a new question that shares a long system prompt goes where that prompt is, not to an
    empty slot."""
    asked = {"boats": "Which boats sail fastest upwind?", "trains": "Explain how a steam train works, part by part."}

    def chat(topic: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": asked[topic]}]

    first = {topic: await pooled.run(MODEL, {"messages": chat(topic), **SAMPLING}, prefix_scope="a") for topic in ("boats", "trains")}
    # least recently used would send trains' turn to the boats slot (and the other way round)
    for topic in ("trains", "boats"):
        messages = [*chat(topic), {"role": "assistant", "content": first[topic]["response"]},
                    {"role": "user", "content": "And then?"}]
        result = await pooled.run(MODEL, {"messages": messages, **SAMPLING}, prefix_scope="a")
        cached = result["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= first[topic]["usage"]["prompt_tokens"] - 1, (topic, cached, first[topic]["usage"])
    other = await pooled.run(MODEL, {"messages": chat("boats"), **SAMPLING}, prefix_scope="b")
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # never another tenant's slot


async def test_a_new_question_under_a_long_shared_system_prompt_goes_where_that_prompt_is(pooled: LlamaCppAI, pool: SlotPool) -> None:
    """An empty slot keeps a tenant's other prompts warm, but not at the price of recomputing a
    long system prompt the tenant's own slot already holds (SIMILAR_START)."""
    system = {"role": "system", "content": "You are the harbour's guide. " + "Answer briefly, kindly and only about the harbour. " * 6}
    opening = await pooled.run(MODEL, {"messages": [system, {"role": "user", "content": "When does the ferry leave?"}], **SAMPLING}, prefix_scope="c")
    later = await pooled.run(MODEL, {"messages": [system, {"role": "user", "content": "Where can I park?"}], **SAMPLING}, prefix_scope="c")
    assert later["usage"]["prompt_tokens_details"]["cached_tokens"] >= opening["usage"]["prompt_tokens"] // 2


def test_prompt_text_matches_on_messages_in_order() -> None:
    from edgellm_local.llama.slot_match import common_start, prompt_text

    one = prompt_text({"messages": [{"role": "user", "content": "hello"}]})
    two = prompt_text({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]})
    assert two.startswith(one) and common_start(one, two) == len(one)
    assert common_start("abcdef", "abcxyz") == 3 and common_start("", "abc") == 0 and common_start("abc", "abc") == 3
    assert prompt_text({"prompt": "raw text"}) == "raw text"


async def test_a_tenants_evicted_prompt_is_kept_and_restored_for_it_only(pooled: LlamaCppAI, pool: SlotPool) -> None:
    """llama.cpp's server keeps an evicted prompt in its RAM cache and restores it for a
    prompt that continues it, so three questions asked in turn over 2 slots were answered from
    cache on the second round there and recomputed here. The pool now saves a tenant's
    sessionless prompt before another overwrites it and restores it for that tenant's next
    prompt that continues it; another tenant's identical prompt never gets it."""
    questions = ["Which boats sail fastest upwind?", "Explain how a steam train works.", "Why is the sea salty?"]
    bodies = [{"messages": [{"role": "user", "content": q}], **SAMPLING} for q in questions]
    firsts = [await pooled.run(MODEL, body, prefix_scope="a") for body in bodies]
    again = [await pooled.run(MODEL, body, prefix_scope="a") for body in bodies]
    for first, second in zip(firsts, again):
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1, (first["usage"], second["usage"])
    assert pool.stats.restores >= 2  # one of the three is still in its slot
    other = await pooled.run(MODEL, bodies[0], prefix_scope="b")  # a's states are saved, one is in a slot: b gets neither
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    follow_up = {"messages": [*bodies[1]["messages"], {"role": "assistant", "content": again[1]["response"]},
                              {"role": "user", "content": "And then?"}], **SAMPLING}
    continued = await pooled.run(MODEL, follow_up, prefix_scope="a")
    assert continued["usage"]["prompt_tokens_details"]["cached_tokens"] >= again[1]["usage"]["prompt_tokens"] - 1


async def test_a_kept_prompt_restored_stays_kept_so_rotating_prompts_stop_saving(pooled: LlamaCppAI, pool: SlotPool) -> None:
    """bench_gateway's five questions in turn over 2 slots restored the
    question's kept state and then saved the prompt it evicted, again, on every request: ~2.5 ms
    before the first token for a state already written a round earlier. A kept prompt's copy now
    stays kept when it is restored (it still holds that prompt's start), so once every question
    has been kept once, a round restores each one and saves nothing; and each still reuses its
    prompt."""
    questions = ["Which boats sail fastest upwind?", "Explain how a steam train works.", "Why is the sea salty?"]
    bodies = [{"messages": [{"role": "user", "content": q}], **SAMPLING} for q in questions]
    firsts = [await pooled.run(MODEL, body, prefix_scope="a") for body in bodies]
    for _ in range(2):  # the first of these rounds keeps the prompt the first round left in a slot
        for body in bodies:
            await pooled.run(MODEL, body, prefix_scope="a")
    saves, restores = pool.stats.saves, pool.stats.restores
    again = [await pooled.run(MODEL, body, prefix_scope="a") for body in bodies]
    assert pool.stats.saves == saves, "a round of kept prompts saved a state again"
    assert pool.stats.restores >= restores + len(bodies) - 1  # restored from their kept copies; one stays in its slot
    for first, second in zip(firsts, again):
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1
        assert second["response"] == first["response"]
    other = await pooled.run(MODEL, bodies[0], prefix_scope="b")  # still never another tenant's
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


# a new conversation starts from its tenant's state sharing its prompt's start.
SHARED_SYSTEM = {"role": "system", "content": "You are the harbour's guide. " + "Answer briefly, kindly and only about the harbour. " * 5}


def as_tenant(tenant: str | None) -> None:
    """This task's requests admitted for `tenant`, as the gateway admits them (`admitted_tenant`)."""
    from edgellm.admission import Admission

    Admission().admit(1000, tenant)


class TenantConversation(Conversation):
    """A conversation of a keyed tenant (its session named `<tenant>:<name>`, as the gateway names
    it) under the app's shared system prompt."""

    def __init__(self, tenant: str | None, name: str, system: dict[str, str] = SHARED_SYSTEM) -> None:
        super().__init__(f"{tenant}:{name}" if tenant else name)
        self.tenant = tenant
        self.messages = [system]

    async def turn(self, ai: LlamaCppAI, reference: LlamaCppAI, i: int) -> dict[str, Any]:
        as_tenant(self.tenant)
        seen = await super().turn(ai, reference, i)
        return {**seen, "prompt": self.last_prompt_tokens}


async def system_tokens(reference: LlamaCppAI) -> int:
    """Nine tenths of the prompt tokens of the shared system prompt with an empty user message:
    less than any two conversations under it share (the user message's own start and the
    template's end differ), far more than the chat template's opening."""
    result = await reference.run(MODEL, {"messages": [SHARED_SYSTEM, {"role": "user", "content": ""}], **SAMPLING})
    return int(result["usage"]["prompt_tokens"]) * 9 // 10


async def test_new_conversations_start_from_their_tenants_shared_system_prompt(
    pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool,
) -> None:
    """llama-server reuses a shared system prompt for a new conversation (slot similarity, its RAM
    cache); the pool prefilled every new session cold. Now the second conversation takes a copy
    of the first's idle slot (saved, then restored into the empty slot), and the third and fourth,
    evicting a conversation of their tenant, keep its slot in place: each reuses the system
    prompt. Their own states still come back on their next turns, and every text is the one the
    whole history computes."""
    shared = await system_tokens(reference)
    conversations = [TenantConversation("acme", f"c{i}") for i in range(4)]
    first = await conversations[0].turn(pooled, reference, 0)
    assert first["cached"] == 0  # nothing of the tenant's yet
    for conversation in conversations[1:]:
        await pool.idle()  # c0's slot readied for its next turn (busy till then, it could not be copied)
        seen = await conversation.turn(pooled, reference, 0)
        assert shared <= seen["cached"] < seen["prompt"], (conversation.name, shared, seen)
    assert (pool.stats.shared, pool.stats.copied) == (3, 1)  # c1 from a copy of c0's slot; c2 and c3 in place
    for conversation in conversations:
        seen = await conversation.turn(pooled, reference, 1)
        assert seen["cached"] > seen["held"], (conversation.name, seen)  # its own state, not a shared one
    assert pool.stats.restores == 4


async def test_a_new_conversation_starts_from_its_own_tenants_saved_or_kept_state_never_anothers(
    pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool,
) -> None:
    """Three tenants with the same system prompt: a new conversation starts from a state of its
    own tenant's, whether live in a slot, saved for another conversation or kept for a request
    without a session, and never from another tenant's, wherever that is (another's live slot,
    another's saved state, the slot it lands on)."""
    shared = await system_tokens(reference)
    acme, beta = TenantConversation("acme", "a0"), TenantConversation("beta", "b0")
    assert (await acme.turn(pooled, reference, 0))["cached"] == 0
    assert (await beta.turn(pooled, reference, 0))["cached"] == 0  # acme's idle slot holds the same prompt: not beta's
    await pool.idle()
    # beta's second conversation: acme's slot (the least recently used) is saved, then beta's own live one copied
    assert (await TenantConversation("beta", "b1").turn(pooled, reference, 0))["cached"] >= shared
    assert pool.stats.copied == 1
    # acme's second, on the slot beta's first held: from acme's saved state, not beta's (saved and live)
    assert (await TenantConversation("acme", "a1").turn(pooled, reference, 0))["cached"] >= shared
    assert pool.stats.copied == 2
    for tenant in ("gamma", None):  # every state is acme's or beta's; a session of no known tenant shares nothing
        assert (await TenantConversation(tenant, "g0").turn(pooled, reference, 0))["cached"] == 0, tenant
    assert (pool.stats.shared, pool.stats.copied) == (2, 2)
    seen = await acme.turn(pooled, reference, 1)
    assert seen["cached"] > seen["held"]  # its own state, still saved after the copy taken from it
    # a request without a session leaves its tenant's prompt kept; a new conversation of the tenant starts from it
    as_tenant("delta")
    alone = await pooled.run(MODEL, {"messages": [SHARED_SYSTEM, {"role": "user", "content": "Is the pier open?"}], **SAMPLING},
                             prefix_scope="delta")
    assert alone["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    for tenant in ("epsilon", "zeta"):  # evict delta's prompt from the slots (kept, under delta's name)
        as_tenant(tenant)
        await pooled.run(MODEL, {"messages": [{"role": "user", "content": f"hello from {tenant}"}], **SAMPLING}, prefix_scope=tenant)
    copied = pool.stats.copied
    assert (await TenantConversation("delta", "d0").turn(pooled, reference, 0))["cached"] >= shared
    assert pool.stats.copied == copied + 1
    assert (await TenantConversation("eta", "h0").turn(pooled, reference, 0))["cached"] == 0


def test_a_sessions_tenant_is_the_admitted_one_only_where_its_name_agrees() -> None:
    from edgellm_local.llama.slot_match import session_scope

    assert session_scope("acme:chat-1", "acme") == "acme"  # a keyed tenant's session
    assert session_scope("chat-1", "default") == "default"  # a keyless caller's bare name, under the default tenant
    assert session_scope("acme:chat-1", "default") is None  # a keyless caller naming another tenant's form
    assert session_scope("beta:chat-1", "acme") is None  # started in another tenant's context (a coalesced flight)
    assert session_scope("chat-1", None) is None


async def test_the_model_identity_is_read_off_the_event_loop(
    pooled_runner: LlamaCppRunner, reference: LlamaCppAI, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading the GGUF's chat template for `model_identity` took ~2.5 s for SmolLM2-135M (GGUFReader;
    the header scanner now takes ~0.1 s, still file I/O); the first save computed it on the loop,
    so a new session's first turn (and every request on the loop) waited for it. It is read in a
    thread from the pool's start."""
    import threading

    from edgellm_local.llama import slot_pool as slots

    loop_thread, readers = threading.current_thread(), []
    real = slots.model_identity
    monkeypatch.setattr(slots, "model_identity", lambda runner: readers.append(threading.current_thread()) or real(runner))
    pool = SlotPool(pooled_runner)
    ai = LlamaCppAI({model: pooled_runner for model in CONFIG.models}, CONFIG, slots=pool)
    await evict(ai, reference, "i1", "i2", "i3")  # the third saves the first's state
    await Conversation("i1").turn(ai, reference, 0)  # and restores it
    await asyncio.wait_for(pool.idle(), 60)
    assert pool.stats.saves >= 1 and pool.stats.restores == 1
    assert readers and loop_thread not in readers
