"""llama.cpp's failures as the binding's errors (the port's `BindingError` family), in one place:
a refused input is `InvalidModelInput` (or the typed context error), anything else the runner
failing; `public` marks the texts the edge wrote itself, which a client may read."""

from __future__ import annotations

from typing import Any

from edgellm.ports import BindingError, ContextWindowExceeded, InvalidModelInput, with_public


class RunnerStopping(BindingError):
    """The runner is stopping (`edgellm dev` signalled): a generation cut or refused, retryable
    elsewhere or later (503 + Retry-After), never a finished answer (so never cached)."""

    retryable = True



def public(error: Any) -> Any:
    """An error whose text the edge wrote itself (no llama.cpp words in it): the client may read it,
    without its Workers AI code ("5006: ", "3040: ")."""
    return with_public(error, str(error).split(": ", 1)[-1])


def llama_exception(exc: BaseException) -> BindingError:
    """llama.cpp raises ValueError for input it refuses (its HTTP server answers those with 400,
    e.g. a chat ending in two assistant messages); anything else is the runner failing."""
    if isinstance(exc, ValueError):  # its text is llama.cpp's: the client reads the edge's own words (errors.binding_error)
        refusal = refusal_of(f"5006: llama.cpp: {exc}")
        if isinstance(refusal, ContextWindowExceeded):
            return refusal  # the gateway says its figures
        return with_public(refusal, "the model's chat template refused the messages (e.g. a conversation that ends in two "
                                    "assistant messages, or roles in an order the model does not take)")
    return BindingError(f"llama.cpp failed: {exc}")


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
        raise refusal_of(f"llama.cpp: {message}") if code == 400 else BindingError(f"llama.cpp: {message}")
