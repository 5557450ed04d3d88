"""`public/openapi.json` is valid OpenAPI 3.1 and cannot drift from the code: its paths and
methods are the router's, and its ranges, error types and cache headers are the core's own."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator

from edgellm.app import ROUTES
from edgellm.cache.policy import CLASS_HEADER, MAX_TTL, MIN_TTL
from edgellm.config import Config
from edgellm.errors import ErrorKind
from edgellm.http import Request
from edgellm.workers_ai import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE, SAMPLING
from edgellm_local.emulator.assets import StaticAssets
from edgellm_local.edge import DEFAULT_PUBLIC

DOC_PATH = DEFAULT_PUBLIC / "openapi.json"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
GENERATION_OPS = [("/v1/chat/completions", "ChatCompletionRequest"), ("/v1/completions", "CompletionRequest"),
                  ("/client/v4/accounts/{account_id}/ai/run/{model}", "WorkersAIRunRequest")]


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return json.loads(DOC_PATH.read_text())


def resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        *_, section, name = node["$ref"].split("/")
        node = doc["components"][section][name]
    return node


def router_table() -> dict[str, set[str]]:
    """The router's templates with `{name:path}` written as OpenAPI's `{name}`, each with the
    methods of every entry for it (one path may have an entry per method)."""
    table: dict[str, set[str]] = {}
    for r in ROUTES.routes:
        table.setdefault(re.sub(r"\{(\w+):path\}", r"{\1}", r.template), set()).update(r.methods)
    return table


def doc_table(doc: dict[str, Any]) -> dict[str, set[str]]:
    table = {}
    for path, item in doc["paths"].items():
        methods = {m.upper() for m in item if m in HTTP_METHODS}
        table[path] = methods | ({"HEAD"} if "GET" in methods else set())  # the router answers HEAD for every GET
    return table


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1.")
    errors = [e.message for e in OpenAPIV31SpecValidator(doc).iter_errors()]
    assert errors == []


def test_paths_and_methods_are_exactly_the_routers(doc: dict[str, Any]) -> None:
    assert doc_table(doc) == router_table()


def test_every_operation_is_named_and_every_ref_resolves(doc: dict[str, Any]) -> None:
    text = DOC_PATH.read_text()
    for ref in set(re.findall(r'"\$ref": "([^"]+)"', text)) | set(re.findall(r'"(#/components/[^"]+)"', text)):
        *_, section, name = ref.split("/")
        assert name in doc["components"][section], ref
    ids = [op["operationId"] for item in doc["paths"].values() for m, op in item.items() if m in HTTP_METHODS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", sorted(SAMPLING))
def test_sampling_ranges_are_workers_ais(doc: dict[str, Any], name: str) -> None:
    kind, lo, hi = SAMPLING[name]
    for schema_name in ("ChatCompletionRequest", "CompletionRequest", "WorkersAIRunRequest"):
        prop = doc["components"]["schemas"][schema_name]["properties"][name]
        assert ("integer" if kind == "int" else "number") in prop["type"], (schema_name, name)
        assert (prop.get("minimum"), prop.get("maximum")) == (lo, hi), (schema_name, name)


def test_max_tokens_and_defaults_are_the_cores(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    for schema_name in ("ChatCompletionRequest", "CompletionRequest", "WorkersAIRunRequest"):
        prop = schemas[schema_name]["properties"]["max_tokens"]
        assert (prop["minimum"], prop["maximum"], prop["default"]) == (1, Config().context_window, DEFAULT_MAX_TOKENS)
        assert schemas[schema_name]["properties"]["temperature"]["default"] == DEFAULT_TEMPERATURE
    for schema_name in ("ChatCompletionRequest", "CompletionRequest"):
        assert schemas[schema_name]["properties"]["max_completion_tokens"]["maximum"] == Config().context_window


def test_error_shape_names_every_error_type(doc: dict[str, Any]) -> None:
    error = doc["components"]["schemas"]["Error"]["properties"]["error"]
    assert error["required"] == ["message", "type", "param", "code"]
    assert set(error["properties"]["type"]["enum"]) == {kind.type for kind in ErrorKind}


def test_every_error_response_is_the_error_shape_and_5xx_says_retry_after(doc: dict[str, Any]) -> None:
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                response = resolve(doc, response)
                if int(status) < 400 or method == "head":
                    continue
                schema = resolve(doc, response["content"]["application/json"]["schema"])
                assert schema is doc["components"]["schemas"]["Error"] or {"$ref": "#/components/schemas/Error"} in schema.get("allOf", []), (path, status)
                if int(status) >= 500:
                    assert int(status) in (502, 503) and "Retry-After" in response["headers"], (path, status)


@pytest.mark.parametrize("path,body_schema", GENERATION_OPS)
def test_generation_routes_document_cache_headers_and_sse(doc: dict[str, Any], path: str, body_schema: str) -> None:
    op = doc["paths"][path]["post"]
    headers = {resolve(doc, p)["name"].lower() for p in op["parameters"] if resolve(doc, p)["in"] == "header"}
    chat = path == "/v1/chat/completions"
    # a session keeps the prompt cached; the semantic cache matches a chat's last user message
    session = {"x-session-affinity", "x-edgellm-semantic-cache"} if chat else set()
    assert headers == {"cf-aig-skip-cache", "cf-aig-cache-ttl", "cf-aig-cache-key", "cache-control", CLASS_HEADER} | session
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + body_schema)
    ok = op["responses"]["200"]
    assert set(ok["content"]) == {"application/json", "text/event-stream"}
    semantic = {"x-edgellm-cache-match"} if chat else set()
    assert {h.lower() for h in ok["headers"]} == {"cf-aig-cache-status", "age", "x-edgellm-cache-key", "x-edgellm-model"} | semantic
    assert set(op["responses"]) == {"200", "400", "401", "403", "404", "413", "429", "502", "503"}


def test_ttl_bounds_in_the_prose_are_the_policys(doc: dict[str, Any]) -> None:
    assert f"{MIN_TTL}..{MAX_TTL}" in doc["components"]["schemas"]["PreloadRequest"]["properties"]["ttl"]["description"]


def test_admin_routes_need_the_bearer_token(doc: dict[str, Any]) -> None:
    scheme = doc["components"]["securitySchemes"]["adminBearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, item in doc["paths"].items():
        for method, op in item.items():
            security = op.get("security") or []
            # /metrics too: behind the admin token unless the edge opens it (the local edge on loopback)
            assert ({"adminBearer": []} in security) == (path.startswith("/admin/") or path == "/metrics"), (path, method)
            if path.startswith("/admin/"):
                assert {"401", "403", "404"} <= set(op["responses"])


def test_api_routes_document_the_key_scheme_and_its_refusals(doc: dict[str, Any]) -> None:
    """The auth scheme is the guard's: Bearer or x-api-key on the API; a tenant key on the
    admin routes a tenant may use on its own entries (purge, stats, usage)."""
    from edgellm.access.guard import is_api_path

    schemes = doc["components"]["securitySchemes"]
    assert (schemes["apiKeyBearer"]["scheme"], schemes["apiKeyHeader"]["in"], schemes["apiKeyHeader"]["name"]) == ("bearer", "header", "x-api-key")
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if is_api_path(path):
                assert {"apiKeyBearer": []} in op["security"] and {"apiKeyHeader": []} in op["security"], (path, method)
                assert {"401", "429"} <= set(op["responses"]), (path, method)
            elif not (path.startswith("/admin/") or path == "/metrics"):
                assert "security" not in op, (path, method)  # pages, health and artifacts stay public
    tenant_routes = {p for p, item in doc["paths"].items() for op in item.values() if {"apiKeyBearer": []} in op.get("security", []) and p.startswith("/admin/")}
    assert tenant_routes == {"/admin/cache/purge", "/admin/cache/stats", "/admin/usage"}


def test_artifact_route_documents_conditional_and_range_answers(doc: dict[str, Any]) -> None:
    get = doc["paths"]["/models/{path}"]["get"]
    assert {"200", "206", "304", "416"} <= set(get["responses"])
    names = {resolve(doc, p)["name"] for p in get["parameters"]}
    assert names == {"path", "If-None-Match", "Range", "If-Range"}
    assert "Content-Range" in get["responses"]["206"]["headers"]
    assert "Content-Range" in resolve(doc, get["responses"]["416"])["headers"]


def test_the_local_edge_serves_the_document_as_a_json_asset() -> None:
    response = StaticAssets(DEFAULT_PUBLIC).serve(Request("GET", "http://edge/openapi.json"))
    assert response is not None and response.status == 200
    assert response.headers["content-type"].startswith("application/json")
    assert json.loads(response.body) == json.loads(Path(DOC_PATH).read_text())
