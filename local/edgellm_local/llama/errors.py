"""llama.cpp's failures as the binding's errors (the port's `BindingError` family), in one place:
a refused input is `InvalidModelInput` (or the typed context error), anything else the runner
failing; `public` marks the texts the edge wrote itself, which a client may read."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from edgellm.ports import BindingError, ContextWindowExceeded, InvalidModelInput, with_public


class RunnerStopping(BindingError):
    """The runner is stopping (`edgellm dev` signalled): a generation cut or refused, retryable
    elsewhere or later (503 + Retry-After), never a finished answer (so never cached)."""

    retryable = True



# llama.cpp's own words for a JSON schema it cannot turn into a grammar, or a grammar it cannot
# parse: the converter's "JSON schema error at #/...", "JSON schema conversion failed", and the
# sampler's "failed to parse grammar" (a count past 2000, a left-recursive rule)
_GRAMMAR_FAILURE = re.compile(r"JSON schema|parse grammar|grammar", re.IGNORECASE)
GRAMMAR_REFUSED = ("llama.cpp could not build a grammar from the request's JSON schema (its response_format, or a tool's "
                   "parameters): simplify the schema")
# The most of llama.cpp's text an error keeps (its log line): its converter writes the part of
# the schema it refused into it, which may be the caller's whole schema (one line once held 6.5 MB)
LOGGED_CHARS = 300


def bounded(text: str) -> str:
    """llama.cpp's text as the log may hold it: a long one cut, with its size and hash, which
    say which schema it was (the same schema, the same hash) without writing it out. A prompt
    logged by `log_prompts` is cut too (PROMPT_CHARS), so nothing is lost that the log keeps."""
    if len(text) <= LOGGED_CHARS:
        return text
    whole = text.encode("utf-8", "replace")
    return f"{text[:LOGGED_CHARS]}... [{len(whole)} bytes, sha256 {hashlib.sha256(whole).hexdigest()[:16]}]"


def public(error: Any) -> Any:
    """An error whose text the edge wrote itself (no llama.cpp words in it): the client may read it,
    without its Workers AI code ("5006: ", "3040: ")."""
    return with_public(error, str(error).split(": ", 1)[-1])


def llama_exception(exc: BaseException) -> BindingError:
    """llama.cpp raises ValueError for input it refuses (its HTTP server answers those with 400,
    e.g. a chat ending in two assistant messages); anything else is the runner failing."""
    if isinstance(exc, ValueError):  # its text is llama.cpp's: the client reads the edge's own words (errors.binding_error)
        text = str(exc)
        refusal = refusal_of(f"5006: llama.cpp: {bounded(text)}")
        if isinstance(refusal, ContextWindowExceeded):
            return refusal  # the gateway says its figures
        if _GRAMMAR_FAILURE.search(text):
            return with_public(refusal, GRAMMAR_REFUSED)
        return with_public(refusal, "the model's chat template refused the messages (e.g. a conversation that ends in two "
                                    "assistant messages, or roles in an order the model does not take)")
    return BindingError(f"llama.cpp failed: {bounded(str(exc))}")


def refusal_of(message: str) -> InvalidModelInput:
    """llama.cpp's refusal of an input; a prompt past the slot's context ("the request (N tokens)
    exceeds the available context size (M tokens)") is the typed context error."""
    if "exceeds the available context size" in message:
        return ContextWindowExceeded(message)
    return InvalidModelInput(message)


def raise_llama_error(result: Any) -> None:
    if isinstance(result, dict) and "error" in result:
        error = result["error"]
        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
        code = error.get("code") if isinstance(error, dict) else None
        if code != 400:
            raise BindingError(f"llama.cpp: {bounded(message)}")
        refusal = refusal_of(f"llama.cpp: {bounded(message)}")
        raise with_public(refusal, GRAMMAR_REFUSED) if _GRAMMAR_FAILURE.search(message) else refusal
