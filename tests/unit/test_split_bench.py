"""The pure parts of the split-inference benchmark (`bench/split/`): the delay proxy's
bookkeeping over a real loopback connection (no delay), the placement formula, the line fit and
the table. The benchmark itself (namespaces, a llama.cpp build) runs only under `make bench-split`."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from bench.split.__main__ import edge_block_count, render
from bench.split.proxy import CHUNK, DelayProxy, Direction, TrafficCounts, TrafficLedger
from bench.split.report import fit_line, format_table, placements, split_token_seconds

UP, DOWN = Direction.UP, Direction.DOWN


@pytest.mark.parametrize(("chunks", "round_trips"), [
    ([], 0),
    ([(UP, 5)], 0),  # asked, never answered
    ([(DOWN, 5)], 0),  # the far side speaking first (a greeting) is no round trip
    ([(UP, 5), (DOWN, 7)], 1),
    ([(UP, 5), (UP, 5), (DOWN, 7), (DOWN, 7)], 1),  # split writes on either side: still one wait
    ([(UP, 5), (DOWN, 7), (UP, 5), (DOWN, 7), (UP, 1), (DOWN, 1)], 3),
    ([(UP, 5), (DOWN, 0), (UP, 0), (DOWN, 7)], 1),  # empty reads (EOF) are not traffic
])
def test_ledger_counts_a_round_trip_per_answer_after_a_question(chunks, round_trips):
    ledger = TrafficLedger()
    connection = ledger.open()
    for direction, n in chunks:
        ledger.record(connection, direction, n)
    counts = ledger.snapshot()
    assert counts.round_trips == round_trips
    assert counts.bytes_up == sum(n for d, n in chunks if d is UP)
    assert counts.bytes_down == sum(n for d, n in chunks if d is DOWN)
    assert counts.chunks_up == sum(1 for d, n in chunks if d is UP and n)
    assert counts.connections == 1


def test_ledger_keeps_connections_apart_and_snapshots_subtract():
    ledger = TrafficLedger()
    a, b = ledger.open(), ledger.open()
    ledger.record(a, UP, 10)
    ledger.record(b, DOWN, 3)  # b's answer does not close a's question
    before = ledger.snapshot()
    ledger.record(a, DOWN, 4)
    ledger.record(b, UP, 2)
    ledger.record(b, DOWN, 3)
    delta = ledger.snapshot() - before
    assert delta == TrafficCounts(connections=0, round_trips=2, bytes_up=2, bytes_down=7, chunks_up=1, chunks_down=2)
    assert ledger.snapshot().connections == 2


async def _answering_server(reply_size: int):
    """A real upstream: for every request line, `reply_size` bytes back (then its length was
    asked for), closing when the client closes."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            size = int(line) if line.strip() else reply_size
            writer.write(b"x" * size)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize("reply_size", [1, 1000, 3 * CHUNK + 17])
async def test_proxy_counts_round_trips_and_bytes_over_a_real_connection(reply_size):
    server = await _answering_server(reply_size)
    port = server.sockets[0].getsockname()[1]
    async with server, DelayProxy("127.0.0.1", port, rtt=0.0) as proxy:
        host, proxy_port = await proxy.start()
        reader, writer = await asyncio.open_connection(host, proxy_port)
        exchanges = 5
        for _ in range(exchanges):
            writer.write(b"\n")
            await writer.drain()
            assert await reader.readexactly(reply_size) == b"x" * reply_size
        # a question sent in three writes, the answer asked for by size: one round trip more
        for part in (b"20", b"0", b"0\n"):
            writer.write(part)
            await writer.drain()
        assert len(await reader.readexactly(2000)) == 2000
        writer.close()
        await writer.wait_closed()
        counts = proxy.ledger.snapshot()
    assert counts.connections == 1
    assert counts.round_trips == exchanges + 1
    assert counts.bytes_up == exchanges + len(b"2000\n")
    assert counts.bytes_down == exchanges * reply_size + 2000


async def test_proxy_passes_the_far_side_closing_through():
    async def answer_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"bye")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_and_close, "127.0.0.1", 0)
    async with server, DelayProxy("127.0.0.1", server.sockets[0].getsockname()[1]) as proxy:
        reader, writer = await asyncio.open_connection(*await proxy.start())
        writer.write(b"hi\n")
        assert await reader.read() == b"bye"  # read() returns at EOF: the close came through
        writer.close()
    assert proxy.ledger.snapshot().round_trips == 1


async def test_proxy_closes_the_client_when_the_upstream_is_gone():
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with DelayProxy("127.0.0.1", port) as proxy:
        reader, writer = await asyncio.open_connection(*await proxy.start())
        assert await reader.read() == b""
        writer.close()


