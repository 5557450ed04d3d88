"""The answer's guardrails: a step on a generation's events, between the engine and both the
cache writer and the renderer (`cache.service.cached_generation` puts it there), so one check both
cuts what the client reads and decides what may be cached.

A streamed answer is checked in windows of `window` tokens: each window is held back until its
verdict, then released. A whole answer is one window: it is checked before any of it is sent.
With a DLP policy every token also passes the incremental `Scanner`, and a token is released only
once the scanner has settled the text it ends in (a finding split across two windows is still
found whole: the scanner holds back the tail a finding could still be growing into).

- A blocked category or detector ends the answer: `Finish("content_filter")`, never cacheable,
  and on a stream then an error event (`content_filter`).
- A `mask` finding is replaced, in the tokens released, by its masked form (`[email]`).
- Any finding, and any flagged category, makes the answer uncacheable: the cache never keeps
  an answer that carries a finding, nor one a later caller's header would have to re-flag.
- A guard that fails follows GUARD_FAIL: closed ends the answer with `guard_unavailable`;
  open releases the window, counted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping

from ..errors import ErrorKind, GatewayError
from ..generation import Event, Finish, Token, Usage
from ..ports import BindingError
from ..stream import close_source, owns
from .dlp import Finding, Scanner, redact
from .policy import Policy
from .prompt import header_value

if TYPE_CHECKING:
    from ..deps import Deps

@dataclass
class AnswerVerdicts:
    """What the answer's check found, by name only: read by the guardrails layer for the
    `x-edgellm-guardrails` header of a whole answer."""

    flagged_categories: set[str] = field(default_factory=set)
    flagged_detectors: set[str] = field(default_factory=set)
    masked: set[str] = field(default_factory=set)
    blocked: tuple[str, ...] = ()
    counted: set[str] = field(default_factory=set)  # "answer:label:action", for the usage row (the request's PromptCheck's set)


@dataclass(frozen=True)
class AnswerCheck:
    policy: Policy  # the caller's policy: its `answer` categories and its `dlp` detectors
    conversation: tuple[Mapping[str, Any], ...]  # the (masked) prompt's turns, for the guard
    window: int  # tokens per window; 0: the whole answer is one window
    verdicts: AnswerVerdicts
    # what the prompt's check flagged and masked (categories, detectors, masked detectors): the
    # header's value is the prompt's and the answer's together
    prompt_found: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] = ((), (), ())
    # placeholder -> the caller's value, when its policy unmasks answers (`unmask_answer`) and
    # the prompt had a value masked; empty otherwise. Kept for this request only: never logged,
    # stored or cached (`guardrails.unmask` puts the values back after the cache writer)
    placeholders: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def header(self) -> str | None:
        """`x-edgellm-guardrails`' value for the prompt and, as far as it is checked, the answer."""
        categories, detectors, masked = self.prompt_found
        found = self.verdicts
        return header_value(
            flagged_categories=tuple(dict.fromkeys(categories + tuple(sorted(found.flagged_categories, key=lambda c: int(c[1:]))))),
            flagged_detectors=tuple(dict.fromkeys(detectors + tuple(sorted(found.flagged_detectors)))),
            masked=tuple(dict.fromkeys(masked + tuple(sorted(found.masked)))))

    @property
    def active(self) -> bool:
        return bool(self.policy.answer or self.policy.dlp)


def _cut(error_code: str, message: str) -> GatewayError:
    kind = ErrorKind.UNAVAILABLE if error_code == "guard_unavailable" else ErrorKind.INVALID_REQUEST
    return GatewayError(kind, message, code=error_code)


