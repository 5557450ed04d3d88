"""What a replica says of its own load: its Prometheus `/metrics`, read with a short timeout.

    llama.cpp (llama-server --metrics)  llamacpp:requests_processing, llamacpp:requests_deferred,
                                        llamacpp:kv_cache_usage_ratio (older builds)
    vLLM                                vllm:num_requests_running, vllm:num_requests_waiting,
                                        vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before 0.10)
    EdgeLLM (a second edge)             edgellm_num_requests_running, edgellm_num_requests_waiting

Series with labels (vLLM labels each by model) are summed. A probe that times out, is refused,
answers something that is not Prometheus text, lacks the figures, or reports nonsense gives a
`Reading` with `ok` False: the replica is scored unhealthy until a probe reads it sane again.
The probe's answer is read to at most `MAX_METRICS_BYTES`, within the same timeout.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from ..deps import Deps
from ..ports import FetchError, HTTPFetch
from ..stream import close_source
from .config import OriginConfig
from .fleet import PoolView, Reading, sane_reading

MAX_METRICS_BYTES = 256 * 1024
NAMES = {
    "llama.cpp": (("llamacpp:requests_processing",), ("llamacpp:requests_deferred",), ("llamacpp:kv_cache_usage_ratio",)),
    "vllm": (("vllm:num_requests_running",), ("vllm:num_requests_waiting",), ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "edgellm": (("edgellm_num_requests_running",), ("edgellm_num_requests_waiting",), ()),
}


def metrics_url(origin: OriginConfig) -> str:
    """`/metrics` at the server's root (llama.cpp, vLLM and EdgeLLM all serve it beside `/v1`)."""
    return origin.base_url.removesuffix("/v1") + "/metrics"


def parse_metrics(text: str, kind: str) -> dict[str, float]:
    """The sums of the series `kind` reads, by metric name; a line that does not parse is skipped
    (an unknown line is not a lie), a value that is not a number is kept as NaN (it is one)."""
    wanted = {name for group in NAMES[kind] for name in group}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else line.partition(" ")
        name = name.strip()
        if name not in wanted:
            continue
        value_text = rest.rsplit("}", 1)[-1].split()[0] if "}" in rest else (rest.split() or [""])[0]
        try:
            value = float(value_text)
        except ValueError:
            value = math.nan
        sums[name] = sums.get(name, 0.0) + value
    return sums


def reading_from(text: str, kind: str, at: float) -> Reading:
    figures = parse_metrics(text, kind)
    running_names, waiting_names, kv_names = NAMES[kind]
    running = next((figures[n] for n in running_names if n in figures), None)
    waiting = next((figures[n] for n in waiting_names if n in figures), None)
    if running is None or waiting is None:
        return Reading(at, False, why=f"its /metrics lacks {running_names[0]} or {waiting_names[0]}")
    kv = next((figures[n] for n in kv_names if n in figures), None)
    return sane_reading(at, running, waiting, kv)


async def probe(fetch: HTTPFetch, origin: OriginConfig, timeout: float, now: Any) -> Reading:
    """One load probe of `origin`, never longer than `timeout` seconds (connect, headers, body).
    `now` is the clock's `now` (the reading's time is when it was asked for)."""
    at = now()
    get = getattr(fetch, "get", None)
    if get is None or origin.kind not in NAMES:
        return Reading(at, True, why="not probed")
    headers = {"accept": "text/plain"}
    if origin.token:
        headers["authorization"] = f"Bearer {origin.token}"
    try:
        async with asyncio.timeout(timeout):
            response = await get(metrics_url(origin), headers, timeout)
            data = b""
            try:
                if response.status != 200:
                    return Reading(at, False, why=f"/metrics answered {response.status}")
                async for chunk in response.body:
                    data += chunk
                    if len(data) > MAX_METRICS_BYTES:
                        return Reading(at, False, why="/metrics is too large")
            finally:
                await close_source(response.body)
    except TimeoutError:
        return Reading(at, False, why=f"/metrics did not answer within {timeout * 1000:g} ms")
    except FetchError as exc:
        return Reading(at, False, why=f"/metrics failed: {str(exc)[:120]}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Reading(at, False, why="/metrics is not text")
    return reading_from(text, origin.kind, at)


async def refresh(deps: Deps, view: PoolView, replicas: list[OriginConfig]) -> None:
    """Probe, together, the replicas whose reading is older than the pool's `probe_age_ms`; wait
    at most `probe_ms` (each probe's own timeout) and keep what came back."""
    if deps.fetch is None:
        return
    now = deps.clock.now()
    age, timeout = view.config.probe_age_ms / 1000, view.config.probe_ms / 1000
    stale = [o for o in replicas if o.kind and view.replicas[o.name].fresh(now, age) is None
             and o.name not in view.probing]
    if not stale:
        return
    view.probing.update(o.name for o in stale)
    try:
        readings = await asyncio.gather(*(probe(deps.fetch, o, timeout, deps.clock.now) for o in stale))
    finally:
        view.probing.difference_update(o.name for o in stale)
    for origin, reading in zip(stale, readings):
        view.replicas[origin.name].reading = reading
