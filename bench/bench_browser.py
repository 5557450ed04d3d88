"""Tokenizer in the browser against Python `tokenizers`, in one run, on SmolLM2's tokenizer.

Publishes SmolLM2-135M with `edgellm publish --target local`, starts the edge (`edgellm dev`) on
that state in its own process, then times the same work two ways:
- in headless Chromium (Debian's, driven by Playwright), with the vendored
  `@huggingface/tokenizers` the tokenizer page uses: fetch `tokenizer.json` from the edge
  (`cache: "no-store"`, so every round goes over the network), `JSON.parse`, `new Tokenizer`,
  then encode 5 KB of mixed text;
- in Python: `httpx.get` of the same URL, `Tokenizer.from_str`, `encode` of the same text.
Figures are medians of --rounds rounds (after one warm-up), and the ratio browser/Python.

    .venv/bin/python -m bench.bench_browser [--rounds 9] [--encodes 50]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright
from tokenizers import Tokenizer

from bench.edge_process import running_edge
from edgellm_local.llama.model_file import default_model_path

NAME = "smollm2-135m"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog; tokenizers split text into pieces a model knows. ",
    "def tokenize(text: str) -> list[int]:\n    return [vocab[piece] for piece in split(text)]\n\n",
    "Prices rose 3.5% to $1,234.56 on 2024-06-01, up from 1,180 in May. ",
    "Café, naïve, Ångström; Ελληνικά; русский; 你好，世界；こんにちは 🙂👍🏽. ",
    '{"id": 42, "tags": ["edge", "cache"], "ok": true}\n',
]

BROWSER_BENCH = """
async ({url, text, rounds, encodes}) => {
  const t0 = performance.now();
  const { Tokenizer } = await import('/vendor/tokenizers.min.mjs');
  const importMs = performance.now() - t0;
  const config = await (await fetch(url.replace('tokenizer.json', 'tokenizer_config.json'))).json();
  const fetches = [], parses = [], builds = [], encodeMs = [];
  let tokenizer, ids;
  for (let round = 0; round <= rounds; round++) {  // round 0 warms up
    const a = performance.now();
    const body = await (await fetch(url, { cache: 'no-store' })).text();
    const b = performance.now();
    const json = JSON.parse(body);
    const c = performance.now();
    tokenizer = new Tokenizer(json, config);
    const d = performance.now();
    for (let i = 0; i < encodes; i++) ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
    const e = performance.now();
    if (round > 0) { fetches.push(b - a); parses.push(c - b); builds.push(d - c); encodeMs.push((e - d) / encodes); }
  }
  return { importMs, fetches, parses, builds, encodeMs, ids };
}
"""


def mixed_text(size: int = 5 * 1024) -> str:
    text, i = "", 0
    while len(text.encode()) < size:
        text += PARAGRAPHS[i % len(PARAGRAPHS)]
        i += 1
    while len(text.encode()) > size:
        text = text[:-1]
    return text


def publish(state: Path) -> None:
    subprocess.run([sys.executable, "-m", "edgellm_local.cli", "publish", str(default_model_path()), "--name", NAME, "--target", "local",
                    "--state", str(state)], check=True, stdout=subprocess.DEVNULL)


def in_browser(base: str, text: str, rounds: int, encodes: int) -> dict[str, object]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(base + "/")
        result = page.evaluate(BROWSER_BENCH, {"url": f"{base}/models/{NAME}/tokenizer.json", "text": text,
                                               "rounds": rounds, "encodes": encodes})
        browser.close()
    return result


def in_python(base: str, text: str, rounds: int, encodes: int) -> dict[str, object]:
    fetches, builds, encode_ms = [], [], []
    ids: list[int] = []
    with httpx.Client() as client:
        for round_ in range(rounds + 1):
            a = time.perf_counter()
            body = client.get(f"{base}/models/{NAME}/tokenizer.json").text
            b = time.perf_counter()
            tokenizer = Tokenizer.from_str(body)
            c = time.perf_counter()
            for _ in range(encodes):
                ids = tokenizer.encode(text, add_special_tokens=False).ids
            d = time.perf_counter()
            if round_ > 0:
                fetches.append((b - a) * 1000)
                builds.append((c - b) * 1000)
                encode_ms.append((d - c) * 1000 / encodes)
    return {"fetches": fetches, "builds": builds, "encodeMs": encode_ms, "ids": ids, "size": len(body.encode())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--encodes", type=int, default=50, help="encodes per round (the median is per encode)")
    args = parser.parse_args()
    text = mixed_text()
    median = statistics.median
    with tempfile.TemporaryDirectory(prefix="edgellm-bench-browser-") as state:
        publish(Path(state))
        with running_edge(state=state) as base:
            py = in_python(base, text, args.rounds, args.encodes)
            js = in_browser(base, text, args.rounds, args.encodes)

    js_total = [f + p + b for f, p, b in zip(js["fetches"], js["parses"], js["builds"])]  # type: ignore[arg-type]
    py_total = [f + b for f, b in zip(py["fetches"], py["builds"])]  # type: ignore[arg-type]
    same = js["ids"] == py["ids"]
    print(f"SmolLM2-135M tokenizer.json: {py['size'] / 1e6:.2f} MB from the local edge; text: {len(text.encode()):,} bytes "
          f"-> {len(py['ids']):,} tokens (browser ids == Python ids: {'yes' if same else 'NO'})")  # type: ignore[arg-type]
    print(f"medians of {args.rounds} rounds; Chromium {CHROMIUM}, @huggingface/tokenizers 0.2.0 vs tokenizers (Rust)")
    print(f"{'':<28}{'browser ms':>12}{'Python ms':>12}{'browser/Python':>16}")

    def row(label: str, browser: float | None, python: float | None) -> str:
        cells = [f"{v:>12.2f}" if v is not None else f"{'-':>12}" for v in (browser, python)]
        ratio = f"{browser / python:>15.1f}x" if browser is not None and python else f"{'-':>16}"
        return f"{label:<28}{''.join(cells)}{ratio}"

    print(row("import library", js["importMs"], None))  # type: ignore[arg-type]
    print(row("fetch tokenizer.json", median(js["fetches"]), median(py["fetches"])))  # type: ignore[arg-type]
    print(row("parse + build tokenizer", median(js["parses"]) + median(js["builds"]), median(py["builds"])))  # type: ignore[arg-type]
    print(row("  of which JSON.parse", median(js["parses"]), None))  # type: ignore[arg-type]
    print(row("fetch + parse + build", median(js_total), median(py_total)))
    print(row("encode 5 KB", median(js["encodeMs"]), median(py["encodeMs"])))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
