"""ASGI middleware that appends every request it sees to a JSON-lines file.

Used when a local edge plays an origin (`edgellm dev --request-log FILE`): a test reads the
origin's own log to prove what reached it, and what never did (a resident region's prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RequestLog:
    app: Any
    path: Path

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        done = False

        async def recording_receive() -> Any:
            nonlocal done
            message = await receive()
            if message["type"] == "http.request" and not done:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done = True
                    self._write(scope, b"".join(chunks))
            return message

        await self.app(scope, recording_receive, send)

    def _write(self, scope: dict[str, Any], body: bytes) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        entry = {"method": scope["method"], "path": scope["path"], "authorization": headers.get("authorization"),
                 "session": headers.get("x-session-affinity"), "traceparent": headers.get("traceparent"), "body": body.decode("utf-8", "replace")}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
            f.flush()
