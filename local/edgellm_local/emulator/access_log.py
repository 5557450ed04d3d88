"""The local edge's access line: the core's structured request record, formatted for a person
watching traffic (`GET /v1/chat/completions 200 HIT create_chat_completion 1.2ms tenant=acme`),
or as the JSON itself with `edgellm dev --log-format json`.

The lines are formatted and written by a thread of its own, in batches: the request only appends
its record to a list, and the thread, woken once per batch (not once per line: handing the
interpreter to another thread on every request cost a HIT more than the rest of its bookkeeping),
writes what gathered in `interval` with one write. What is pending is written when the process
exits."""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from typing import TextIO


class AccessLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = getattr(record, "edgellm", None)
        if not isinstance(data, dict):
            return super().format(record)
        line = f"{data['method']} {data['path']} {data['status']} {data['cache']} {data['handler']} {data['ms']}ms"
        if data.get("ttft_ms") is not None:
            line += f" ttft={data['ttft_ms']}ms"
        if data.get("model"):
            line += f" model={data['model']}"
        if data.get("prompt_tokens") is not None:
            line += f" tokens={data['prompt_tokens']}+{data['completion_tokens']}"
        line += (f" tenant={data['tenant']}" if data.get("tenant") else "") + f" id={data['request_id']}"
        return line + (f" prompt={data['prompt']!r}" if data.get("prompt") else "")


class BatchedLines(logging.Handler):
    """Formats and writes records on its own thread, one write per batch of `interval` seconds."""

    def __init__(self, stream: TextIO, formatter: logging.Formatter, interval: float = 0.05) -> None:
        super().__init__()
        self.stream, self.interval = stream, interval
        self.setFormatter(formatter)
        self._pending: list[logging.LogRecord] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="access-log", daemon=True)
        self._thread.start()

    def handle(self, record: logging.LogRecord) -> bool:  # no handler lock: the list has its own
        return self.emit(record) or True

    def emit(self, record: logging.LogRecord) -> None:
        """The request's whole cost: an append, and a wake of the writer once per batch."""
        with self._cond:
            self._pending.append(record)
            if len(self._pending) == 1:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopped)
                # let the batch gather, but a stop ends the wait: a sleep here outlasted stop()'s
                # join when the writer had woken just before it, and the batch was never written
                self._cond.wait_for(lambda: self._stopped, timeout=self.interval)
                stopping = self._stopped
                batch, self._pending = self._pending, []
            if batch:
                self._write(batch)
            if stopping:
                return

    def _write(self, batch: list[logging.LogRecord]) -> None:
        lines = []
        for record in batch:
            try:
                lines.append(self.format(record) + "\n")
            except Exception:
                self.handleError(record)
        try:
            self.stream.write("".join(lines))
            self.stream.flush()
        except Exception:
            self.handleError(batch[-1])

    def stop(self) -> None:
        """Writes what is pending, then ends the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(5)


def install(logger_name: str = "edgellm.access", *, as_json: bool = False) -> BatchedLines:
    handler = BatchedLines(sys.stdout, logging.Formatter("%(message)s") if as_json else AccessLineFormatter())
    atexit.register(handler.stop)  # writes what is queued, then ends the thread
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler
