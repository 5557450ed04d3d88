"""Stand-in models: which registry-installed GGUF answers the project's own examples right.

Thirty short questions of the kinds the guides and the pages use (facts, lists, a JSON object, a
tool call, a follow-up that needs the earlier turn), among them the pages' placeholders and the
guides' example questions, asked greedily (temperature 0) through the local edge's real
llama.cpp binding (`LlamaCppAI`, built as `edgellm dev` builds it, with each model's chat
template) and scored automatically: expected keywords, valid JSON with the right values, a tool
call with the right name and arguments, the earlier turn's fact. Per model, in a process of its
own (so load time and peak RSS are its own): score /30, generation tokens/s and time to first
token (streamed plain answers), load time and peak RSS, with the 1-minute load before and after.

    .venv/bin/python -m bench.bench_models [--models smollm2-135m,gemma3-270m] [--threads N] [--show]

About 1-3 minutes on a 2-core machine for the two stand-ins. `--show` prints every answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SYSTEM_ONE_SENTENCE = "You are a helpful assistant. Answer in one sentence."


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9@.]+", text.lower().replace(".", " ")))


def has_any(*expected: str) -> Callable[[dict[str, Any]], bool]:
    """The answer's text names one of `expected` (case-insensitive, as words)."""
    return lambda out: bool(_words(out.get("response") or "") & set(expected))


def has_count(n: int, *pool: str) -> Callable[[dict[str, Any]], bool]:
    """The answer's text names at least `n` different items of `pool` (plural forms count)."""
    def check(out: dict[str, Any]) -> bool:
        words = _words(out.get("response") or "")
        return sum(1 for item in pool if item in words or item + "s" in words or item + "es" in words) >= n
    return check


def json_answer(check: Callable[[Any], bool]) -> Callable[[dict[str, Any]], bool]:
    """The answer is one valid JSON value that meets `check`."""
    def scored(out: dict[str, Any]) -> bool:
        try:
            value = json.loads(out.get("response") or "")
        except ValueError:
            return False
        try:
            return bool(check(value))
        except (KeyError, TypeError, AttributeError):
            return False
    return scored


def tool_call(name: str, check: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    """The first tool call is `name` with arguments that meet `check`."""
    def scored(out: dict[str, Any]) -> bool:
        calls = out.get("tool_calls") or []
        if not calls or calls[0]["function"]["name"] != name:
            return False
        try:
            return bool(check(json.loads(calls[0]["function"]["arguments"])))
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
    return scored


def _tool(name: str, **properties: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {k: {"type": v} for k, v in properties.items()}, "required": list(properties)}}}


def _schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {k: v if isinstance(v, dict) else {"type": v} for k, v in properties.items()},
            "required": list(properties)}


WEATHER = _tool("get_weather", city="string")
TIME = _tool("get_time", city="string")
FRENCH_CITIES = {"paris", "lyon", "marseille", "nice", "toulouse", "bordeaux", "lille", "strasbourg", "nantes",
                 "montpellier", "rennes", "reims", "grenoble", "dijon", "cannes", "avignon", "tours", "rouen"}
COLOURS = ("red", "blue", "yellow", "green", "orange", "purple", "black", "white", "pink", "brown", "grey", "gray", "violet")


@dataclass(frozen=True)
class Question:
    """One scored question: `turns` user messages (each earlier one answered by the model itself,
    as a client carrying its history would), the last one scored by `check`."""

    kind: str
    turns: tuple[str, ...]
    check: Callable[[dict[str, Any]], bool]
    system: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # response_format, tools, tool_choice
    max_tokens: int = 64

    @property
    def text(self) -> str:
        return self.turns[-1]

    @property
    def plain(self) -> bool:
        return not self.extra


def _q(kind: str, *turns: str, check: Callable[[dict[str, Any]], bool], **kw: Any) -> Question:
    return Question(kind, turns, check, **kw)


