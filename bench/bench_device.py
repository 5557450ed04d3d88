"""The device tier against the local edge, in one run, on the same GGUF with the same thread count.

Publishes SmolLM2-135M with `edgellm publish --target local`, starts the edge (`edgellm dev`) on
that state in its own process, then measures:
- in headless Chromium (Debian's, driven by Playwright), the device page (public/device.html):
  first visit (manifest, download, SHA-256 of every shard, llama.cpp-in-WebAssembly load) and
  second visit (the same browser profile: shards from Cache Storage, hashed again, loaded), then
  time to first token and tokens/s of greedy answers generated on the device (wllama, N threads);
- over HTTP, the same greedy requests streamed from the edge's llama.cpp (`/v1/chat/completions`,
  cache skipped), with the same N threads: the edge is started with `--threads N` and the page
  with `?threads=N` (N = --threads, default os.cpu_count()); the run stops if the device reports
  another thread count.
The whole run is bounded: past --deadline seconds an alarm unwinds it, and the edge process and
Chromium are stopped by the context managers that own them.
Tokens/s is (completion tokens - 1) / (last token time - first token time) on both sides.
Figures are medians of --rounds answers (after one warm-up answer each); the machine's load
average is printed with them.

    .venv/bin/python -m bench.bench_device [--rounds 3] [--max-tokens 32] [--threads N] [--deadline 900]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, expect, sync_playwright

from bench.edge_process import running_edge
from edgellm_local.llama.model_file import default_model_path

NAME = "smollm2-135m"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
QUESTION = "Write one sentence about the sea."
LOAD_TIMEOUT_MS = 300_000


def publish(state: Path) -> None:
    subprocess.run([sys.executable, "-m", "edgellm_local.cli", "publish", str(default_model_path()), "--name", NAME,
                    "--target", "local", "--state", str(state)], check=True, stdout=subprocess.DEVNULL)


def visit(page: Page, base: str, threads: int) -> tuple[float, dict[str, Any]]:
    """Milliseconds from navigation to a loaded model, and what the page says it did."""
    started = time.perf_counter()
    page.goto(f"{base}/device?threads={threads}")
    expect(page.locator("body")).to_have_attribute("data-state", "ready", timeout=LOAD_TIMEOUT_MS)
    elapsed = (time.perf_counter() - started) * 1000
    info = page.evaluate("window.edgellmDevice || null")
    if page.get_attribute("body", "data-tier") != "device":
        raise RuntimeError(f"the device tier did not load: {page.text_content('#notice')}")
    return elapsed, info


def device_answers(page: Page, rounds: int, max_tokens: int) -> list[tuple[float, float]]:
    """(TTFT ms, tokens/s) of `rounds` greedy answers after one warm-up, each in a fresh chat."""
    page.fill("#max-tokens", str(max_tokens))
    page.set_checked("#deterministic", True)
    figures = []
    for round_ in range(rounds + 1):
        page.click("#new-chat")
        page.fill("#prompt", QUESTION)
        page.click("#send")
        expect(page.locator("body")).to_have_attribute("data-state", "done", timeout=300_000)
        note = page.locator(".message.assistant .turn-stats").last
        if round_ > 0:
            figures.append((float(note.get_attribute("data-ttft") or "nan"), float(note.get_attribute("data-tps") or "nan")))
    return figures


def edge_answers(base: str, rounds: int, max_tokens: int) -> list[tuple[float, float]]:
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    figures = []
    with httpx.Client(timeout=120) as client:
        for round_ in range(rounds + 1):
            started = time.perf_counter()
            first = last = None
            tokens = 0
            with client.stream("POST", f"{base}/v1/chat/completions", json=body, headers={"cf-aig-skip-cache": "true"}) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                        last = time.perf_counter()
                        first = first or last
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            if round_ > 0 and first is not None and last is not None and last > first:
                figures.append(((first - started) * 1000, (tokens - 1) / (last - first)))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp threads on both tiers")
    parser.add_argument("--deadline", type=int, default=900, help="seconds the whole run may take")
    args = parser.parse_args()
    threads = args.threads

    def out_of_time(signum: int, frame: Any) -> None:
        raise TimeoutError(f"bench_device ran past its --deadline of {args.deadline} s")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(args.deadline)
    median = statistics.median
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="edgellm-bench-device-") as state:
        publish(Path(state))
        with running_edge(state=state, extra=["--threads", str(threads)]) as base:
            edge = edge_answers(base, args.rounds, args.max_tokens)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                context = browser.new_context()
                page = context.new_page()
                first_ms, first_info = visit(page, base, threads)
                page.close()
                page = context.new_page()
                second_ms, second_info = visit(page, base, threads)
                device = device_answers(page, args.rounds, args.max_tokens)
                browser.close()
    signal.alarm(0)
    load_after = os.getloadavg()
    if second_info["threads"] != threads:
        raise RuntimeError(f"the device ran {second_info['threads']} threads, the edge {threads}: not comparable")

    size = first_info["bytes"] / 1e6
    print(f"SmolLM2-135M Q4_1 ({size:.1f} MB, {first_info['shards']} shards) from the local edge; {threads} threads on both tiers "
          f"(device: {'multi-thread' if second_info['multiThread'] else 'single-thread'} build, {second_info['threads']} threads)")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min), on {os.cpu_count()} cores; "
          f"medians of {args.rounds} greedy answers of up to {args.max_tokens} tokens")
    print(f"{'':<44}{'ms':>10}")
    print(f"{'first visit: manifest+download+verify+load':<44}{first_ms:>10.0f}   "
          f"(download+verify {first_info['downloadMs']:.0f}, load {first_info['loadMs']:.0f}; {first_info['fromNetwork']} shards downloaded)")
    print(f"{'second visit: cache+verify+load':<44}{second_ms:>10.0f}   "
          f"(read+verify {second_info['downloadMs']:.0f}, load {second_info['loadMs']:.0f}; {second_info['fromNetwork']} shards downloaded)")
    print(f"{'':<24}{'TTFT ms':>10}{'tokens/s':>10}")
    for label, rows in (("device (wllama, wasm)", device), ("edge (llama.cpp, HTTP)", edge)):
        print(f"{label:<24}{median(r[0] for r in rows):>10.0f}{median(r[1] for r in rows):>10.1f}")
    print(f"device/edge tokens/s: {median(r[1] for r in device) / median(r[1] for r in edge):.2f}x")


if __name__ == "__main__":
    main()
