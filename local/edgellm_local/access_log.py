"""The local edge's access line: the core's structured request record, formatted for a person
watching traffic (`GET /v1/chat/completions 200 HIT create_chat_completion 1.2ms tenant=acme`),
or as the JSON itself with `edgellm dev --log-json`."""

from __future__ import annotations

import logging
import sys


class AccessLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = getattr(record, "edgellm", None)
        if not isinstance(data, dict):
            return super().format(record)
        line = f"{data['method']} {data['path']} {data['status']} {data['cache']} {data['route']} {data['ms']}ms"
        return line + (f" tenant={data['tenant']}" if data.get("tenant") else "") + f" id={data['request_id']}"


def install(logger_name: str = "edgellm.access", *, as_json: bool = False) -> logging.Handler:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s") if as_json else AccessLineFormatter())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler
