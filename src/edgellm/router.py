"""A flat routing table: path templates with `{name}` (one segment) and `{name:path}` (the rest).

Matching is three-way like Starlette's: no path matches (404), a path matches but not the
method (405 with `Allow`), or a full match. Templates match the raw, percent-encoded path, so
`%2F` inside a segment never turns into a path separator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, TYPE_CHECKING
from urllib.parse import unquote

from .errors import ErrorKind, GatewayError

if TYPE_CHECKING:
    from .http import Request, Response
    from .deps import Deps

# a handler is given the request, the bindings and what the pipeline learned of the request
# (`context.RequestContext`, not named here: the context names the router's type)
Handler = Callable[["Request", "Deps", Any], Awaitable["Response"]]
ErrorRenderer = Callable[[GatewayError], "Response"]

_PARAM = re.compile(r"\{(\w+)(?::(path))?\}")


def _compile(template: str) -> re.Pattern[str]:
    pattern, pos = "", 0
    for m in _PARAM.finditer(template):
        pattern += re.escape(template[pos : m.start()])
        pattern += f"(?P<{m.group(1)}>.+)" if m.group(2) else f"(?P<{m.group(1)}>[^/]+)"
        pos = m.end()
    pattern += re.escape(template[pos:])
    return re.compile(f"^{pattern}$")


@dataclass(frozen=True)
class Route:
    methods: frozenset[str]
    template: str
    handler: Handler
    # how this route's errors render (e.g. inside Cloudflare's envelope); None: the OpenAI error JSON
    render_error: ErrorRenderer | None = None
    pattern: re.Pattern[str] = field(init=False, compare=False)
    name: str = field(init=False, compare=False)  # the handler's name, as the log line says it

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", _compile(self.template))
        object.__setattr__(self, "name", getattr(self.handler, "__name__", "handler"))


def route(methods: str | Iterable[str], template: str, handler: Handler, *, render_error: ErrorRenderer | None = None) -> Route:
    names = {methods} if isinstance(methods, str) else set(methods)
    if "GET" in names:
        names.add("HEAD")
    return Route(frozenset(names), template, handler, render_error)


@dataclass(frozen=True)
class Router:
    routes: tuple[Route, ...]

    def error_renderer(self, path: str) -> ErrorRenderer | None:
        """How errors on `path` render: as the first route whose template matches it says
        (whatever the method, so a 405 renders like the route's own errors); None for no route."""
        return next((r.render_error for r in self.routes if r.pattern.match(path)), None)

    def has_path(self, path: str) -> bool:
        """Whether any route's template matches `path`, whatever the method: the local edge asks
        before probing the filesystem for a static asset (no asset shares a route's path)."""
        return any(r.pattern.match(path) for r in self.routes)

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        matched, params = self.resolve(method, path)
        return matched.handler, params

    def resolve(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        """The route serving `method` on `path` and the path's decoded parameters; else the
        404 or 405 (with `Allow`) the request gets."""
        allowed: set[str] = set()
        for r in self.routes:
            m = r.pattern.match(path)
            if not m:
                continue
            if method in r.methods:  # a template without parameters (most API routes) has none to decode
                return r, {k: unquote(v) for k, v in m.groupdict().items()} if r.pattern.groups else {}
            allowed |= r.methods
        if allowed:
            allow = ", ".join(sorted(allowed | {"OPTIONS"}))
            raise GatewayError(
                ErrorKind.METHOD_NOT_ALLOWED,
                f"Method {method} is not allowed on {path}; allowed: {allow}.",
                code="method_not_allowed",
                headers={"allow": allow},
            )
        raise GatewayError(ErrorKind.NOT_FOUND, f"No route for {method} {path}.", code="route_not_found")
