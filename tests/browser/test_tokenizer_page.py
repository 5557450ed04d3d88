"""The tokenizer page in headless Chromium against a local edge with SmolLM2 published in R2:
the ids it shows are the ids Python `tokenizers` gives, and a reload revalidates with a 304."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from playwright.async_api import Page, expect

from edgellm.ports import BlobStore, R2Conditional, R2Object, R2Range
from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP, PUBLISHED_NAME, TINY_NAME
from .publishing import TokenizerFiles

pytestmark = BROWSER_LOOP

# Everything a user may paste: scripts, emoji sequences, digits, whitespace runs, code, specials.
# (No CR: a textarea's value turns CRLF and lone CR into LF, so a user cannot tokenize one here.)
CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "café naïve résumé Ångström coöperate façade",
    "Straße ß ẞ İstanbul ǅ ﬁ ligature",
    "Ελληνικά, русский язык, עברית, العربية",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "हिन्दी भाषा और ไทย ภาษา",
    "🙂 😀🎉 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ❤️",
    "1234567890 3.14159 -42 1,000,000 0x1F 1e-9",
    "2024-06-01T12:34:56Z $19.99 50% #1",
    "   leading spaces",
    "trailing spaces   ",
    "many     spaces\t\ttabs\n\n\nnewlines\n \n",
    "\u00a0non-breaking\u2003em space\u200bzero width",
    "def add(a, b):\n    return a + b  # sum\n",
    "for (let i = 0; i < n; i++) { console.log(`i=${i}`); }",
    '{"key": [1, 2, {"nested": null}], "ok": true}',
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%ann%';",
    "<div class=\"a\">&amp; &lt;tag&gt;</div>",
    "https://example.com/path?q=a+b&x=%20#frag",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "I'm you're we'll they'd it's CAN'T",
    "mixedCASE snake_case kebab-case PascalCase",
    "a" * 200,
    "∑∫√∞≠≤≥ → ⇒ ∀x∈ℝ",
    "😀" * 12 + "中" * 12,
]

# Where the JS library disagrees with `tokenizers` on SmolLM2's vocabulary (local-stack.md names
# the same families). Both come from regexes written for JS: the Digits pre-tokenizer isolates
# ASCII digits only where Rust isolates every Unicode numeric character (`char::is_numeric`), so
# a space before such a character joins it in the browser but stands alone in Python; and JS's
# `\s` lacks U+0085 (NEL). The tokens still spell the same text; only the split differs.
KNOWN_DIFFERENCES = {
    "a space before a vulgar fraction": "add ½ cup",
    "a space before a Roman numeral": "Chapter Ⅻ",
    "a space before Arabic-Indic digits": "page ٣٤٥",
    "a space before NEL (U+0085), which JS \\s lacks": "x \u0085y",
}


async def open_tokenizer(page: Page, edge: EdgeServer, model: str = PUBLISHED_NAME) -> None:
    await page.goto(f"{edge.url}/tokenizer?model={model}")
    await expect(page.locator("body")).to_have_attribute("data-state", "ready", timeout=30_000)


async def shown_ids(page: Page, text: str) -> list[int]:
    """Type `text` and read the ids the page shows, after checking it tokenized exactly `text`."""
    await page.locator("#text").fill(text)
    assert await page.locator("#text").input_value() == text
    pieces = await page.locator("#pieces .piece").evaluate_all("els => els.map(e => Number(e.dataset.id))")
    listed = json.loads(await page.locator("#ids").text_content() or "[]")
    assert pieces == listed, "the pieces and the id list disagree"
    assert await page.locator("#token-count").text_content() == f"{len(listed):,}"
    return listed


async def test_ids_equal_python_tokenizers(
    page: Page, artifact_edge: EdgeServer, smollm2_files: TokenizerFiles, screenshot: Callable[[str], Awaitable[None]]
) -> None:
    reference = smollm2_files.tokenizer()
    await open_tokenizer(page, artifact_edge)
    await expect(page.locator("#vocab-size")).to_have_text(f"{reference.get_vocab_size(with_added_tokens=True):,}")
    await expect(page.locator("#load-time")).to_have_text(re.compile(r"^\d+ ms$"))

    mismatches = []
    for text in CORPUS + ["\n".join(CORPUS)]:
        expected = reference.encode(text, add_special_tokens=False).ids
        if await shown_ids(page, text) != expected:
            mismatches.append(text)
    assert not mismatches, f"the browser's ids differ from Python tokenizers for {mismatches!r}"

    # special tokens show as specials, and a partial UTF-8 character shows its bytes
    await shown_ids(page, "<|im_start|>user 你")
    await expect(page.locator("#pieces .piece.special")).to_have_count(1)
    await expect(page.locator("#pieces .piece").last).to_contain_text(re.compile(r"<[0-9A-F]{2}( [0-9A-F]{2})*>"))
    await page.locator("#text").fill("Hello, world! 1234 café 你好 🙂\n    def f(x): return x * 2")
    await screenshot("tokens")


async def test_known_library_differences_keep_the_text(page: Page, artifact_edge: EdgeServer, smollm2_files: TokenizerFiles) -> None:
    """The named differences are real (if a library release fixes one, move it into CORPUS), and
    harmless: the browser's tokens decode to exactly the text typed."""
    reference = smollm2_files.tokenizer()
    await open_tokenizer(page, artifact_edge)
    for what, text in KNOWN_DIFFERENCES.items():
        ids = await shown_ids(page, text)
        assert ids != reference.encode(text, add_special_tokens=False).ids, f"{what}: the browser now agrees; move it to CORPUS"
        assert reference.decode(ids) == text, f"{what}: the browser's tokens do not spell the text"


