"""A misbehaving OpenAI-compatible origin, as a real second process (raw asyncio sockets, no
HTTP library that would tidy its bytes up).

`python -m tests.support.hostile_origin` prints `hostile origin listening on http://127.0.0.1:PORT`.
`POST /mode` with `{"mode": NAME}` chooses how every later `/v1/...` request is answered:

- `ok`: a well-formed stream of a few tokens, usage, `[DONE]`;
- `gzip`: the same stream, gzip-compressed, declared by `content-encoding: gzip`;
- `unknown_encoding`: bytes declared as `content-encoding: x-squash`;
- `gzip_bomb`: 90 MB of one line without a newline, gzip-compressed (about 90 kB on the wire);
- `long_line`: 90 MB of one line without a newline, sent as it is;
- `no_headers`: reads the request and never answers;
- `pings`: headers, then an SSE comment (`: ping`) every 50 ms, never a token;
- `endless`: ignores `max_tokens`: tokens until the client leaves;
- `garbage`: a `data:` line that is not JSON;
- `garbage_late`: three good tokens, then an event that is JSON but not an object;
- `usage_huge` / `usage_negative`: good tokens, then usage of 1e308 / -5 tokens;
- `context_refusal`: llama.cpp's 400 for a prompt past its context (`exceed_context_size_error`,
  its counts), its message carrying `MARKER`;
- `refusal_500`: a 500 whose message carries `MARKER`;
- `error_event`: two good tokens, then an OpenAI error event whose message carries `MARKER`;
- `slow_tokens`: a token every 0.5 s for ever, each well within an idle budget: only a budget
  for the whole answer ends it;
- `json_answer` / `json_tool_call`: asked to stream, a whole `chat.completion` as
  `application/json` instead (a server that does not stream, or a proxy that buffered the
  answer): "one two three", or a call of `get_weather`, with its usage;
- `json_error`: a 200 `application/json` body that is an OpenAI error object carrying `MARKER`;
- `echo`: a well-formed stream of the last message's text, three characters a chunk (an answer
  that repeats the prompt, cut anywhere).

`MARKER` stands for an origin's own text (an internal path): it must reach the edge's log, never a client.

`GET /count` answers how many generation requests arrived (to see that a request reached it),
`GET /last` the body of the last one (what reached it).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MODES = ("ok", "gzip", "unknown_encoding", "gzip_bomb", "long_line", "no_headers", "pings", "endless",
         "garbage", "garbage_late", "usage_huge", "usage_negative", "context_refusal", "refusal_500", "error_event", "slow_tokens",
         "json_answer", "json_tool_call", "json_error", "echo")
MARKER = "/srv/hostile-origin/internal-7f3a"
BOMB_BYTES = 90 * 1024 * 1024


def token(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}).encode() + b"\n\n"


def usage(prompt: float, completion: float) -> bytes:
    return b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                                               "total_tokens": prompt + completion}}).encode() + b"\n\n"


def finish() -> bytes:
    return (b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode() + b"\n\n")


WEATHER_CALL = {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def completion(message: dict[str, object], reason: str) -> bytes:
    """A whole OpenAI chat completion, as a server that does not stream answers."""
    return json.dumps({"id": "chatcmpl-whole", "object": "chat.completion", "created": 1, "model": "origin-model",
                       "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": reason}],
                       "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}).encode()


GOOD = token("one ") + token("two ") + token("three") + finish() + usage(7, 3) + b"data: [DONE]\n\n"


def head(status: str = "200 OK", **extra: str) -> bytes:
    headers = {"content-type": "text/event-stream", "connection": "close", **{k.replace("_", "-"): v for k, v in extra.items()}}
    return f"HTTP/1.1 {status}\r\n".encode() + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n"


@dataclass
class HostileOrigin:
    mode: str = "ok"
    generations: int = 0
    last: bytes = b"{}"  # the last generation request's body
    bomb: bytes = b""  # made once at start-up: compressing 90 MB takes seconds

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = next((int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")), 0)
            body = await reader.readexactly(length) if length else b""
            if path == "/mode":
                mode = json.loads(body)["mode"]
                assert mode in MODES, mode
                self.mode = mode
                await self._json(writer, {"mode": mode})
            elif path == "/count":
                await self._json(writer, {"generations": self.generations})
            elif path == "/last":
                await self._json(writer, json.loads(self.last))
            else:
                self.generations += 1
                self.last = body
                await self._generate(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _json(self, writer: asyncio.StreamWriter, data: object) -> None:
        payload = json.dumps(data).encode()
        writer.write(head(content_type="application/json", content_length=str(len(payload))) + payload)
        await writer.drain()

    async def _generate(self, writer: asyncio.StreamWriter) -> None:
        mode = self.mode
        if mode == "no_headers":
            await asyncio.Event().wait()  # until the client gives up and the connection closes
        elif mode == "ok":
            writer.write(head() + GOOD)
        elif mode == "gzip":
            writer.write(head(content_encoding="gzip") + gzip.compress(GOOD))
        elif mode == "unknown_encoding":
            writer.write(head(content_encoding="x-squash") + GOOD)
        elif mode == "gzip_bomb":
            writer.write(head(content_encoding="gzip") + self.bomb)
        elif mode == "long_line":
            writer.write(head())
            block = b"a" * (1024 * 1024)
            writer.write(b"data: ")
            for _ in range(BOMB_BYTES // len(block)):
                writer.write(block)
                await writer.drain()
        elif mode == "pings":
            writer.write(head())
            while True:
                writer.write(b": ping\n\n")
                await writer.drain()
                await asyncio.sleep(0.05)
        elif mode == "endless":
            writer.write(head())
            while True:
                writer.write(token("more "))
                await writer.drain()
        elif mode == "garbage":
            writer.write(head() + b"data: {this is not json\n\n" + b"data: [DONE]\n\n")
        elif mode == "garbage_late":
            writer.write(head() + token("one ") + token("two ") + token("three") + b"data: [1, 2]\n\n" + b"data: [DONE]\n\n")
        elif mode == "usage_huge":
            writer.write(head() + token("one ") + finish() + usage(1e308, 1e308) + b"data: [DONE]\n\n")
        elif mode == "usage_negative":
            writer.write(head() + token("one ") + finish() + usage(-5, -5) + b"data: [DONE]\n\n")
        elif mode in ("context_refusal", "refusal_500"):
            refusal = {"error": {"code": 400, "message": f"the request exceeds the available context size ({MARKER})",
                                 "type": "exceed_context_size_error", "n_prompt_tokens": 4242, "n_ctx": 512}}
            if mode == "refusal_500":
                refusal = {"error": {"code": 500, "message": f"std::runtime_error at {MARKER}", "type": "server_error"}}
            payload = json.dumps(refusal).encode()
            status = "400 Bad Request" if mode == "context_refusal" else "500 Internal Server Error"
            writer.write(head(status, content_type="application/json", content_length=str(len(payload))) + payload)
        elif mode == "slow_tokens":
            writer.write(head())
            while True:
                writer.write(token("slow "))
                await writer.drain()
                await asyncio.sleep(0.5)  # the origin's own pace, never the test's clock
        elif mode in ("json_answer", "json_tool_call", "json_error"):
            payload = {"json_answer": completion({"content": "one two three"}, "stop"),
                       "json_tool_call": completion({"content": None, "tool_calls": [WEATHER_CALL]}, "tool_calls"),
                       "json_error": json.dumps({"error": {"message": f"no slot at {MARKER}", "type": "server_error"}}).encode()}[mode]
            writer.write(head(content_type="application/json; charset=utf-8", content_length=str(len(payload))) + payload)
        elif mode == "echo":
            messages = json.loads(self.last).get("messages") or [{"content": ""}]
            text = str(messages[-1].get("content") or "")
            writer.write(head() + b"".join(token(text[i:i + 3]) for i in range(0, len(text), 3)) + finish() + usage(7, len(text))
                         + b"data: [DONE]\n\n")
        elif mode == "error_event":
            error = {"error": {"message": f"slot died at {MARKER}", "type": "server_error"}}
            writer.write(head() + token("one ") + token("two ") + b"data: " + json.dumps(error).encode() + b"\n\n")
        await writer.drain()


@dataclass
class HostileOriginProcess:
    """The hostile origin as a child process: started by a fixture, which stops it."""

    process: "subprocess.Popen[str]"
    url: str

    @classmethod
    def start(cls) -> "HostileOriginProcess":
        process = subprocess.Popen([sys.executable, "-m", "tests.support.hostile_origin"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, cwd=Path(__file__).resolve().parents[2],
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert process.stdout is not None
        line = process.stdout.readline()  # its first line names its port (or the process failed)
        if "listening on " not in line:
            process.kill()
            process.wait(10)
            raise RuntimeError("the hostile origin did not start: " + line + process.stdout.read())
        return cls(process, line.rsplit(" ", 1)[1].strip())

    def set_mode(self, mode: str) -> None:
        with urllib.request.urlopen(urllib.request.Request(self.url + "/mode", json.dumps({"mode": mode}).encode(), method="POST"),
                                    timeout=10) as answer:
            assert json.loads(answer.read())["mode"] == mode

    def generations(self) -> int:
        with urllib.request.urlopen(self.url + "/count", timeout=10) as answer:
            return int(json.loads(answer.read())["generations"])

    def last_body(self) -> dict[str, object]:
        with urllib.request.urlopen(self.url + "/last", timeout=10) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=10)


async def main() -> None:
    origin = HostileOrigin(bomb=gzip.compress(b"data: " + b"a" * BOMB_BYTES, 6))
    server = await asyncio.start_server(origin.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"hostile origin listening on http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
