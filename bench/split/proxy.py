"""A userspace TCP delay proxy: the link between the edge and the centre.

The kernel on the benchmark machine has no `netem`, so the round-trip time comes from here:
every chunk read from one side is held for half the RTT before it is written to the other, in
each direction. Chunks are queued with their release time, so the link is pipelined like a real
one (a burst pays the delay once, not once per chunk) and the byte stream is never reordered.

The proxy also keeps the books (`TrafficLedger`): bytes and chunks each way, and round trips.
A round trip is counted when the far side answers after the near side spoke: the first
downstream chunk after one or more upstream chunks on the same connection. That is the number of
times the client had to wait a whole RTT, which is what the split placement pays per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from dataclasses import dataclass, field, fields


class Direction(enum.Enum):
    UP = "up"  # client (the edge) to upstream (the centre)
    DOWN = "down"  # upstream to client


@dataclass(frozen=True)
class TrafficCounts:
    """What crossed the link; subtract two snapshots to get one run's share."""

    connections: int = 0
    round_trips: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    chunks_up: int = 0
    chunks_down: int = 0

    def __sub__(self, other: TrafficCounts) -> TrafficCounts:
        return TrafficCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


@dataclass
class TrafficLedger:
    """Counts for every connection through one proxy. Pure bookkeeping: no I/O, no clock."""

    _counts: dict[str, int] = field(default_factory=lambda: {f.name: 0 for f in fields(TrafficCounts)})
    _last: dict[int, Direction] = field(default_factory=dict)
    _next_id: int = 0

    def open(self) -> int:
        """A new connection; returns its id for `record`."""
        self._next_id += 1
        self._counts["connections"] += 1
        return self._next_id

    def record(self, connection: int, direction: Direction, nbytes: int) -> None:
        """One chunk of `nbytes` read from the side that `direction` leaves."""
        if nbytes <= 0:
            return
        if direction is Direction.DOWN and self._last.get(connection) is Direction.UP:
            self._counts["round_trips"] += 1
        self._last[connection] = direction
        self._counts[f"bytes_{direction.value}"] += nbytes
        self._counts[f"chunks_{direction.value}"] += 1

    def close(self, connection: int) -> None:
        self._last.pop(connection, None)

    def snapshot(self) -> TrafficCounts:
        return TrafficCounts(**self._counts)


CHUNK = 64 * 1024
QUEUED_CHUNKS = 256  # backpressure: at most this many chunks in flight per direction


@dataclass
class DelayProxy:
    """Listens on `listen_host`; forwards each connection to `upstream`, adding `rtt / 2` each way.

    `rtt` may be changed between runs; it applies to chunks read after the change.
    """

    upstream_host: str
    upstream_port: int
    rtt: float = 0.0
    ledger: TrafficLedger = field(default_factory=TrafficLedger)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, listen_host: str = "127.0.0.1", listen_port: int = 0) -> tuple[str, int]:
        """Start listening (port 0: the OS picks one); returns the bound address."""
        self._server = await asyncio.start_server(self._accept, listen_host, listen_port)
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> DelayProxy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        connection = self.ledger.open()
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            if self.rtt > 0:
                await asyncio.sleep(self.rtt)  # a new connection's handshake: one RTT before any data
            upstream_reader, upstream_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            await self._relay(connection, client_reader, client_writer, upstream_reader, upstream_writer)
        except (ConnectionError, OSError):
            pass  # the upstream refused: close the client, as a real link would
        except asyncio.CancelledError:
            pass  # close() cancelled us; ending quietly keeps asyncio from logging the cancellation
        finally:
            self.ledger.close(connection)
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(Exception):
                        await writer.wait_closed()
            self._tasks.discard(task)

    async def _relay(self, connection: int, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                     upstream_reader: asyncio.StreamReader, upstream_writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.TaskGroup() as pumps:  # one failing cancels the other
                pumps.create_task(self._pump(connection, Direction.UP, client_reader, upstream_writer))
                pumps.create_task(self._pump(connection, Direction.DOWN, upstream_reader, client_writer))
        except* (ConnectionError, OSError):
            pass  # one side went away: close both, as a real link would

    async def _pump(self, connection: int, direction: Direction,
                    reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks, stamp each with its release time, write it when that time comes."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUED_CHUNKS)

        async def read() -> None:
            while True:
                data = await reader.read(CHUNK)
                self.ledger.record(connection, direction, len(data))
                await queue.put((loop.time() + self.rtt / 2, data))
                if not data:
                    return

        async def write() -> None:
            while True:
                release, data = await queue.get()
                delay = release - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        reading = asyncio.ensure_future(read())
        try:
            await write()
            await reading
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await reading