@dataclass
class R2Spy:
    """The published R2, recording which objects were read in full (a 304 needs only a head)."""

    inner: BlobStore
    reads: list[str] = field(default_factory=list)

    async def head(self, key: str) -> R2Object | None:
        return await self.inner.head(key)

    async def get(self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None) -> R2Object | None:
        self.reads.append(key)
        return await self.inner.get(key, range=range, only_if=only_if)

    async def put(self, key: str, data: bytes | AsyncIterator[bytes], **kwargs: Any) -> R2Object:
        return await self.inner.put(key, data, **kwargs)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str = "", **kwargs: Any) -> dict[str, Any]:
        return await self.inner.list(prefix, **kwargs)


async def test_reload_revalidates_with_304(
    page: Page, start_edge: Callable[..., EdgeServer], published_r2: BlobStore, smollm2_files: TokenizerFiles
) -> None:
    spy = R2Spy(published_r2)
    edge = start_edge(r2=spy)
    key = f"models/{PUBLISHED_NAME}/tokenizer.json"

    await open_tokenizer(page, edge)
    await expect(page.locator("#fetch-tokenizer")).to_have_attribute("data-delivery", "network")
    await expect(page.locator("#fetch-tokenizer")).to_contain_text("200 downloaded")
    assert spy.reads.count(key) == 1

    await page.reload()
    await expect(page.locator("body")).to_have_attribute("data-state", "ready", timeout=30_000)
    for file in ("#fetch-tokenizer", "#fetch-config"):
        await expect(page.locator(file)).to_have_attribute("data-delivery", "revalidated")
        await expect(page.locator(file)).to_contain_text("304 revalidated")
    assert spy.reads.count(key) == 1, "the edge sent tokenizer.json again instead of a 304"
    text = "revalidated, and still tokenizing"
    assert await shown_ids(page, text) == smollm2_files.tokenizer().encode(text, add_special_tokens=False).ids


async def test_model_picker_lists_published_models(page: Page, artifact_edge: EdgeServer, tiny_files: TokenizerFiles) -> None:
    published = [m["name"] for m in (await (await page.request.get(f"{artifact_edge.url}/models")).json())["data"]]
    assert sorted(published) == sorted([PUBLISHED_NAME, TINY_NAME])

    await page.goto(f"{artifact_edge.url}/tokenizer")
    await expect(page.locator("body")).to_have_attribute("data-state", "ready", timeout=30_000)
    options = await page.locator("#model option").evaluate_all("els => els.map(e => e.value)")
    assert options == published

    await page.get_by_label("Model").select_option(TINY_NAME)
    tiny = tiny_files.tokenizer()
    await expect(page.locator("#vocab-size")).to_have_text(f"{tiny.get_vocab_size(with_added_tokens=True):,}")
    assert page.url.endswith(f"?model={TINY_NAME}")
    text = "Hello tiny model, 42!"
    assert await shown_ids(page, text) == tiny.encode(text, add_special_tokens=False).ids


async def test_no_published_models_says_how_to_publish(page: Page, start_edge: Callable[..., EdgeServer]) -> None:
    edge = start_edge()  # an empty R2
    await page.goto(f"{edge.url}/tokenizer")
    await expect(page.locator("body")).to_have_attribute("data-state", "empty")
    await expect(page.locator("#status")).to_contain_text("edgellm publish")


async def test_missing_model_shows_the_api_message(page: Page, artifact_edge: EdgeServer) -> None:
    await page.goto(f"{artifact_edge.url}/tokenizer?model=no-such-model")
    await expect(page.locator("body")).to_have_attribute("data-state", "error")
    api = await page.request.get(f"{artifact_edge.url}/models/no-such-model/tokenizer.json")
    assert api.status == 404
    await expect(page.locator("#error")).to_contain_text((await api.json())["error"]["message"])
