"""How the slot pool matches prompts to slots and states, as pure functions: which tenant a
session's states may be shared within, the text a prompt is matched on, and how many leading
characters two prompts share (with the thresholds that make a shared start worth a slot)."""

from __future__ import annotations

from typing import Any

# llama.cpp's server takes a slot whose cache holds at least `slot_prompt_similarity` (0.1) of a
# prompt; it can afford to, since its RAM cache restores what that evicts. A pool has no such
# cache (it would cross tenants), so it evicts a tenant's prompt for a mere similar one only when
# that saves half of the new prompt; less than that, an empty slot keeps both.
SIMILAR_START = 0.5

# A request with no state of its own takes a copy of its tenant's state (a restore: a file read and
# hashed, ~5 ms for 10 MiB here) when that shares at least this many more characters of its prompt
# than the slot it got holds: ~40 tokens, more than a chat template's opening (which the slot
# reuses in place anyway), less than any system prompt worth keeping (~1 s of prefill per 100
# tokens for SmolLM2-135M on one loaded core, far more for larger models).
SHARED_START = 160


def session_scope(session: str, tenant: str | None) -> str | None:
    """The tenant a session's states may be shared within, or None (shared with nothing): the
    admitted `tenant` if the session's name agrees with it. A keyed tenant's sessions are named
    `<tenant>:<name>` (`edgellm.sessions.tenant_session`; tenant names hold no ':'); a keyless
    caller's (open mode, the admin token) keep their bare name, under the one default tenant. A
    name that is neither (a keyless caller naming `acme:x`, or a generation started in another
    request's context, such as a coalesced flight's) shares nothing."""
    if tenant is None:
        return None
    if session.startswith(tenant + ":") or ":" not in session:
        return tenant
    return None


def prompt_text(body: dict[str, Any]) -> str:
    """What a sessionless prompt is matched on when a slot is chosen for it: its messages (role
    and content, in order) or its raw prompt. Equal starts here are equal starts of the rendered
    prompt, which is what llama.cpp's `cache_prompt` reuses."""
    if "messages" in body:
        return "".join(f"\x1e{m.get('role', '')}\x1f{m.get('content', '')!s}" for m in body["messages"] if isinstance(m, dict))
    return str(body.get("prompt", ""))


def common_start(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share (os.path.commonprefix, without its list)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # binary search on slices: C-speed comparisons, not a Python loop per character
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low
