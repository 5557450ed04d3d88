"""The answer unmasked for its caller (`unmask_answer`): the placeholders this request's prompt
masking issued (`[EMAIL_1]`) put back to the caller's values, in the answer only the caller reads.

The step goes last on the generation's events (`cache.service` puts it there), after the answer's
check and after the cache writer: the check judges the masked answer (the caller's own values
never count as findings), the cache stores the masked answer (a HIT is unmasked with its own
caller's map, never another's), and logs, traces and usage rows never see a value.

A streamed answer may cut a placeholder anywhere; the unmasker holds back only a proper prefix
of one of this request's placeholders at a piece's end (at most the longest placeholder less a
character), until it completes or cannot, and releases the rest at the end. Only this request's
placeholders are replaced: a placeholder-shaped text the model made up stays as it is.

Tool-call arguments are unmasked too (a call the caller's code runs needs the real address), per
call, with each value escaped as JSON string content (a placeholder sits inside a JSON string).
Logprobs keep the model's own tokens: they describe what the model produced.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import AsyncIterator, Mapping

from ..generation import Event, Token, ToolCallDelta
from ..stream import owns


class Unmasker:
    """Unmasks a text that arrives in pieces: `feed` returns what is final, `close` the rest."""

    __slots__ = ("_map", "_pattern", "_prefixes", "_held")

    def __init__(self, placeholders: Mapping[str, str]) -> None:
        self._map = dict(placeholders)
        # a placeholder is `[NAME_N]`: one '[' at its start, one ']' at its end, so none is a
        # prefix of another and a partial one is the text from the last '['
        self._pattern = re.compile("|".join(re.escape(p) for p in sorted(self._map, key=len, reverse=True))) if self._map else None
        self._prefixes = frozenset(p[:n] for p in self._map for n in range(1, len(p)))
        self._held = ""

    @property
    def held(self) -> int:
        """Characters held back (a placeholder's proper prefix): fewer than the longest one."""
        return len(self._held)

    def _sub(self, text: str) -> str:
        if self._pattern is None or "[" not in text:
            return text
        return self._pattern.sub(lambda match: self._map[match.group()], text)

    def feed(self, text: str) -> str:
        text = self._held + text
        self._held = ""
        if self._pattern is None:
            return text
        start = text.rfind("[")
        if start >= 0 and text[start:] in self._prefixes:
            text, self._held = text[:start], text[start:]
        return self._sub(text)

    def close(self) -> str:
        text, self._held = self._held, ""
        return text  # a partial placeholder is no placeholder: released as it was


def remasked(text: str, placeholders: Mapping[str, str]) -> str:
    """`text` with the caller's values put back to their placeholders (an unmasked answer kept
    for a later turn must hold no more than the model saw)."""
    by_value = {value: placeholder for placeholder, value in placeholders.items() if value}
    if not by_value:
        return text
    pattern = re.compile("|".join(re.escape(v) for v in sorted(by_value, key=len, reverse=True)))
    return pattern.sub(lambda match: by_value[match.group()], text)


@owns("events")
async def unmasked_answer(events: AsyncIterator[Event], placeholders: Mapping[str, str]) -> AsyncIterator[Event]:
    """`events` with this request's placeholders put back in the text and tool-call arguments."""
    text = Unmasker(placeholders)
    in_json = {placeholder: json.dumps(value)[1:-1] for placeholder, value in placeholders.items()}
    calls: dict[int, Unmasker] = {}
    async for event in events:
        if isinstance(event, Token):
            out = text.feed(event.text)
            if out or event.logprobs is not None:
                yield replace(event, text=out)
        elif isinstance(event, ToolCallDelta):
            rest = text.close()  # a placeholder does not run on from the text into a call
            if rest:
                yield Token(rest)
            unmasker = calls.get(event.index)
            if unmasker is None:
                unmasker = calls[event.index] = Unmasker(in_json)
            out = unmasker.feed(event.arguments)
            if out or event.id is not None or event.name is not None:
                yield replace(event, arguments=out)
        else:  # the Finish: what is held goes out before it
            rest = text.close()
            if rest:
                yield Token(rest)
            for index, unmasker in calls.items():
                rest = unmasker.close()
                if rest:
                    yield ToolCallDelta(index, arguments=rest)
            yield event
    rest = text.close()  # a source that ended without its Finish: what was held still goes out
    if rest:
        yield Token(rest)

