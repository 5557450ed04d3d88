"""A short generation at start-up that says how fast this machine serves the model, before a
client finds out: llama.cpp's own timings of a fixed prompt, with the load they ran under."""

from __future__ import annotations

import os
from dataclasses import dataclass

from edgellm_local.llama.runner import LlamaCppRunner

WARM_UP_PROMPT = "The three primary colours are"


@dataclass(frozen=True)
class WarmUp:
    prompt_tokens_per_s: float
    tokens_per_s: float
    tokens: int
    threads: int
    load: float | None  # the 1-minute load average when it ran (None where the OS has none)

    def line(self) -> str:
        load = f", load {self.load:.2f} on {os.cpu_count()} cores" if self.load is not None else ""
        return (f"  warm-up on {self.threads} threads{load}: {self.tokens_per_s:.0f} tokens/s generating "
                f"({self.tokens} tokens), {self.prompt_tokens_per_s:.0f} tokens/s reading the prompt")


def warm_up(runner: LlamaCppRunner, tokens: int = 32) -> WarmUp:
    """Generate `tokens` greedy tokens from a fixed prompt (not cached: every start measures the
    same work) and read llama.cpp's timings."""
    result = runner.complete({"prompt": WARM_UP_PROMPT, "n_predict": tokens, "temperature": 0, "cache_prompt": False,
                              "ignore_eos": True})
    timings = (result or {}).get("timings") or {}
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return WarmUp(float(timings.get("prompt_per_second") or 0.0), float(timings.get("predicted_per_second") or 0.0),
                  int(timings.get("predicted_n") or 0), runner.threads, load)
