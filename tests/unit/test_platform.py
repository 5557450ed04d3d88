"""What the local edge adds like Cloudflare's edge: gzip for text when accepted (Content-Length
dropped), Content-Length on other fixed bodies, and Static Assets' 307 to the clean URL."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from edgellm.http import Request, Response
from edgellm_local.emulator.assets import StaticAssets
from edgellm_local.emulator.edge_encoding import encoded


def request(**headers: str) -> Request:
    return Request("GET", "http://edge/x", headers)


def test_fixed_json_carries_content_length_without_gzip() -> None:
    response = encoded(Response(200, {"content-type": "application/json"}, b'{"a":1}'), request())
    assert response.headers["content-length"] == "7" and "content-encoding" not in response.headers


def test_text_is_gzipped_when_accepted_and_content_length_dropped() -> None:
    body = b'{"answer":"' + b"x" * 500 + b'"}'
    response = encoded(Response(200, {"content-type": "application/json", "content-length": str(len(body))}, body),
                       request(**{"accept-encoding": "br, gzip;q=0.8"}))
    assert response.headers["content-encoding"] == "gzip" and "content-length" not in response.headers
    assert gzip.decompress(response.body) == body  # type: ignore[arg-type]
    binary = encoded(Response(200, {"content-type": "application/octet-stream"}, b"\x00" * 10), request(**{"accept-encoding": "gzip"}))
    assert "content-encoding" not in binary.headers and binary.headers["content-length"] == "10"


async def test_a_gzipped_stream_is_flushed_chunk_by_chunk() -> None:
    async def sse():
        yield b"data: 1\n\n"
        yield b"data: [DONE]\n\n"

    response = encoded(Response(200, {"content-type": "text/event-stream"}, sse()), request(**{"accept-encoding": "gzip"}))
    chunks = [chunk async for chunk in response.body]  # type: ignore[union-attr]
    import zlib

    decoder = zlib.decompressobj(31)
    assert decoder.decompress(chunks[0]) == b"data: 1\n\n"  # readable before the stream ends
    assert gzip.decompress(b"".join(chunks)) == b"data: 1\n\ndata: [DONE]\n\n"


async def test_a_gzipped_stream_longer_than_its_window_decodes_whole() -> None:
    events = [f'data: {{"choices":[{{"delta":{{"content":"token {i}"}}}}]}}\n\n'.encode() for i in range(400)]  # ~20 KiB

    async def sse():
        for event in events:
            yield event

    response = encoded(Response(200, {"content-type": "text/event-stream"}, sse()), request(**{"accept-encoding": "gzip"}))
    body = b"".join([chunk async for chunk in response.body])  # type: ignore[union-attr]
    assert gzip.decompress(body) == b"".join(events) and len(body) < len(b"".join(events)) // 4


def test_html_names_redirect_to_the_clean_url(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<p>home")
    (tmp_path / "chat.html").write_text("<p>chat")
    assets = StaticAssets(tmp_path)
    for path, location in (("/chat.html", "/chat"), ("/index.html", "/"), ("/chat.html?x=1", "/chat?x=1")):
        response = assets.serve(Request("GET", f"http://edge{path}"))
        assert response is not None and response.status == 307 and response.headers["location"] == location
    assert assets.serve(Request("GET", "http://edge/chat")).status == 200  # type: ignore[union-attr]


def test_a_kept_answer_is_gzipped_from_its_rest_deflated_once() -> None:
    """A HIT's kept answer (`KeptBytes`): its own leading fields in a stored block, then the rest
    deflated once per entry and kept with it; every decoder reads one whole gzip member."""
    import zlib

    from edgellm.http import json_bytes
    from edgellm.kept_json import KeptJSON

    data = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "text": "Grüß 😀 " * 40}
    kept = KeptJSON.of(data, json_bytes(data), ("id", "object", "created"))
    assert kept is not None
    gzipped = request(**{"accept-encoding": "gzip, deflate"})
    bodies = [kept.fill({"id": f"chatcmpl-{n}", "object": "chat.completion", "created": n}) for n in (2, 33333)]
    encodings = [encoded(Response(200, {"content-type": "application/json"}, bodies[0]), gzipped)]
    tail = kept.derived["gzip"]  # the first answer deflated the rest ...
    encodings.append(encoded(Response(200, {"content-type": "application/json"}, bodies[1]), gzipped))
    for body, response in zip(bodies, encodings):
        assert response.headers["content-encoding"] == "gzip" and "content-length" not in response.headers
        raw = bytes(response.body)  # type: ignore[arg-type]
        assert gzip.decompress(raw) == bytes(body) == json_bytes({**data, "id": json.loads(body)["id"], "created": json.loads(body)["created"]})
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)  # httpx's gzip decoder: one member, nothing after it
        assert stream.decompress(raw) == bytes(body) and stream.eof and stream.unused_data == b""
        assert raw[-8 - len(tail):-8] == tail and len(raw) < len(body) // 2
    assert kept.derived["gzip"] is tail  # ... and the second used it
    # no leading fields (the Workers AI route's answer): the rest alone
    whole = KeptJSON.of(data, json_bytes(data), ())
    assert whole is not None
    assert gzip.decompress(bytes(encoded(Response(200, {"content-type": "application/json"}, whole.fill(None)), gzipped).body)) == json_bytes(data)  # type: ignore[arg-type]
    # leading fields longer than a stored block holds: compressed whole, as any other body
    long_id = kept.fill({"id": "x" * 70_000, "object": "chat.completion", "created": 3})
    assert gzip.decompress(bytes(encoded(Response(200, {"content-type": "application/json"}, long_id), gzipped).body)) == bytes(long_id)  # type: ignore[arg-type]
    # not asked for gzip: the kept bytes as they are
    plain = encoded(Response(200, {"content-type": "application/json"}, bodies[0]), request())
    assert plain.body == bytes(bodies[0]) and plain.headers["content-length"] == str(len(bodies[0]))
