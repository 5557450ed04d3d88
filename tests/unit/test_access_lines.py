"""The local edge's access lines are written off the request's path, in batches: every record is
written once and in order by a clean stop, and logging a record never waits for the output."""

from __future__ import annotations

import io
import logging
import threading

from edgellm_local.emulator.access_log import BatchedLines


def _record(i: int) -> logging.LogRecord:
    return logging.LogRecord("edgellm.access", logging.INFO, __file__, 0, "line %d", (i,), None)


def test_every_record_is_written_once_in_order_by_a_clean_stop() -> None:
    stream = io.StringIO()
    handler = BatchedLines(stream, logging.Formatter("%(message)s"), interval=10.0)  # no batch is due before the stop
    for i in range(500):
        handler.handle(_record(i))
    handler.stop()
    assert stream.getvalue().splitlines() == [f"line {i}" for i in range(500)]


class GatherWatched(threading.Condition):
    """The handler's condition, telling when the writer has woken and waits for its batch to gather."""

    def __init__(self) -> None:
        super().__init__()
        self.gathering = threading.Event()

    def wait_for(self, predicate, timeout=None):  # type: ignore[no-untyped-def]
        if timeout is not None:
            self.gathering.set()
        return super().wait_for(predicate, timeout)


def test_a_stop_while_the_writer_gathers_a_batch_still_writes_it() -> None:
    """The race the first CI run met: the writer woke for the first record and waited out its
    interval while stop() gave up joining it, so the batch was never written."""
    stream = io.StringIO()
    watched = GatherWatched()
    # a handler whose writer runs on the watched condition (the constructor starts it on its own)
    handler = BatchedLines.__new__(BatchedLines)
    logging.Handler.__init__(handler)
    handler.stream, handler.interval, handler._pending, handler._stopped = stream, 60.0, [], False
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler._cond = watched
    handler._thread = threading.Thread(target=handler._run, daemon=True)
    handler._thread.start()
    handler.handle(_record(0))
    assert watched.gathering.wait(10), "the writer never waited for its batch to gather"
    handler.stop()
    assert stream.getvalue().splitlines() == ["line 0"]


class BlockedStream(io.StringIO):
    """An output that cannot be written until `release` is set (a terminal nobody reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        self.writing.set()
        assert self.release.wait(30)
        return super().write(text)


def test_logging_a_record_never_waits_for_the_output() -> None:
    stream = BlockedStream()
    handler = BatchedLines(stream, logging.Formatter("%(message)s"), interval=0.0)
    handler.handle(_record(0))
    assert stream.writing.wait(30)  # the writer thread is now stuck in the output's write
    done = threading.Event()

    def log_more() -> None:
        for i in range(1, 100):
            handler.handle(_record(i))
        done.set()

    threading.Thread(target=log_more, daemon=True).start()
    assert done.wait(30), "a request's log call waited for the blocked output"
    stream.release.set()
    handler.stop()
    assert stream.getvalue().splitlines() == [f"line {i}" for i in range(100)]