def test_split_formula_adds_the_link_to_a_weighted_mean_of_the_two_placements():
    # half the layers each side, 12 ms either side, 30 ms RTT, 200 KB at 100 Mbit/s (16 ms)
    seconds = split_token_seconds(0.5, 0.012, 0.012, 0.030, 200_000, 100e6 / 8)
    assert seconds == pytest.approx(0.012 + 0.030 + 0.016)
    assert split_token_seconds(0.25, 0.020, 0.010, 0.0) == pytest.approx(0.25 * 0.020 + 0.75 * 0.010)
    with pytest.raises(ValueError):
        split_token_seconds(1.5, 0.01, 0.01, 0.01)
    with pytest.raises(ValueError):
        split_token_seconds(0.5, 0.01, 0.01, -0.01)


def test_one_whole_placement_always_beats_the_split():
    grid = itertools.product([0.0, 0.1, 0.5, 0.9, 1.0], [0.005, 0.012, 0.05], [0.004, 0.012, 0.1],
                             [0.0, 0.01, 0.05], [0.0, 8_000, 200_000], [1e6, 12.5e6, math.inf])
    for f, t_edge, t_centre, rtt, nbytes, bandwidth in grid:
        p = placements(f, t_edge, t_centre, rtt, nbytes, bandwidth)
        assert p.best_whole <= p.split + 1e-12, (f, t_edge, t_centre, rtt, nbytes, bandwidth)
    # the split ties only with no link cost and everything on the faster side
    assert placements(1.0, 0.01, 0.02, 0.0).split == pytest.approx(placements(1.0, 0.01, 0.02, 0.0).best_whole)


def test_fit_line_recovers_a_line_and_refuses_too_few_points():
    xs = [0, 10, 30, 50]
    intercept, slope = fit_line(xs, [13.5 + 1.0 * x for x in xs])
    assert (intercept, slope) == (pytest.approx(13.5), pytest.approx(1.0))
    intercept, slope = fit_line([0, 10], [1, 3])
    assert (intercept, slope) == (pytest.approx(1), pytest.approx(0.2))
    for bad in (([1], [1]), ([1, 2], [1]), ([3, 3], [1, 2])):
        with pytest.raises(ValueError):
            fit_line(*bad)


def test_format_table_is_markdown_with_aligned_columns():
    table = format_table(["RTT", "tok/s"], [["0 ms", "82.1"], ["50 ms", "15.7"]])
    assert table.splitlines() == [
        "| RTT   | tok/s |",
        "|-------|------:|",
        "| 0 ms  |  82.1 |",
        "| 50 ms |  15.7 |",
    ]
    assert format_table(["a", "b"], [["x", "y"]], right=[True, False]).splitlines()[1] == "|--:|---|"
    with pytest.raises(ValueError):
        format_table(["a", "b"], [["only one"]])


def _rtt_result(rtt_ms: float, tokens_per_s: float) -> dict:
    stream = {"ttft_s": 0.05 + rtt_ms / 1000, "tokens_per_s": 80.0, "tokens": 32, "traffic": None}
    return {"rtt_ms": rtt_ms, "bench_tokens_per_s": tokens_per_s,
            "bench_per_token": {"round_trips": 1.0, "bytes_up": 7700.0, "bytes_down": 196600.0},
            "split_stream": stream, "split_prompt_round_trips": 1,
            "split_stream_per_token": {"round_trips": 1.0, "bytes_up": 7700.0, "bytes_down": 196600.0},
            "centre_stream": stream, "centre_round_trips_per_request": 1}


def test_render_prints_a_row_per_rtt_the_fit_and_the_formula():
    results = {"edge_tokens_per_s": 86.0,
               "rtts": [_rtt_result(rtt, 1000 / (13.5 + rtt)) for rtt in (0, 10, 30, 50)]}
    text = render(results, edge_share=0.5, rate_mbit=None)
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 4
    assert table[2].split("|")[1].strip() == "0 ms" and table[5].split("|")[1].strip() == "50 ms"
    cells = [cell.strip() for cell in table[5].split("|")[1:-1]]
    assert cells[:5] == ["50 ms", "15.7", "63.5", "1.00", "7.7 / 196.6"]
    assert "split, fitted: 13.5 ms + 1.00 x RTT per token" in text
    assert "all at the edge (llama-bench, no RPC): 86.0 tok/s" in text
    assert sum(line.startswith("formula at") for line in text.splitlines()) == 4


@pytest.mark.parametrize(("layers_at_centre", "edge_blocks"), [(0, 30), (1, 30), (15, 16), (30, 1), (31, 0), (99, 0)])
def test_edge_block_count_follows_llama_cpp_counting_the_head_as_a_layer(layers_at_centre, edge_blocks):
    assert edge_block_count(30, layers_at_centre) == edge_blocks
