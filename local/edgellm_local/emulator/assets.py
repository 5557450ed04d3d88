"""Static assets from `public/`, served the way Workers Static Assets serves them: a matching
file wins over the Worker, `/` is `index.html`, `/chat` finds `chat.html`, strong ETags, 304s."""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from edgellm.artifacts.conditional import none_match
from edgellm.http import Request, Response

# Where the `mime` package wrangler types assets with differs from Python's table (3.11 says
# application/javascript for .js and knows no .mjs); the rest is the same for what public/ holds.
_TYPES = {".js": "text/javascript", ".mjs": "text/javascript", ".json": "application/json", ".wasm": "application/wasm"}


def asset_content_type(name: str) -> str:
    """An asset's Content-Type as Workers Static Assets serves it: the type wrangler records when
    it uploads the file (wrangler 4.86 `getContentType`: the `mime` package's type, with
    `; charset=utf-8` added to `text/*` types only, so `.json` is a bare `application/json`)."""
    suffix = Path(name).suffix.lower()
    kind = _TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return f"{kind}; charset=utf-8" if kind.startswith("text/") and "charset" not in kind else kind


def same_origin(path: str) -> str:
    """`path` as a redirect target that can only be a path on this origin: exactly one leading
    slash. The request path may start with several (`//chat.html` is served as `/chat.html`), and
    a browser reads a Location of `//chat` (or `/\\chat`, or `/<tab>/chat`: it treats a backslash
    as a slash and drops tabs and newlines) as the host `chat`: an open redirect."""
    return "/" + path.lstrip("/\\\t\n\r ")


@dataclass
class StaticAssets:
    root: Path
    _etags: dict[tuple[Path, float, int], str] = field(default_factory=dict, init=False, repr=False)

    def find(self, path: str) -> Path | None:
        relative = unquote(path).lstrip("/")
        if relative in ("_headers", "_redirects"):  # configuration of the assets, never served (as on Cloudflare)
            return None
        if any(part in ("..", "") for part in relative.split("/")[:-1]) or "\\" in relative or "\0" in relative:
            return None
        root = self.root.resolve()
        candidates = [root / relative] if relative else []
        candidates += [root / relative / "index.html", root / f"{relative}.html"] if relative else [root / "index.html"]
        for candidate in candidates:
            try:  # a segment longer than the filesystem allows (ENAMETOOLONG) is simply no file
                resolved = candidate.resolve()
                if resolved.is_file() and resolved.is_relative_to(root):
                    return resolved
            except OSError:
                continue
        return None

    def _etag(self, file: Path) -> str:
        stat = file.stat()
        key = (file, stat.st_mtime, stat.st_size)
        if key not in self._etags:
            self._etags[key] = '"' + hashlib.sha256(file.read_bytes()).hexdigest()[:32] + '"'
        return self._etags[key]

    def serve(self, request: Request) -> Response | None:
        if request.method not in ("GET", "HEAD"):
            return None
        file = self.find(request.path)
        if file is None:
            return None
        if request.path.endswith(".html"):  # html_handling "auto-trailing-slash": the clean URL is the name
            clean = request.path[: -len("index.html")] if request.path.endswith("/index.html") else request.path[: -len(".html")]
            query = request.url.partition("?")[2]
            return Response(307, {"location": same_origin(clean) + (f"?{query}" if query else ""), "content-length": "0"})
        etag = self._etag(file)
        headers = {
            "etag": etag,
            "cache-control": "public, max-age=0, must-revalidate",
            "content-type": asset_content_type(file.name),
        }
        if none_match(request.header("if-none-match"), etag):
            return Response(304, headers)
        body = file.read_bytes()
        headers["content-length"] = str(len(body))
        return Response(200, headers, b"" if request.method == "HEAD" else body)
