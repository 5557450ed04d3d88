"""Fault injection at the AI binding seam, for tests, benchmarks and demos.

`FaultyAI` wraps a real binding (llama.cpp) and, per call, at a given rate: fails the call,
answers "model retired", delays the first token, stalls mid-stream, or fails mid-stream. It
is set by `edgellm dev --fault KIND=RATE[:ARG]` or at run time with `POST /admin/faults`
(a core route, `edgellm.fault_admin`, over `FaultAdmin`; local edge only). Counters (`calls`, `closed`, `injected`) let a test see that
a stream the gateway gave up on was closed, not left running.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Mapping

from edgellm.ports import AIBinding, BindingError, ModelNotFound

KINDS = ("fail", "retired", "delay_first", "stall", "fail_mid")


@dataclass
class FaultPlan:
    """Rates in [0, 1] per kind; `delay_s` for a delayed first token, `after` tokens before a
    mid-stream stall or failure, `stall_s` how long a stall lasts (default: until closed)."""

    fail: float = 0.0
    retired: float = 0.0
    delay_first: float = 0.0
    stall: float = 0.0
    fail_mid: float = 0.0
    delay_s: float = 10.0
    after: int = 3
    stall_s: float | None = None
    models: tuple[str, ...] = ()  # only these model ids (empty: all)

    @classmethod
    def parse(cls, specs: list[str]) -> "FaultPlan":
        """`fail=0.5`, `stall=0.33:after=4`, `delay_first=1:delay_s=5`, `retired=1:models=@cf/a`."""
        plan = cls()
        for spec in specs:
            head, *options = spec.split(":")
            kind, _, rate = head.partition("=")
            if kind not in KINDS:
                raise ValueError(f"unknown fault {kind!r}; kinds: {', '.join(KINDS)}")
            setattr(plan, kind, float(rate or 1))
            for option in options:
                name, _, value = option.partition("=")
                if name == "models":
                    plan.models = tuple(value.split(","))
                elif name in ("delay_s", "stall_s"):
                    setattr(plan, name, float(value))
                elif name == "after":
                    plan.after = int(value)
                else:
                    raise ValueError(f"unknown fault option {name!r}")
        return plan

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FaultPlan":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "models" in known:
            known["models"] = tuple(known["models"])
        return cls(**known)


@dataclass
class FaultyAI:
    inner: AIBinding
    plan: FaultPlan = field(default_factory=FaultPlan)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    calls: int = 0
    closed: int = 0  # streams the consumer closed (or that ended)
    injected: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    sent: list[str] = field(default_factory=list)  # the text of the last stream, as passed on

    def describe(self, model: str, *, live: bool = True) -> Mapping[str, Any] | None:
        return self.inner.describe(model, live=live)

    @property
    def scoped_prefix_reuse(self) -> bool:
        return bool(getattr(self.inner, "scoped_prefix_reuse", False))

    def _roll(self, kind: str, model: str) -> bool:
        if self.plan.models and model not in self.plan.models:
            return False
        rate = getattr(self.plan, kind)
        hit = rate > 0 and self.rng.random() < rate
        if hit:
            self.injected[kind] += 1
        return hit

    def _at_call(self, model: str) -> None:
        self.calls += 1
        if self._roll("retired", model):
            raise ModelNotFound(f"5007: model {model} has been deprecated (injected)")
        if self._roll("fail", model):
            raise BindingError("3043: internal server error (injected)")

    async def run(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        """`options` (a session) pass through untouched: the injector sits in front of every
        `edgellm dev` binding, so conversations must keep their slots behind it."""
        self._at_call(model)
        if self._roll("delay_first", model):
            await asyncio.sleep(self.plan.delay_s)
        return await self.inner.run(model, inputs, **options)

    async def embed(self, model: str, texts: list[str]) -> dict[str, Any]:
        """Embeddings pass the same seam: a planned failure or retirement hits them too."""
        self._at_call(model)
        return await self.inner.embed(model, texts)  # type: ignore[attr-defined]

    async def stream(self, model: str, inputs: Mapping[str, Any], **options: Any) -> AsyncIterator[dict[str, Any]]:
        self._at_call(model)
        delay = self._roll("delay_first", model)
        stall = self._roll("stall", model)
        fail_mid = not stall and self._roll("fail_mid", model)
        try:
            inner = await self.inner.stream(model, inputs, **options)
        except asyncio.CancelledError:  # abandoned while the binding was opening it: it stopped the stream
            self.closed += 1
            raise
        return self._events(inner, delay, stall, fail_mid)

    async def _events(self, inner: AsyncIterator[dict[str, Any]], delay: bool, stall: bool, fail_mid: bool) -> AsyncIterator[dict[str, Any]]:
        self.sent = []
        tokens = 0
        try:
            if delay:
                await asyncio.sleep(self.plan.delay_s)
            async for event in inner:
                if event.get("response"):
                    if tokens == self.plan.after and stall:
                        await (asyncio.sleep(self.plan.stall_s) if self.plan.stall_s is not None else asyncio.Event().wait())
                    if tokens == self.plan.after and fail_mid:
                        raise BindingError("connection reset mid-stream (injected)")
                    tokens += 1
                    self.sent.append(event["response"])
                yield event
        finally:
            self.closed += 1
            await inner.aclose()  # type: ignore[attr-defined]


@dataclass
class FaultAdmin:
    """The `FaultControl` port over a `FaultyAI`: what the core's `GET|POST /admin/faults` route
    (`edgellm.fault_admin`) reads and replaces, injected as `Deps.faults` by `edge.dev_stack`."""

    faulty: FaultyAI

    def state(self) -> dict[str, Any]:
        faulty = self.faulty
        return {"plan": asdict(faulty.plan), "calls": faulty.calls, "closed": faulty.closed, "injected": faulty.injected}

    def replace_plan(self, plan: Mapping[str, Any]) -> None:
        self.faulty.plan = FaultPlan.from_json(plan)
