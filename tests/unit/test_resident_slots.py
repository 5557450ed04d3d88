"""Resident slots (`LlamaCppRunner.resident`): llama.cpp slots that hold conversations' states but
never compute beyond `n_parallel` at once. With a real llama.cpp runner of 1 generating slot and
2 resident ones, three interleaved conversations each come back warm to their own slot, with no
save and no restore, while only one generation runs at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import pytest

import gguf

from edgellm.config import Config
from edgellm_local.edge import EdgeSettings, build_deps
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.model_file import RESIDENT_MOST, default_model_path, kv_bytes_per_token, resident_slots_within
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.slot_pool import SlotPool
from edgellm_local.llama.slot_state import model_identity
from tests.support.tiny_gguf import TinyLlamaShape
from tests.unit.test_slot_pool import Conversation, pool, pooled, reference  # noqa: F401  (fixtures)

CONFIG = Config()


@pytest.fixture(scope="module")
def pooled_runner(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppRunner]:
    """1 generating slot and 2 resident ones: test_slot_pool's `pool`, `pooled` and `reference` run on it."""
    runner = LlamaCppRunner(tiny_model, n_ctx=512, n_parallel=1, resident=2, threads=1,
                            slot_dir=tmp_path_factory.mktemp("resident-slots"), cache_ram_mib=0)
    yield runner.load()
    runner.close()


async def test_three_conversations_stay_warm_in_one_generating_and_two_resident_slots(
    pooled: LlamaCppAI, reference: LlamaCppAI, pool: SlotPool,
) -> None:
    conversations = [Conversation(name) for name in "abc"]
    for i in range(3):
        for conversation in conversations:
            seen = await conversation.turn(pooled, reference, i)  # the same text as the whole history computed anew
            if i:
                assert seen["cached"] >= seen["previous_prompt"] - 1, (conversation.name, i, seen)
    await pool.idle()
    assert (pool.stats.warm, pool.stats.saves, pool.stats.restores) == (6, 0, 0)
    assert {pool.owner(slot) for slot in range(3)} == {"a", "b", "c"}
    assert pool.describe()["slots"] == 3 and pool.describe()["generating_at_once"] == 1


async def test_no_more_generations_at_once_than_the_runner_computes(pool: SlotPool) -> None:
    first = await pool.acquire("x")
    second = asyncio.ensure_future(pool.acquire("y"))
    try:
        for _ in range(100):  # until `y` has looked for a slot (a resident one is idle) and waits
            if pool.waiting or second.done():
                break
            await asyncio.sleep(0)
        assert not second.done() and pool.describe()["busy"] == 1
    finally:
        await pool.release(first.slot)
        lease = await asyncio.wait_for(second, 30)
        await pool.release(lease.slot)
    assert lease.slot != first.slot  # `x` keeps its state in its slot; `y` takes a resident one


def test_every_slot_is_as_large_as_a_generating_one(pooled_runner: LlamaCppRunner, tiny_model: Path, tmp_path: Path) -> None:
    assert pooled_runner.slot_context == 512 and pooled_runner.slots == 3
    # a state saved by a runner without resident slots is not this runner's, nor the reverse
    plain = LlamaCppRunner(tiny_model, n_ctx=512, n_parallel=1, threads=1, slot_dir=tmp_path, cache_ram_mib=0)
    assert model_identity(plain) != model_identity(pooled_runner)
    with pytest.raises(ValueError):
        LlamaCppRunner(tiny_model, resident=-1)


async def test_a_resident_slot_holds_a_whole_slot_context(pooled: LlamaCppAI, pool: SlotPool, pooled_runner: LlamaCppRunner) -> None:
    """llama.cpp gives every slot n_ctx / slots tokens: were its context not grown with the resident
    slots, a prompt near `slot_context` would not fit in one (a 400 from llama.cpp)."""
    holders = [Conversation(name) for name in "pq"]
    for conversation in holders:  # the generating slot and one resident slot taken
        await pooled.run(CONFIG.model, {"messages": [*conversation.messages, {"role": "user", "content": "hi"}],
                                        "temperature": 0, "max_tokens": 2}, session=conversation.name)
    long_text = " ".join(["word"] * 110)  # ~350 tokens with the template: more than 512 / 3, less than 512
    result = await pooled.run(CONFIG.model, {"messages": [{"role": "user", "content": long_text}],
                                             "temperature": 0, "max_tokens": 4}, session="long")
    assert result["usage"]["prompt_tokens"] > pooled_runner.slot_context // 3
    assert pool.stats.saves == 0  # the third conversation took the last resident slot, nobody was evicted


