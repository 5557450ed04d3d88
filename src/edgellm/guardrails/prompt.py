"""The prompt side of the guardrails: which strings of a generation request's body are the prompt,
what the DLP policy does to them (block, mask, flag), and the conversation the guard judges.

Pure functions over the parsed JSON body, so the pipeline's layer (`pipeline.guardrails`) decides
once, before any handler, and hands the handler a body in which every masked finding is already
a placeholder: nothing downstream (inference, an origin, the cache key, a stored conversation)
ever sees the value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .dlp import Finding, scan
from .policy import Policy

# The body fields that hold the prompt, per generation route (the match layer's template).
PROMPT_FIELDS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("messages",),
    "/v1/completions": ("prompt",),
    "/v1/responses": ("input", "instructions"),
    "workers-ai": ("messages", "prompt"),
}

# Keys inside a message that are structure, not text a person wrote (a role, an id), or binary
# content (an image's data URL, audio) a text detector must not rewrite.
_STRUCTURE = frozenset({"role", "type", "id", "call_id", "tool_call_id", "name", "status", "detail", "format",
                        "image_url", "input_audio", "file", "file_data", "image", "audio", "url"})

# The most prompt text scanned: the detectors' worst case is about 0.5 MB/s (docs/guardrails.md),
# so a request is checked in well under a second whatever it holds. A longer prompt under a DLP
# policy is refused rather than sent on partly unread.
SCAN_LIMIT = 256 * 1024


@dataclass
class _Leaf:
    container: Any  # the dict or list holding the string
    key: Any  # its key or index there
    text: str


def _leaves(value: Any, container: Any, key: Any) -> Iterator[_Leaf]:
    if isinstance(value, str):
        if value:
            yield _Leaf(container, key, value)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, value, index)
    elif isinstance(value, dict):
        for name, item in value.items():
            if name not in _STRUCTURE:
                yield from _leaves(item, value, name)


def prompt_leaves(body: Mapping[str, Any], route: str) -> list[_Leaf]:
    """Every string of the prompt, where it sits in `body` (so a masked one is put back there)."""
    leaves: list[_Leaf] = []
    for name in PROMPT_FIELDS.get(route, ()):
        if name in body:
            leaves.extend(_leaves(body[name], body, name))
    return leaves


@dataclass
class DLPOutcome:
    """What the DLP policy found in a prompt, by detector name only (never the values)."""

    blocked: tuple[str, ...] = ()
    masked: tuple[str, ...] = ()
    flagged: tuple[str, ...] = ()
    # placeholder -> value: what the masking replaced, to unmask an answer for its caller (kept
    # only for the request, never logged, stored or cached)
    placeholders: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.masked)


class _Masker:
    """Numbered placeholders shared across every string of one prompt: the same value gets the
    same placeholder in every message (as `dlp.mask` does within one text)."""

    def __init__(self) -> None:
        self.by_value: dict[tuple[str, str], str] = {}
        self.counts: dict[str, int] = {}

    def placeholder(self, finding: Finding) -> str:
        key = (finding.detector, finding.value)
        if key not in self.by_value:
            self.counts[finding.detector] = self.counts.get(finding.detector, 0) + 1
            self.by_value[key] = f"[{finding.detector.upper()}_{self.counts[finding.detector]}]"
        return self.by_value[key]

    def apply(self, text: str, findings: list[Finding]) -> str:
        pieces: list[str] = []
        position = 0
        for finding in findings:
            pieces.append(text[position:finding.start])
            pieces.append(self.placeholder(finding))
            position = finding.end
        pieces.append(text[position:])
        return "".join(pieces)


def apply_dlp(leaves: list[_Leaf], policy: Policy) -> DLPOutcome:
    """Scan every prompt string for the detectors `policy.dlp` names; a `block` finding decides
    alone (nothing is rewritten), else `mask` findings are replaced in place in the body."""
    actions = policy.dlp
    found: list[tuple[_Leaf, list[Finding]]] = []
    seen: dict[str, str] = {}
    for leaf in leaves:
        findings = scan(leaf.text, actions)
        if findings:
            found.append((leaf, findings))
            for finding in findings:
                seen[finding.detector] = actions[finding.detector]
    outcome = DLPOutcome(
        blocked=tuple(sorted(d for d, a in seen.items() if a == "block")),
        masked=tuple(sorted(d for d, a in seen.items() if a == "mask")),
        flagged=tuple(sorted(d for d, a in seen.items() if a == "flag")),
    )
    if outcome.blocked or not outcome.masked:
        return outcome
    masker = _Masker()
    for leaf, findings in found:
        masking = [f for f in findings if actions[f.detector] == "mask"]
        if masking:
            leaf.container[leaf.key] = masker.apply(leaf.text, masking)
    outcome.placeholders = {placeholder: value for (_, value), placeholder in masker.by_value.items()}
    return outcome


def guard_conversation(body: Mapping[str, Any], route: str) -> list[dict[str, Any]]:
    """The prompt as `{role, content}` turns for the guard (`moderation.guard_messages` makes them
    alternate): chat messages as they are; a completion's prompt as the user's turn; a Responses
    request's instructions and input items (a tool's output on the user's side)."""
    turns: list[dict[str, Any]] = []
    if route == "/v1/responses" and isinstance(body.get("instructions"), str):
        turns.append({"role": "system", "content": body["instructions"]})
    messages = body.get("input") if route == "/v1/responses" else body.get("messages")
    if isinstance(messages, str):
        turns.append({"role": "user", "content": messages})
    elif isinstance(messages, list):
        for item in messages:
            if isinstance(item, Mapping):
                content = item.get("content", item.get("output", item.get("arguments", "")))
                turns.append({"role": item.get("role", "user"), "content": content})
            elif isinstance(item, str):
                turns.append({"role": "user", "content": item})
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        turns.append({"role": "user", "content": prompt})
    elif isinstance(prompt, list):
        turns.append({"role": "user", "content": "\n".join(p for p in prompt if isinstance(p, str))})
    return turns


def header_value(*, flagged_categories: tuple[str, ...] = (), flagged_detectors: tuple[str, ...] = (),
                 masked: tuple[str, ...] = ()) -> str | None:
    """`x-edgellm-guardrails`: what the guardrails did to a request that went through, by
    category and detector name only (`flagged; categories=S2`); None when they did nothing."""
    words = []
    if flagged_categories or flagged_detectors:
        words.append("flagged")
    if masked:
        words.append("masked")
    if not words:
        return None
    if flagged_categories:
        words.append("categories=" + ",".join(flagged_categories))
    detectors = tuple(dict.fromkeys(flagged_detectors + masked))
    if detectors:
        words.append("detectors=" + ",".join(detectors))
    return "; ".join(words)
