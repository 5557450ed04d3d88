"""Token reservations: a key's limits are taken at admission and settled when the answer ends.

Checked before and charged after, one request could spend 456 tokens on a 200-per-minute key
and six concurrent ones 2,694 of a 300-token budget: each saw the window as it was before any
of them had finished. So admission reserves what the request may cost (its prompt, estimated,
plus its `max_tokens`) in the key's token window and against its budget, and the end of the
request (`access.usage`) replaces the reservation by what was actually generated. The budget
admits a request only when its reservation fits what is left (`guard.admit_tokens` cuts a
generation's `max_tokens` to fit, and refuses an embedding, which cannot be cut); the token
window admits while anything is left, so within it a key overspends by at most one request's
reservation, concurrent or not. Plain per-isolate data (`AccessState`), like the rate windows.
"""

from __future__ import annotations

import math
from typing import Any

from ..state import AccessState
from ..caller import Reservation
from .ratelimit import Window

# Cautious on purpose: a reservation too large only holds a limit a little early (it is settled
# at the end), one too small would let the key overspend. Few tokenizers need 3 characters per
# token; a chat template adds role markers per message and a generation prompt (21 tokens for
# "question 0" on the test model's ChatML template).
CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 8
TOKENS_PER_PROMPT = 8


def prompt_estimate(inputs: dict[str, Any]) -> int:
    """The prompt's tokens, estimated from its characters and messages: what a request reserves
    for its prompt, and what it is charged for it when its answer never said (a stream cut
    before its end on a binding that reports usage only at the end)."""
    messages = inputs.get("messages")
    if isinstance(messages, list):
        chars = sum(len(str(m.get("content") or "")) for m in messages if isinstance(m, dict))
        return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages) + TOKENS_PER_PROMPT
    return math.ceil(len(str(inputs.get("prompt") or "")) / CHARS_PER_TOKEN) + TOKENS_PER_PROMPT


def reserve(state: AccessState, key_id: str, per_minute: int, model: str, prompt: int, max_tokens: int, now: float) -> Reservation:
    """Hold `prompt` (an estimate) plus `max_tokens` of the key's window and budget."""
    tokens = prompt + max(0, max_tokens)
    start = None
    if per_minute > 0:
        window = Window(state, f"{key_id}/tokens", per_minute)
        window.spend(now, tokens)
        start = state.windows[window.name][0]
    state.reserved[key_id] = state.reserved.get(key_id, 0) + tokens
    return Reservation(key_id, tokens, prompt, max_tokens, per_minute, start, model)


def settle(state: AccessState, reservation: Reservation, actual: int, now: float) -> None:
    """Replace the reservation by the `actual` tokens (once): in the window it went into if
    that window is still current, else as a plain charge of the current one."""
    if reservation.settled:
        return
    reservation.settled = True
    key_id = reservation.key_id
    state.reserved[key_id] = max(0, state.reserved.get(key_id, 0) - reservation.tokens)
    if not state.reserved[key_id]:
        del state.reserved[key_id]
    state.spent[key_id] = state.spent.get(key_id, 0) + max(0, actual)
    if reservation.per_minute <= 0:
        return
    window = Window(state, f"{key_id}/tokens", reservation.per_minute)
    current = state.windows.get(window.name)
    if current is not None and current[0] == reservation.window_start and now - current[0] < window.period:
        state.windows[window.name] = (current[0], max(0, current[1] - reservation.tokens + max(0, actual)))
    elif actual > 0:
        window.spend(now, actual)
