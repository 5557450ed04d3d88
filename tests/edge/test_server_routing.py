"""The local edge routes API paths before looking for a static file (the lookup probes the
filesystem on every request), which is only faithful to Workers Static Assets, where a matching
file wins, while no file in `public/` has a route's path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import httpx

from edgellm.app import ROUTES
from edgellm.http import Request, Response
from edgellm.deps import Deps
from edgellm_local.emulator.assets import StaticAssets
from edgellm_local.edge import DEFAULT_PUBLIC
from edgellm_local.emulator.server import EdgeApp, EdgeServer


@dataclass
class RecordingAssets(StaticAssets):
    looked_up: list[str] = field(default_factory=list)

    def serve(self, request: Request) -> Response | None:
        self.looked_up.append(request.path)
        return super().serve(request)


def test_no_static_file_shares_a_routes_path() -> None:
    files = [p for p in DEFAULT_PUBLIC.rglob("*") if p.is_file()]
    assert files
    for file in files:
        relative = file.relative_to(DEFAULT_PUBLIC).as_posix()
        urls = {"/" + relative, "/" + relative.removesuffix(".html"), "/" + relative.removesuffix("index.html").rstrip("/")}
        assert not any(ROUTES.has_path(url) for url in urls if url != "/"), relative


def test_api_requests_skip_the_asset_lookup_and_pages_still_come_from_it(make_deps: Callable[..., Deps]) -> None:
    assets = RecordingAssets(DEFAULT_PUBLIC)
    with EdgeServer(EdgeApp(make_deps(), assets)) as edge:
        assert httpx.get(edge.url + "/healthz").status_code == 200
        assert httpx.get(edge.url + "/v1/models").status_code == 200
        assert httpx.get(edge.url + "/models/nothing/manifest.json").status_code == 404
        assert assets.looked_up == []
        page = httpx.get(edge.url + "/chat")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert httpx.get(edge.url + "/openapi.json").json()["openapi"].startswith("3.1")
        assert assets.looked_up == ["/chat", "/openapi.json"]
    with EdgeServer(EdgeApp(make_deps(), baseline := RecordingAssets(DEFAULT_PUBLIC), api_first=False)) as edge:
        assert httpx.get(edge.url + "/healthz").status_code == 200
        assert baseline.looked_up == ["/healthz"]  # the benchmark's baseline: the old order


def test_every_request_meets_the_apps_current_deps(make_deps: Callable[..., Deps]) -> None:
    """The app makes its requests' deps once (`EdgeApp._request_deps`), and again when its deps
    are replaced, as `edgellm dev` does when it wraps the AI binding: a request never meets the
    deps that were replaced."""
    from dataclasses import replace


    app = EdgeApp(make_deps())
    with EdgeServer(app) as edge:
        first = httpx.get(edge.url + "/healthz").json()["model"]
        app.deps = replace(app.deps, config=replace(app.deps.config, model="@cf/meta/llama-3.1-8b-instruct"))
        assert first != "@cf/meta/llama-3.1-8b-instruct"
        assert httpx.get(edge.url + "/healthz").json()["model"] == "@cf/meta/llama-3.1-8b-instruct"
