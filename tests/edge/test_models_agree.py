"""`/v1/models` and Workers AI's models list (`/client/v4/accounts/{id}/ai/models/search`) are two
views of one set: the models this edge serves. A client that reads the context window from one
and a dashboard that reads it from the other must see the same number, the one the edge really
serves (the local edge's llama.cpp context per slot; on Cloudflare the shipped catalog), and
both list the embedding models."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import httpx
import pytest

from edgellm.capabilities import WORKERS_AI_MODELS, workers_ai_description
from edgellm.config import Config
from edgellm_local.emulator.server import EdgeServer

BGE = "@cf/baai/bge-small-en-v1.5"
CONFIG = Config(open_access=True, fallback_models=("@cf/meta/llama-3.1-8b-instruct",), embedding_models=(BGE,))


class CatalogAI:
    """The Worker's AI binding as the Worker sees it: it describes a model only from the shipped
    catalog (runtime/pyodide_ai.py's `WorkersAI.describe`; workerd's binding describes nothing)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def describe(self, model: str, *, live: bool = True) -> Any:
        return workers_ai_description(model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def both_views(edge: EdgeServer) -> tuple[dict[str, dict], dict[str, dict]]:
    models = httpx.get(f"{edge.url}/v1/models").json()["data"]
    listed = {m["id"]: m for m in models if m["edgellm"]["role"] != "alias"}
    searched = httpx.get(f"{edge.url}/client/v4/accounts/any/ai/models/search", params={"per_page": 100}).json()
    assert searched["success"] is True
    return listed, {m["name"]: m for m in searched["result"]}


def window(entry: dict) -> int:
    (value,) = [p["value"] for p in entry["properties"] if p["property_id"] == "context_window"]
    return int(value)


@pytest.mark.parametrize("where", ["local", "cloudflare"])
def test_both_model_lists_name_the_same_models_with_the_same_context_window(
        start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Any], where: str) -> None:
    deps = make_deps(config=CONFIG)
    if where == "cloudflare":
        deps = replace(deps, ai=CatalogAI(deps.ai))
    listed, searched = both_views(start_edge(deps))
    assert sorted(listed) == sorted(searched) == sorted([CONFIG.model, *CONFIG.fallback_models, BGE])
    for model, entry in listed.items():
        assert entry["edgellm"]["context_window"] == window(searched[model]), model
    if where == "local":  # what llama.cpp really gives each request: its slot's context
        runner = deps.ai.models[CONFIG.model]
        assert listed[CONFIG.model]["edgellm"]["context_window"] == runner.slot_context
    else:  # the shipped catalog's
        assert listed[CONFIG.model]["edgellm"]["context_window"] == WORKERS_AI_MODELS[CONFIG.model].context_window
    assert window(searched[BGE]) == WORKERS_AI_MODELS[BGE].context_window  # the most tokens one text may have
    assert searched[BGE]["task"]["name"] == "Text Embeddings" and searched[CONFIG.model]["task"]["name"] == "Text Generation"


def test_one_model_retrieved_says_what_the_list_says(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Any]) -> None:
    edge = start_edge(make_deps(config=CONFIG))
    listed, _ = both_views(edge)
    for model, entry in listed.items():
        assert httpx.get(f"{edge.url}/v1/models/{model}").json()["edgellm"]["context_window"] == entry["edgellm"]["context_window"]
