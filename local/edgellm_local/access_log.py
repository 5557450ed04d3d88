"""The local edge's access line: the core's structured request record, formatted for a person
watching traffic (`GET /v1/chat/completions 200 HIT create_chat_completion 1.2ms tenant=acme`),
or as the JSON itself with `edgellm dev --log-json`.

The line is formatted and written by a thread of its own (a `QueueListener`): the request only
queues the record, never waits for the terminal or the file its output goes to. The listener is
stopped, so what is queued gets written, when the process exits."""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys


class AccessLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = getattr(record, "edgellm", None)
        if not isinstance(data, dict):
            return super().format(record)
        line = f"{data['method']} {data['path']} {data['status']} {data['cache']} {data['route']} {data['ms']}ms"
        return line + (f" tenant={data['tenant']}" if data.get("tenant") else "") + f" id={data['request_id']}"


class _Enqueue(logging.handlers.QueueHandler):
    """Queues the record as it is: formatting it (the stdlib's `prepare`: a copy and a format)
    is the listener thread's work. An access record holds no arguments or traceback to freeze."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def install(logger_name: str = "edgellm.access", *, as_json: bool = False) -> logging.handlers.QueueListener:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s") if as_json else AccessLineFormatter())
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    listener.start()
    atexit.register(listener.stop)  # writes what is queued, then ends the thread
    logger = logging.getLogger(logger_name)
    logger.addHandler(_Enqueue(records))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return listener
