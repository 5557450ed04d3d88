"""The guardrails policy (`GUARDRAILS`, a [vars] JSON value and per key): what each moderation
category on prompts and answers, and each DLP detector, leads to.

    {"moderation": {"prompt": {"S1": "block", ...}, "answer": {...}},
     "dlp": {"secret": "block", "payment_card": "mask", "email": "mask", ...},
     "unmask_answer": true}

Actions: `block` refuses (a prompt) or ends (an answer); `mask` replaces the finding before it
leaves the edge; `flag` lets it through and says so. A category or detector the policy does not
name is allowed. `unmask_answer` (default false) puts the caller's own masked values back into
its answer, after the answer's check and the cache (`guardrails.unmask`). A bad value is a configuration error that names it, at start and in deploy-check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .dlp import DETECTORS
from .moderation import CATEGORIES

ACTIONS = ("flag", "mask", "block")
# How strict an action is; `mask` is between the two: the data does not leave, the answer goes on.
_RANK = {None: 0, "flag": 1, "mask": 2, "block": 3}
# Moderation has no span to mask: a category may be flagged or blocked.
MODERATION_ACTIONS = ("flag", "block")
STAGES = ("prompt", "answer")
SECTIONS = ("moderation", "dlp", "unmask_answer")


class PolicyError(ValueError):
    """The GUARDRAILS value is not a policy; its text names the bad value and where it is."""


def _frozen(value: dict[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Policy:
    prompt: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    answer: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    dlp: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    # the answer has this request's placeholders put back to the caller's values (LiteLLM's
    # `output_parse_pii`); not a strictness: the cache and the origin still see the placeholders
    unmask_answer: bool = False

    @property
    def empty(self) -> bool:
        return not (self.prompt or self.answer or self.dlp)

    @property
    def needs_guard(self) -> bool:
        """Whether a moderation model must be behind this policy (without one it is a
        configuration error at start)."""
        return bool(self.prompt or self.answer)

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {"moderation": {"prompt": dict(self.prompt), "answer": dict(self.answer)}, "dlp": dict(self.dlp)}
        if self.unmask_answer:  # said only when on: the value an entry keeps of its policy stays as it was
            value["unmask_answer"] = True
        return value


NO_POLICY = Policy()


def _table(value: Any, where: str, names: Mapping[str, Any] | tuple[str, ...], kind: str,
           actions: tuple[str, ...]) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise PolicyError(f"GUARDRAILS {where} must be an object of {kind} -> action, not {value!r}")
    table: dict[str, str] = {}
    for name, action in value.items():
        if name not in names:
            known = ", ".join(names)
            raise PolicyError(f"GUARDRAILS {where}: unknown {kind} {name!r} (known: {known})")
        if action not in actions:
            raise PolicyError(f"GUARDRAILS {where}.{name}: unknown action {action!r} (one of {', '.join(actions)})")
        table[name] = action
    return table


def parse_policy(value: str | Mapping[str, Any] | None) -> Policy:
    """A policy from the JSON text (or its parsed object); None or "" is no policy."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return NO_POLICY
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise PolicyError(f"GUARDRAILS is not JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise PolicyError(f"GUARDRAILS must be a JSON object, not {value!r}")
    for key in value:
        if key not in SECTIONS:
            raise PolicyError(f"GUARDRAILS: unknown section {key!r} (known: {', '.join(SECTIONS)})")
    moderation = value.get("moderation", {})
    if not isinstance(moderation, Mapping):
        raise PolicyError(f"GUARDRAILS moderation must be an object with prompt and answer, not {moderation!r}")
    for key in moderation:
        if key not in STAGES:
            raise PolicyError(f"GUARDRAILS moderation: unknown stage {key!r} (known: prompt, answer)")
    prompt = _table(moderation.get("prompt", {}), "moderation.prompt", CATEGORIES, "category", MODERATION_ACTIONS)
    answer = _table(moderation.get("answer", {}), "moderation.answer", CATEGORIES, "category", MODERATION_ACTIONS)
    dlp = _table(value.get("dlp", {}), "dlp", DETECTORS, "detector", ACTIONS)
    unmask = value.get("unmask_answer", False)
    if not isinstance(unmask, bool):
        raise PolicyError(f"GUARDRAILS unmask_answer must be true or false, not {unmask!r}")
    if unmask and "mask" not in dlp.values():
        raise PolicyError("GUARDRAILS unmask_answer is true but no dlp detector is 'mask': there would be nothing to unmask")
    return Policy(_frozen(prompt), _frozen(answer), _frozen(dlp), unmask)


def _at_least(stricter: Mapping[str, str], than: Mapping[str, str]) -> bool:
    names = set(stricter) | set(than)
    return all(_RANK[stricter.get(name)] >= _RANK[than.get(name)] for name in names)


def at_least_as_strict(policy: Policy, than: Policy) -> bool:
    """Every category and detector leads to an action at least as strict under `policy` as under
    `than` (no entry is the least strict of all)."""
    return (_at_least(policy.prompt, than.prompt) and _at_least(policy.answer, than.answer)
            and _at_least(policy.dlp, than.dlp))


def stricter_than(policy: Policy, than: Policy) -> bool:
    """`policy` asks for more than `than` somewhere: a cached answer checked under `than` must be
    checked again before `policy`'s caller gets it. Not the inverse of `at_least_as_strict`:
    two policies strict in different places are each stricter than the other."""
    return not at_least_as_strict(than, policy)
