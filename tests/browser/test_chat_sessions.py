"""The chat page keeps a conversation as a session: in headless Chromium against a local edge
whose llama.cpp slots are pooled, each turn shows its time to first token and the prompt tokens
the model reused, which grow turn by turn; "New chat" starts a new session from an empty cache."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from playwright.async_api import Page, expect

from edgellm.deps import Deps
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.llama.slot_pool import SlotPool

from .conftest import BROWSER_LOOP
from .pages import open_chat, send, turn_note, wait_state

pytestmark = BROWSER_LOOP


@pytest.fixture(scope="module")
def pooled_runner(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> LlamaCppRunner:
    return LlamaCppRunner(tiny_model, n_ctx=2048, n_parallel=2, threads=1,
                          slot_dir=tmp_path_factory.mktemp("page-slots"), cache_ram_mib=0).load()


async def turn_stats(page: Page, n: int) -> dict[str, int]:
    note = page.locator(".message.assistant").nth(n).locator(".turn-stats")
    await expect(note).to_be_visible()
    return {"cached": int(await note.get_attribute("data-cached") or -1),
            "ttft": int(await note.get_attribute("data-ttft") or -1)}


async def ask_turn(page: Page, text: str, done: int) -> None:
    """Send the conversation's next turn; wait for its note (the `done`-th) and the page to be done."""
    await send(page, text)
    await expect(page.locator(".message.assistant .turn-stats")).to_have_count(done, timeout=30_000)
    await wait_state(page, "done")


async def test_turns_reuse_the_cache_and_show_ttft(page: Page, make_deps: Callable[..., Deps], start_edge: Callable[..., EdgeServer],
                                                   pooled_runner: LlamaCppRunner) -> None:
    deps = make_deps()
    ai = LlamaCppAI.for_config(deps.config, pooled_runner)
    ai.slots = SlotPool(pooled_runner)
    edge = start_edge(make_deps(ai=ai))
    await open_chat(page, edge)
    await page.get_by_label("Max tokens").fill("6")
    await page.get_by_label("Deterministic").set_checked(True)
    for i, text in enumerate(["Tell me about rivers.", "And lakes?", "And the sea?"]):
        await ask_turn(page, text, i + 1)
    stats = [await turn_stats(page, i) for i in range(3)]
    assert stats[0]["cached"] == 0
    assert 0 < stats[1]["cached"] < stats[2]["cached"], stats
    assert all(s["ttft"] >= 0 for s in stats)
    await expect(page.locator("#stat-cached")).to_contain_text(f"{stats[2]['cached']} of")
    await expect(turn_note(page)).to_contain_text("prompt tokens cached")

    await page.get_by_role("button", name="New chat").click()
    await ask_turn(page, "Tell me about mountains.", 1)
    assert (await turn_stats(page, 0))["cached"] == 0  # a new session starts from an empty slot