@owns("events")
async def checked_answer(events: AsyncIterator[Event], deps: "Deps", check: AnswerCheck, stream: bool) -> AsyncIterator[Event]:
    """`events` with the answer's guardrails applied (see the module's docstring)."""
    policy, verdicts = check.policy, check.verdicts

    def count(stage: str, label: str, action: str) -> None:
        """The /metrics counter, and the same verdict for the request's usage row."""
        deps.state.telemetry.count_guardrail(stage, label, action)
        verdicts.counted.add(f"{stage}:{label}:{action}")
    scanner = Scanner(policy.dlp) if policy.dlp else None
    pending: list[tuple[Event, int, int]] = []  # held events with their [start, end) in the answer's text
    text: list[str] = []
    size = 0
    judged = 0 if policy.answer else -1  # -1: no moderation (everything judged)
    unjudged_tokens = 0
    masked_spans: list[Finding] = []
    found = False
    tokens = 0

    async def moderate() -> str | None:
        """The guard's verdict on the answer so far: the blocked categories' names, or None."""
        answer = "".join(text)
        if not answer.strip():
            return None
        messages = [*check.conversation, {"role": "assistant", "content": answer}]
        try:
            if deps.guard is None:
                raise BindingError("no guard model is configured")
            verdict = await asyncio.wait_for(deps.guard.classify(messages), deps.config.guard_timeout_seconds)
        except (BindingError, asyncio.TimeoutError) as exc:
            count("answer", "guard_error", deps.config.guard_fail)
            if deps.config.guard_fail == "open":
                deps.log.warning("the content guard failed on an answer (%s); GUARD_FAIL=open lets it through",
                                 redact(str(exc) or type(exc).__name__))
                return None
            raise _cut("guard_unavailable", "The content guard is unavailable, so the answer cannot be checked; retry later.") from None
        blocked = tuple(c for c in verdict.categories if policy.answer.get(c) == "block")
        for category in verdict.categories:
            action = policy.answer.get(category)
            if action is not None:
                count("answer", category, action)
            if action == "flag":
                verdicts.flagged_categories.add(category)
        return ", ".join(blocked) if blocked else None

    def scanned(findings: list[Finding]) -> str | None:
        nonlocal found
        blocked = []
        for finding in findings:
            found = True
            action = policy.dlp[finding.detector]
            count("answer", finding.detector, action)
            if action == "block":
                blocked.append(finding.detector)
            elif action == "mask":
                verdicts.masked.add(finding.detector)
                masked_spans.append(finding)
            else:
                verdicts.flagged_detectors.add(finding.detector)
        return ", ".join(sorted(set(blocked))) if blocked else None

    def released(event: Event, start: int, end: int) -> Event:
        if not isinstance(event, Token) or not masked_spans:
            return event
        out: list[str] = []
        for offset, char in enumerate(event.text, start):
            span = next((f for f in masked_spans if f.start <= offset < f.end), None)
            if span is None:
                out.append(char)
            elif offset == span.start:
                out.append(span.masked)
        return replace(event, text="".join(out))

    async def stop(blocked: str, finished: Finish | None = None) -> Finish:
        """The answer ends here: the generation is stopped now (not when the client lets go).
        Its usage: the model's own when it had finished, else the tokens read (the usage record
        puts the reservation's estimate in for the prompt)."""
        await close_source(events)
        verdicts.blocked = tuple(blocked.split(", "))
        if finished is not None:  # its usage and route as the model said them
            return replace(finished, finish_reason="content_filter", cacheable=False, guardrails=check.header)
        return Finish("content_filter", Usage(0, tokens), cacheable=False, guardrails=check.header)

    def refusal(blocked: str) -> GatewayError:
        return _cut("content_filter", f"The answer was stopped by this gateway's content policy ({blocked}).")

    async for event in events:
        if isinstance(event, Finish):
            blocked = scanned(scanner.close()) if scanner is not None else None
            if blocked is None and judged >= 0 and unjudged_tokens:
                blocked = await moderate()
            if blocked is not None:
                yield await stop(blocked, event)
                if stream:  # then an error event (the renderer's), and no [DONE]
                    raise refusal(blocked)
                return
            for held, start, until in pending:
                yield released(held, start, until)
            pending.clear()
            flagged = found or bool(verdicts.flagged_categories)
            yield replace(event, cacheable=event.cacheable and not flagged, guardrails=check.header)
            continue
        start = size
        if isinstance(event, Token):
            tokens += 1
            text.append(event.text)
            size += len(event.text)
            unjudged_tokens += 1
        pending.append((event, start, size))
        blocked = scanned(scanner.feed(event.text)) if scanner is not None and isinstance(event, Token) else None
        if blocked is None and judged >= 0 and check.window and unjudged_tokens >= check.window:
            blocked = await moderate()
            judged, unjudged_tokens = size, 0
        if blocked is not None:
            yield await stop(blocked)
            if stream:
                raise refusal(blocked)
            return
        limit = min(judged if judged >= 0 else size, scanner.settled if scanner is not None else size)
        while pending and pending[0][2] <= limit:
            held, start, until = pending.pop(0)
            yield released(held, start, until)
