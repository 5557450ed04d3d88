"""One translator for every binding's failures: the failure decides the answer, not the binding."""

from __future__ import annotations

import pytest

from edgellm.errors import RetryAfter, binding_error
from edgellm.ports import (BindingError, CapacityExceeded, ContextWindowExceeded, InvalidModelInput, KVLimitError, KVRateLimited,
                           ModelNotFound, with_public)

BINDINGS = [("The AI binding", "upstream"), ("KV", "kv"), ("R2", "r2")]


def _retryable(message: str) -> BindingError:
    error = BindingError(message)
    error.retryable = True
    return error


@pytest.mark.parametrize(("binding", "code"), BINDINGS)
@pytest.mark.parametrize(
    ("failure", "status", "expected_code", "retry_after"),
    [
        (BindingError("boom"), 502, "{code}_error", RetryAfter.DEPENDENCY),
        (_retryable("(10043) unavailable"), 503, "{code}_unavailable", RetryAfter.DEPENDENCY),
        (CapacityExceeded("3040: Capacity temporarily exceeded"), 503, "capacity_exceeded", RetryAfter.DEPENDENCY),
        (ModelNotFound("5007: No such model"), 502, "model_unavailable", RetryAfter.DEPENDENCY),
        (InvalidModelInput("5006: bad input"), 400, "invalid_model_input", None),
        # a prompt past the window, typed (the local runner) or as Workers AI words it (5021): OpenAI's code
        (ContextWindowExceeded("llama.cpp: request (4404 tokens) exceeds the available context size (2048 tokens)"), 400,
         "context_length_exceeded", None),
        (InvalidModelInput("AiError: 5021: The estimated number of input and maximum output tokens (9000) exceeded this "
                           "model context window limit (8192)."), 400, "context_length_exceeded", None),
        (KVLimitError("KV PUT failed: 414 key too long"), 400, "kv_limit", None),
        (KVRateLimited("KV PUT failed: 429 Too Many Requests"), 429, "kv_rate_limited", RetryAfter.KV_WRITE),
    ],
)
def test_a_failure_is_answered_the_same_whichever_binding_failed(
    binding: str, code: str, failure: BindingError, status: int, expected_code: str, retry_after: int | None
) -> None:
    error = binding_error(failure, binding, code, "the subject")
    assert (error.status, error.code, error.retry_after) == (status, expected_code.format(code=code), retry_after)
    response = error.to_response()
    assert response.headers.get("retry-after") == (None if retry_after is None else str(retry_after))
    assert str(failure) not in error.message and str(failure) in (error.detail or "")  # the binding's text: the log's, not the client's
    assert error.message.endswith(".")


def test_only_an_adapters_public_text_or_a_schema_refusal_reaches_the_client() -> None:
    internal = "llama.cpp: std::bad_alloc at /root/models/x.gguf"
    assert internal not in binding_error(BindingError(internal), "The AI binding", "upstream", "m").message
    told = binding_error(with_public(BindingError(internal), "the local model server is stopping"), "The AI binding", "upstream", "m")
    assert internal not in told.message and "the local model server is stopping" in told.message
    schema = "5006: Input validation error: /max_tokens: must be <= 4096"
    assert schema in binding_error(InvalidModelInput(schema), "The AI binding", "upstream", "m").message
    window = binding_error(ContextWindowExceeded("llama.cpp: the request (4404 tokens) exceeds the available context size (2048 tokens)"),
                           "The AI binding", "upstream", "m")
    assert "llama.cpp" not in window.message and "4404" in window.message and "2048" in window.message
