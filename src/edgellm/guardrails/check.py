"""What the guardrails did to one request (`RequestContext.guardrails`): written by the pipeline's
guardrails layer, read by the cache service (the answer's check) and on the way out (the header)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .answer import AnswerCheck
from .policy import Policy
from .prompt import header_value


@dataclass(frozen=True)
class PromptCheck:
    """What the guardrails did to this request's prompt: the policy applied, and by name only
    the categories and detectors flagged or masked."""

    policy: Policy
    flagged_categories: tuple[str, ...] = ()
    flagged_detectors: tuple[str, ...] = ()
    masked: tuple[str, ...] = ()
    guard_failed_open: bool = False
    # the answer's check (`guardrails.answer`, put on the generation's events by the cache
    # service); None when the policy checks nothing of answers
    answer: AnswerCheck | None = None
    # every verdict counted for this request, prompt's and answer's ("stage:label:action", the
    # /metrics counter's labels): shared with the answer's check, read by the usage row
    counted: set[str] = field(default_factory=set, compare=False)

    @property
    def usage_value(self) -> str:
        """`UsageEvent.guardrails`: the verdicts counted, sorted, comma-joined."""
        return ",".join(sorted(self.counted))

    @property
    def header(self) -> str | None:
        """The prompt's verdicts and, once a whole answer has been checked, the answer's."""
        if self.answer is not None:
            return self.answer.header
        return header_value(flagged_categories=self.flagged_categories, flagged_detectors=self.flagged_detectors,
                            masked=self.masked)
