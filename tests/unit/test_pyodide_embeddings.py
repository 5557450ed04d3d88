"""Embeddings on the Cloudflare path: the core's `/v1/embeddings` and bge REST route over the
Pyodide adapter's `WorkersAI.embed`, with only the `env.AI` binding stood in.

The stand-in's contract is Workers AI's bge model page (developers.cloudflare.com/workers-ai/
models/bge-small-en-v1.5): input `{"text": string | string[]}` (at most 100 texts), output
`{"shape": [n, d], "data": number[][], "pooling"?: "mean" | "cls"}`, no token count; errors are
`JsException`s with Workers AI's numbered text (5006 for a refused input).
"""

from __future__ import annotations

import base64
import json
import logging
import struct
from typing import Any

import pytest

from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.http import Request
from tests.support import fake_pyodide as fp

BGE = "@cf/baai/bge-small-en-v1.5"


class FakeBgeBinding:
    """`env.AI` for bge-small: a deterministic 384-wide vector per text (its bytes' hash)."""

    def __init__(self, error: str | None = None) -> None:
        self.error, self.calls = error, []

    async def run(self, model: str, inputs: Any) -> Any:
        inputs = fp.require_js_object(inputs)
        self.calls.append((model, inputs))
        if self.error:
            raise fp.JsException(self.error)
        texts = inputs["text"] if isinstance(inputs["text"], list) else [inputs["text"]]
        data = [[((hash(text) >> (i % 32)) & 0xFF) / 255.0 for i in range(384)] for text in texts]
        return fp.JsDict({"shape": [len(texts), 384], "data": data, "pooling": "mean"})


@pytest.fixture
def workers_ai():
    with fp.installed():
        from edgellm.runtime.pyodide_ai import WorkersAI

        yield WorkersAI


def deps(ai: Any) -> Deps:
    return Deps(config=Config(open_access=True, embedding_models=(BGE,)), ai=ai, kv=None, log=logging.getLogger("edgellm.test"))


def post(path: str, body: Any) -> Request:
    return Request("POST", f"http://edge.test{path}", {"content-type": "application/json"}, json.dumps(body).encode())


async def test_openai_embeddings_over_the_workers_ai_binding(workers_ai) -> None:
    binding = FakeBgeBinding()
    response = await handle(post("/v1/embeddings", {"model": BGE, "input": ["a", "b"], "encoding_format": "base64"}), deps(workers_ai(binding)))
    assert response.status == 200
    body = json.loads(response.body)
    model, inputs = binding.calls[0]
    assert model == BGE and inputs["text"] == ["a", "b"]  # one binding call, the texts as a JS array
    vectors = [struct.unpack("<384f", base64.b64decode(d["embedding"])) for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1] and len(vectors[0]) == 384
    assert body["usage"]["prompt_tokens"] == 6  # estimated (the binding counts none): a word and [CLS] [SEP] each


async def test_the_bge_rest_route_answers_in_workers_ai_shape(workers_ai) -> None:
    response = await handle(post(f"/client/v4/accounts/acc/ai/run/{BGE}", {"text": "hello"}), deps(workers_ai(FakeBgeBinding())))
    result = json.loads(response.body)["result"]
    assert result["shape"] == [1, 384] and len(result["data"][0]) == 384


@pytest.mark.parametrize(("message", "status", "param"), [
    ("AiError: 5006: Input validation error: /text/0 must NOT have more than 512 tokens", 400, "input"),
    ("InferenceUpstreamError: 3040: Capacity temporarily exceeded, please try again.", 503, None),
    ("InferenceUpstreamError: 3043: Internal server error", 502, None),
])
async def test_binding_failures_are_a_400_or_a_502_503_with_retry_after(workers_ai, message: str, status: int, param: str | None) -> None:
    response = await handle(post("/v1/embeddings", {"model": BGE, "input": "x"}), deps(workers_ai(FakeBgeBinding(message))))
    assert response.status == status
    assert json.loads(response.body)["error"]["param"] == param
    if status >= 500:
        assert int(response.headers["retry-after"]) > 0


async def test_the_model_list_gives_the_catalogs_kind_and_dimension(workers_ai) -> None:
    response = await handle(Request("GET", "http://edge.test/v1/models", {}, b""), deps(workers_ai(FakeBgeBinding())))
    entry = next(m for m in json.loads(response.body)["data"] if m["id"] == BGE)["edgellm"]
    assert (entry["kind"], entry["dimensions"], entry["context_window"]) == ("embedding", 384, 512)
