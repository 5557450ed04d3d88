"""The router: `{name}` matches one segment, `{name:path}` the rest; 404 vs 405 with Allow."""

from __future__ import annotations

import pytest

from edgellm.errors import ErrorKind, GatewayError
from edgellm.router import Router, route


async def chat(request, deps):  # type: ignore[no-untyped-def]
    return "chat"


async def models(request, deps):  # type: ignore[no-untyped-def]
    return "models"


async def run(request, deps):  # type: ignore[no-untyped-def]
    return "run"


async def account(request, deps):  # type: ignore[no-untyped-def]
    return "account"


ROUTER = Router((
    route("POST", "/v1/chat/completions", chat),
    route("GET", "/v1/models", models),
    route("POST", "/client/v4/accounts/{account_id}/ai/run/{model:path}", run),
    route(["GET", "DELETE"], "/accounts/{account_id}", account),
))


@pytest.mark.parametrize(
    ("method", "path", "handler", "params"),
    [
        ("POST", "/v1/chat/completions", chat, {}),
        ("GET", "/v1/models", models, {}),
        ("HEAD", "/v1/models", models, {}),  # every GET route answers HEAD
        ("POST", "/client/v4/accounts/abc123/ai/run/@cf/meta/llama-2-7b-chat-int8", run,
         {"account_id": "abc123", "model": "@cf/meta/llama-2-7b-chat-int8"}),
        # model ids contain slashes: `{model:path}` takes the rest of the path
        ("POST", "/client/v4/accounts/a/ai/run/x/y/z", run, {"account_id": "a", "model": "x/y/z"}),
        # parameters are percent-decoded after matching
        ("POST", "/client/v4/accounts/a%20b/ai/run/%40cf%2Fmeta%2Fm", run, {"account_id": "a b", "model": "@cf/meta/m"}),
        ("DELETE", "/accounts/42", account, {"account_id": "42"}),
    ],
)
def test_match(method: str, path: str, handler, params: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    found, found_params = ROUTER.match(method, path)
    assert found is handler
    assert found_params == params


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/v1/chat/completions/",  # no implicit trailing slash
        "/v1/chat",
        "/v1/models/extra",
        "/client/v4/accounts/abc/ai/run/",  # an empty model
        "/client/v4/accounts/a/b/ai/run/m",  # `{account_id}` is one segment only
        "/accounts/a%2Fb/extra",
        "/V1/MODELS",  # paths are case-sensitive
    ],
)
def test_unknown_path_is_404(path: str) -> None:
    with pytest.raises(GatewayError) as info:
        ROUTER.match("GET", path)
    assert info.value.kind is ErrorKind.NOT_FOUND
    assert info.value.status == 404
    assert info.value.code == "route_not_found"
    assert path in info.value.message


def test_encoded_slash_stays_inside_one_segment() -> None:
    _, params = ROUTER.match("GET", "/accounts/a%2Fb")
    assert params == {"account_id": "a/b"}


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "OPTIONS, POST"),
        ("PUT", "/v1/chat/completions", "OPTIONS, POST"),
        ("POST", "/v1/models", "GET, HEAD, OPTIONS"),
        ("GET", "/client/v4/accounts/a/ai/run/@cf/meta/m", "OPTIONS, POST"),
        ("POST", "/accounts/1", "DELETE, GET, HEAD, OPTIONS"),
    ],
)
def test_wrong_method_is_405_with_allow(method: str, path: str, allow: str) -> None:
    with pytest.raises(GatewayError) as info:
        ROUTER.match(method, path)
    error = info.value
    assert error.status == 405
    assert error.headers == {"allow": allow}
    assert method in error.message and allow in error.message
    assert error.to_response().headers["allow"] == allow


def test_405_merges_methods_of_every_route_on_the_path() -> None:
    router = Router((route("GET", "/x", models), route("POST", "/x", chat)))
    assert router.match("POST", "/x")[0] is chat
    with pytest.raises(GatewayError) as info:
        router.match("PATCH", "/x")
    assert info.value.headers["allow"] == "GET, HEAD, OPTIONS, POST"


def test_a_route_says_how_its_errors_render() -> None:
    def envelope(error: GatewayError):  # type: ignore[no-untyped-def]
        return "enveloped"

    router = Router((
        route("POST", "/client/v4/accounts/{account_id}/ai/run/{model:path}", run, render_error=envelope),
        route("POST", "/v1/chat/completions", chat),
    ))
    assert router.error_renderer("/client/v4/accounts/a/ai/run/@cf/m") is envelope  # any method: 405s too
    assert router.error_renderer("/v1/chat/completions") is None
    assert router.error_renderer("/client/v4/accounts/a/ai/runs/m") is None  # a path prefix alone chooses nothing