QUESTIONS: tuple[Question, ...] = (
    # facts (the chat and device pages' placeholder with and without the README's system prompt)
    _q("fact", "What is the capital of France?", check=has_any("paris")),
    _q("fact", "What is the capital of France?", check=has_any("paris"), system=SYSTEM_ONE_SENTENCE),
    _q("fact", "What is the capital of Japan?", check=has_any("tokyo")),
    _q("fact", "What is the capital of Italy?", check=has_any("rome")),
    _q("fact", "How many days are in a week?", check=has_any("7", "seven")),
    _q("fact", "What is 2 + 2?", check=has_any("4", "four")),
    _q("fact", "What colour is the sky on a clear day?", check=has_any("blue")),
    _q("fact", "What is the largest planet in the solar system?", check=has_any("jupiter")),
    _q("fact", "What language is spoken in Spain?", check=has_any("spanish", "castilian")),
    _q("fact", "What do bees make?", check=has_any("honey")),
    _q("fact", "Hi", check=lambda out: bool(re.search(r"[A-Za-z]{2,}", out.get("response") or ""))),
    # lists
    _q("list", "Name three primary colours.", check=has_count(3, "red", "blue", "yellow", "green")),
    _q("list", "List three fruits.", check=has_count(3, "apple", "banana", "orange", "grape", "mango", "pear", "strawberry",
                                                      "cherry", "peach", "pineapple", "lemon", "kiwi", "plum", "watermelon")),
    _q("list", "Name the four seasons.", check=lambda out: has_count(3, "spring", "summer", "winter")(out)
       and has_any("autumn", "fall")(out)),
    _q("list", "Which days make up the weekend?", check=lambda out: has_count(2, "saturday", "sunday")(out)),
    _q("list", "Name three animals that live in the sea.",
       check=has_count(3, "fish", "shark", "whale", "dolphin", "octopus", "seal", "jellyfish", "crab", "turtle", "squid",
                       "starfish", "lobster", "eel", "seahorse", "clam", "shrimp", "coral", "ray", "otter")),
    _q("list", "Name two planets.", check=has_count(2, "mercury", "venus", "earth", "mars", "jupiter", "saturn", "uranus", "neptune")),
    # JSON objects (the README's structured example first)
    _q("json", "Name a city in France.", max_tokens=128,
       extra={"response_format": {"type": "json_schema", "json_schema": _schema(name="string", country="string")}},
       check=json_answer(lambda v: v["name"].strip().lower() in FRENCH_CITIES and "france" in v["country"].lower())),
    _q("json", "What is the capital of Germany?", max_tokens=128,
       extra={"response_format": {"type": "json_schema", "json_schema": _schema(city="string", country="string")}},
       check=json_answer(lambda v: "berlin" in v["city"].lower())),
    _q("json", 'Answer with a JSON object whose key "answer" is the capital of Spain.', max_tokens=128,
       extra={"response_format": {"type": "json_object"}},
       check=json_answer(lambda v: "madrid" in json.dumps(v).lower())),
    _q("json", "Ada is 36 years old. Give her name and age.", max_tokens=128,
       extra={"response_format": {"type": "json_schema", "json_schema": _schema(name="string", age="integer")}},
       check=json_answer(lambda v: "ada" in v["name"].lower() and v["age"] == 36)),
    _q("json", "List three colours.", max_tokens=128,
       extra={"response_format": {"type": "json_schema", "json_schema": _schema(
           colours={"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3})}},
       check=json_answer(lambda v: len({c.strip().lower() for c in v["colours"]} & set(COLOURS)) == 3)),
    # tool calls (the README's example first)
    _q("tool", "Weather in Paris?", max_tokens=128, extra={"tools": [WEATHER], "tool_choice": "required"},
       check=tool_call("get_weather", lambda a: "paris" in a["city"].lower())),
    _q("tool", "What's the weather like in Tokyo?", max_tokens=128, extra={"tools": [WEATHER, TIME], "tool_choice": "required"},
       check=tool_call("get_weather", lambda a: "tokyo" in a["city"].lower())),
    _q("tool", "What time is it in London?", max_tokens=128, extra={"tools": [WEATHER, TIME], "tool_choice": "required"},
       check=tool_call("get_time", lambda a: "london" in a["city"].lower())),
    _q("tool", "How many people live in Berlin?", max_tokens=128,
       extra={"tools": [_tool("get_population", city="string")], "tool_choice": "required"},
       check=tool_call("get_population", lambda a: "berlin" in a["city"].lower())),
    _q("tool", "Send an email to bob@example.com saying hello.", max_tokens=128,
       extra={"tools": [_tool("send_email", to="string", body="string")], "tool_choice": "required"},
       check=tool_call("send_email", lambda a: a["to"].strip().lower() == "bob@example.com")),
    # follow-ups that need the earlier turn (the README's Responses example first)
    _q("follow-up", "My name is Ada.", "What is my name?", check=has_any("ada")),
    _q("follow-up", "I live in Lisbon.", "Which city do I live in?", check=has_any("lisbon")),
    # the README's Responses example: with "favourite colour" and no instructions SmolLM2 repeats its
    # first answer ("my favourite colour is indeed green"), which scored but is not an answer
    _q("follow-up", "I have a dog called Max.", "What is my dog called?", check=has_any("max"), system=SYSTEM_ONE_SENTENCE),
)


# ---- the worker: one model, in a process of its own -------------------------------------------

def _peak_rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _ask(ai: Any, model: str, q: Question, show: bool) -> dict[str, Any]:
    """Every earlier turn answered by the model, then the scored one: plain questions streamed
    (time to first text, generation rate), structured ones as whole answers."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": q.system}] if q.system else []
    for turn in q.turns[:-1]:
        messages.append({"role": "user", "content": turn})
        earlier = await ai.run(model, {"messages": messages, "temperature": 0, "max_tokens": 64})
        messages.append({"role": "assistant", "content": earlier.get("response") or ""})
    messages.append({"role": "user", "content": q.text})
    inputs = {"messages": messages, "temperature": 0, "max_tokens": q.max_tokens, **q.extra}
    timing: dict[str, float] = {}
    if q.plain:
        start = time.perf_counter()
        stream = await ai.stream(model, inputs)
        parts, first, usage = [], None, {}
        try:
            async for event in stream:
                if event.get("response") and first is None:
                    first = time.perf_counter()
                parts.append(event.get("response") or "")
                usage = event.get("usage") or usage
        finally:
            await stream.aclose()
        end = time.perf_counter()
        out: dict[str, Any] = {"response": "".join(parts)}
        tokens = int(usage.get("completion_tokens") or 0)
        if first is not None:
            timing["ttft"] = first - start
            if tokens > 1 and end > first:
                timing["tokens_per_s"] = (tokens - 1) / (end - first)
    else:
        out = await ai.run(model, inputs)
    ok = bool(q.check(out))
    if show:
        shown = out.get("tool_calls") and [c["function"] for c in out["tool_calls"]] or out.get("response")
        print(f"  [{'ok' if ok else '--'}] {q.kind:9} {q.text!r}: {json.dumps(shown, ensure_ascii=False)[:160]}", file=sys.stderr)
    return {"ok": ok, **timing}


QUESTION_TIMEOUT_S = 120.0


async def _bounded(asked: Any, q: Question, show: bool) -> dict[str, Any]:
    """A question that takes longer than QUESTION_TIMEOUT_S scores 0 (and the run goes on)."""
    try:
        return await asyncio.wait_for(asked, QUESTION_TIMEOUT_S)
    except TimeoutError:
        if show:
            print(f"  [--] {q.kind:9} {q.text!r}: no answer within {QUESTION_TIMEOUT_S:g} s", file=sys.stderr)
        return {"ok": False}


def worker(name: str, threads: int, show: bool) -> dict[str, Any]:
    from edgellm.config import Config
    from edgellm_local.llama.binding import LlamaCppAI
    from edgellm_local.llama.runner import LlamaCppRunner
    from edgellm_local.llama.model_file import check_gguf
    from edgellm_local.llama.stand_ins import STAND_INS

    stand_in = STAND_INS[name]
    path = check_gguf(stand_in.locate())
    config = Config()
    # as `edgellm dev` builds it (edge.build_deps), with the stand-in's chat template
    runner = LlamaCppRunner(path, n_ctx=4096, n_parallel=2, threads=threads, cache_ram_mib=0, chat_template=stand_in.chat_template)
    start = time.perf_counter()
    runner.load()
    load_s = time.perf_counter() - start
    ai = LlamaCppAI.for_config(config, runner)
    try:
        results = [asyncio.run(_bounded(_ask(ai, config.model, q, show), q, show)) for q in QUESTIONS]
    finally:
        ai.close()
    by_kind: dict[str, list[int]] = {}
    for q, r in zip(QUESTIONS, results):
        by_kind.setdefault(q.kind, []).append(int(r["ok"]))
    rates = [r["tokens_per_s"] for r in results if "tokens_per_s" in r]
    ttfts = [r["ttft"] for r in results if "ttft" in r]
    return {"name": name, "gguf": path.name, "size_mb": path.stat().st_size / 1e6, "template": stand_in.chat_template or "GGUF's own",
            "score": sum(int(r["ok"]) for r in results), "by_kind": {k: f"{sum(v)}/{len(v)}" for k, v in by_kind.items()},
            "failed": [q.text for q, r in zip(QUESTIONS, results) if not r["ok"]],
            "tokens_per_s": statistics.median(rates) if rates else 0.0, "ttft_ms": 1000 * statistics.median(ttfts) if ttfts else 0.0,
            "load_s": load_s, "peak_rss_mib": _peak_rss_mib()}


# ---- the driver ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    from edgellm_local.llama.stand_ins import STAND_INS, StandInMissing

    parser = argparse.ArgumentParser(prog="bench.bench_models", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(STAND_INS), help="comma-separated stand-in names (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--show", action="store_true", help="print every answer and whether it scored")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.threads, args.show)), flush=True)
        return 0
    rows, failed = [], []
    print(f"{len(QUESTIONS)} questions, greedy, {args.threads} threads on {os.cpu_count()} cores; "
          f"1-minute load before: {os.getloadavg()[0]:.2f}", flush=True)
    for name in args.models.split(","):
        try:
            STAND_INS[name].locate()  # a stand-in whose package is not installed is skipped, saying how to install it
        except StandInMissing as missing:
            print(f"{name}: skipped, {missing}", flush=True)
            continue
        command = [sys.executable, "-m", "bench.bench_models", "--worker", name, "--threads", str(args.threads)]
        done = subprocess.run(command + (["--show"] if args.show else []), stdout=subprocess.PIPE, text=True, timeout=1200)
        if done.returncode != 0:
            failed.append(name)
            print(f"{name}: failed (exit {done.returncode})", flush=True)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"1-minute load after: {os.getloadavg()[0]:.2f}\n")
    print(f"| model | GGUF | template | score /{len(QUESTIONS)} | fact | list | json | tool | follow-up | gen tokens/s | TTFT p50 | load | peak RSS |")
    print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        k = r["by_kind"]
        print(f"| {r['name']} | {r['gguf']} ({r['size_mb']:.0f} MB) | {r['template']} | {r['score']} | {k['fact']} | {k['list']} | "
              f"{k['json']} | {k['tool']} | {k['follow-up']} | {r['tokens_per_s']:.0f} | {r['ttft_ms']:.0f} ms | "
              f"{r['load_s']:.2f} s | {r['peak_rss_mib']:.0f} MiB |")
    for r in rows:
        print(f"{r['name']} missed: {'; '.join(r['failed']) or 'nothing'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
