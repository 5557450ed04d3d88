"""The semantic cache's error bound, kept online (vCache's idea, done in a gateway).

A semantic hit is *wrong* when the model, asked the new question, would not have given the
cached answer. For a deterministic request (temperature 0 or a seed: the only kind the cache
serves) that is checkable: generate the real answer and compare it with the cached one, as text
(whitespace collapsed, case folded). Identical text is a right hit; anything else counts as
wrong, so a paraphrase the model words differently is counted against the cache too: the
estimate errs high, never low.

Evidence comes two ways:

- while a namespace's semantic hits are stopped, every would-be hit is served as a miss: its
  own generation is the real answer, so it is compared for free (no extra generation);
- while they are served, a sampled share (`SEMANTIC_CHECK_RATE`) is checked by a second
  generation after the response (`waitUntil`), charged to the operator, counted, and capped
  per minute (`SEMANTIC_CHECKS_PER_MINUTE`).

Each verdict updates the namespace's running estimate of the wrong-hit rate with its Wilson 95%
interval; while the interval's upper bound is above the bound (`SEMANTIC_MAX_ERROR`, or the key's
own), the namespace serves no semantic hits (exact hits continue). With no evidence the upper
bound is 1: a namespace starts stopped and earns its semantic hits (with a bound of 0.02 and no
wrong verdict, after 189 right ones). A wrong verdict also raises that entry's own threshold in
this isolate above the score it was wrongly served at.

Where the estimate lives: in the isolate (`IsolateState.semantic_calibration`). On Cloudflare each
isolate therefore earns its own evidence and keeps its own bound: each isolate's served hits are
held under the bound on its own evidence (so their mixture is too, at each isolate's 95%), but
a young isolate serves no semantic hits until it has checked enough, and evidence is not
shared. KV could not hold it (eventually consistent, no atomic counter); a Durable Object per
namespace could, at the cost of a round trip on every would-be hit: not done here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval
MAX_NAMESPACES = 256  # estimates kept per isolate (the oldest dropped first)
MAX_ENTRY_OVERRIDES = 1024  # entries whose threshold a wrong verdict raised, per isolate


def wilson(wrong: int, checks: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion `wrong / checks` (0 checks: (0, 1))."""
    if checks <= 0:
        return 0.0, 1.0
    if not 0 <= wrong <= checks:
        raise ValueError(f"wrong must be between 0 and checks, got {wrong} of {checks}")
    p = wrong / checks
    z2 = z * z
    centre = (p + z2 / (2 * checks)) / (1 + z2 / checks)
    half = z * math.sqrt(p * (1 - p) / checks + z2 / (4 * checks * checks)) / (1 + z2 / checks)
    return max(0.0, centre - half), min(1.0, centre + half)


def same_answer(cached: str, fresh: str) -> bool:
    """The verdict on a checked hit: the same text, whitespace and case aside."""
    return " ".join(cached.split()).casefold() == " ".join(fresh.split()).casefold()


@dataclass
class Estimate:
    """One namespace's evidence."""

    checks: int = 0
    wrong: int = 0

    @property
    def rate(self) -> float:
        return self.wrong / self.checks if self.checks else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.wrong, self.checks)

    def serves(self, bound: float) -> bool:
        """Whether semantic hits may be served: the interval's upper bound is within the bound."""
        return self.interval[1] <= bound

    def to_json(self) -> dict[str, float | int]:
        low, high = self.interval
        return {"checks": self.checks, "wrong": self.wrong, "estimate": round(self.rate, 6),
                "lower": round(low, 6), "upper": round(high, 6)}


@dataclass
class Calibration:
    """The isolate's estimates, per index namespace, and the checks' costs."""

    estimates: dict[str, Estimate] = field(default_factory=dict)
    raised: dict[str, float] = field(default_factory=dict)  # vector id -> its threshold after a wrong verdict
    right: int = 0  # verdicts
    wrong: int = 0
    free_checks: int = 0  # verdicts from would-be hits served as misses while stopped
    sampled_checks: int = 0  # extra generations made to check served hits
    capped: int = 0  # checks not made: the minute's cap was reached
    check_tokens: int = 0  # the extra generations' tokens (the operator's)
    stopped_hits: int = 0  # would-be hits not served because their namespace's bound was not met
    window: tuple[float, int] = (0.0, 0)  # (minute start, checks started in it)

    def estimate(self, namespace: str) -> Estimate:
        found = self.estimates.get(namespace)
        if found is None:
            if len(self.estimates) >= MAX_NAMESPACES:
                del self.estimates[next(iter(self.estimates))]
            found = self.estimates[namespace] = Estimate()
        return found

    def record(self, namespace: str, entry: str, score: float, right: bool, margin: float) -> None:
        """A verdict: the namespace's estimate, and a wrong hit's entry made stricter than `score`."""
        estimate = self.estimate(namespace)
        estimate.checks += 1
        if right:
            self.right += 1
            return
        estimate.wrong += 1
        self.wrong += 1
        if entry not in self.raised and len(self.raised) >= MAX_ENTRY_OVERRIDES:
            del self.raised[next(iter(self.raised))]
        self.raised[entry] = max(self.raised.get(entry, 0.0), score + margin)  # above 1: never again

    def may_check(self, now: float, per_minute: int) -> bool:
        """A sampled check's place in this minute's cap (taken if given)."""
        start, used = self.window
        if now - start >= 60:
            start, used = now, 0
        if used >= per_minute:
            self.window = (start, used)
            self.capped += 1
            return False
        self.window = (start, used + 1)
        return True

    def pooled(self) -> Estimate:
        """Every namespace's evidence together (what /metrics shows: its labels stay bounded)."""
        return Estimate(sum(e.checks for e in self.estimates.values()), sum(e.wrong for e in self.estimates.values()))

    def to_json(self) -> dict[str, object]:
        return {"pooled": self.pooled().to_json(), "verdicts": {"right": self.right, "wrong": self.wrong},
                "free_checks": self.free_checks, "sampled_checks": self.sampled_checks, "capped_checks": self.capped,
                "check_tokens": self.check_tokens, "stopped_hits": self.stopped_hits,
                "namespaces": {name: e.to_json() for name, e in self.estimates.items()}}