def test_kv_bytes_per_token_is_read_from_the_gguf_shape(tiny_model: Path, tmp_path: Path) -> None:
    shape = TinyLlamaShape()
    assert kv_bytes_per_token(tiny_model) == shape.n_layer * shape.n_head_kv * 2 * shape.head_dim * 2  # keys and values, f16
    assert kv_bytes_per_token(default_model_path()) == 30 * 3 * (64 + 64) * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64
    bare = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(str(bare), "llama")
    writer.add_name("no shape")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert kv_bytes_per_token(bare) is None
    assert resident_slots_within(bare, 2048, 1 << 30) == 0


def test_resident_slots_are_sized_by_the_memory_budget(tmp_path: Path) -> None:
    model = default_model_path()
    per_slot = 30 * 3 * 128 * 2 * 2048  # ~47 MB
    assert resident_slots_within(model, 2048, 512 * 1024 * 1024) == RESIDENT_MOST
    assert resident_slots_within(model, 2048, 2 * per_slot + 1) == 2
    assert resident_slots_within(model, 2048, per_slot - 1) == 0
    # `edgellm dev`'s composition: as many as fit unless asked, exactly what is asked otherwise
    auto = build_deps(EdgeSettings(model_path=model, state_dir=tmp_path / "auto", public_dir=None))
    asked = build_deps(EdgeSettings(model_path=model, state_dir=tmp_path / "asked", public_dir=None, resident_slots=1))
    small = build_deps(EdgeSettings(model_path=model, state_dir=tmp_path / "small", public_dir=None, resident_budget_mib=100))
    assert [deps.ai.models[CONFIG.model].resident for deps in (auto, asked, small)] == [RESIDENT_MOST, 1, 2]  # type: ignore[attr-defined]
    assert auto.ai.slots.describe()["slots"] == 2 + RESIDENT_MOST  # type: ignore[attr-defined]
    for deps in (auto, asked, small):
        deps.usage.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("header", [b"GGUF\x03\x00\x00\x00garbage", b"GGUF\x03\x00\x00\x00" + b"\x00" * 8 + b"\x05" + b"\x00" * 7 + b"\xff" * 40])
def test_a_truncated_or_corrupt_header_sizes_no_resident_slots(tmp_path: Path, header: bytes) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(header)  # llama.cpp's load then refuses it, as `edgellm dev` reports
    assert kv_bytes_per_token(broken) is None and resident_slots_within(broken, 2048, 1 << 30) == 0


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_the_model_identity_names_the_ggufs_own_chat_template(tiny_model: Path, tmp_path: Path, which: str) -> None:
    """`model_identity` reads the template with the header scanner (`gguf_metadata`), not
    GGUFReader (~3 s on SmolLM2's vocabulary): the same template text, so the same identity, and
    a runner's own template (`--chat-template`) is another identity."""
    import hashlib

    from edgellm_local.hub.gguf_tokenizer import gguf_value

    path = tiny_model if which == "tiny" else default_model_path()
    template = gguf_value(gguf.GGUFReader(path), "tokenizer.chat_template")
    assert template
    own = LlamaCppRunner(path, n_ctx=512, threads=1, slot_dir=tmp_path, cache_ram_mib=0)
    assert model_identity(own).endswith(":template=" + hashlib.sha256(template.encode()).hexdigest()[:16])
    other = LlamaCppRunner(path, n_ctx=512, threads=1, slot_dir=tmp_path, cache_ram_mib=0, chat_template="{{ messages }}")
    assert model_identity(other) != model_identity(own)


def test_an_answers_facts_cost_nothing_and_the_pool_shows_live(pooled: LlamaCppAI, pool: SlotPool) -> None:
    """Every answer (a HIT too) reads the model's build and capabilities: `describe(live=False)`
    is the same read-only facts every time, with no pool stats computed; `/v1/models` asks for
    them live, the pool's state added."""
    facts = pooled.describe(CONFIG.model, live=False)
    assert facts is pooled.describe(CONFIG.model, live=False)
    assert facts is not None and "slots" not in facts and facts["backend"] == "llama.cpp" and facts["build"]
    with pytest.raises(TypeError):
        facts["build"] = "changed"  # type: ignore[index]
    live = pooled.describe(CONFIG.model)
    assert live is not None and live["slots"] == pool.describe()
    assert {k: v for k, v in live.items() if k != "slots"} == {**facts, "capabilities": list(facts["capabilities"])}
    assert pooled.describe("@cf/not/served", live=False) is None
