"""`public/_headers` (Workers Static Assets' custom headers file), applied by the local edge to
the assets it serves, so pages get the same X-Content-Type-Options, CSP and frame-ancestors
as on Cloudflare. Supports the file's `/*`-style and exact path rules."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from edgellm.http import Response


@dataclass(frozen=True)
class HeaderRules:
    rules: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    @classmethod
    def load(cls, public: Path | None) -> "HeaderRules":
        file = public / "_headers" if public else None
        if file is None or not file.is_file():
            return cls()
        rules: list[tuple[str, list[tuple[str, str]]]] = []
        for line in file.read_text().splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if not line[0].isspace():
                rules.append((line.strip(), []))
            elif rules and ":" in line:
                name, value = line.strip().split(":", 1)
                rules[-1][1].append((name.strip().lower(), value.strip()))
        return cls(tuple((pattern, tuple(headers)) for pattern, headers in rules))

    def apply(self, path: str, response: Response) -> Response:
        for pattern, headers in self.rules:
            if fnmatch.fnmatchcase(path, pattern):
                for name, value in headers:
                    response.headers.setdefault(name, value)
        return response
