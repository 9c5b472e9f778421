"""One line per event on stderr, as text or JSON lines (--log-format).

Host events (start, function list, invocation outcomes, receiver faults) carry structured
fields; user functions' own `logging` calls go through the same handler, as the worker
forwards them to the host log. Connection strings are never passed in here.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any, TextIO

LOGGER_NAME = "functions_host"
_FIELDS = "sebridge_fields"


def host_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)


def event(logger: logging.Logger, level: int, name: str, message: str, **fields: Any) -> None:
    """Log one structured event: `name` says what happened, fields carry the facts."""
    logger.log(level, message, extra={_FIELDS: {"event": name, **fields}})


def _timestamp(record: logging.LogRecord) -> str:
    moment = dt.datetime.fromtimestamp(record.created, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _text_value(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' ="')) else text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, _FIELDS, {})
        parts = [_timestamp(record), record.levelname, record.name, record.getMessage()]
        parts += [f"{k}={_text_value(v)}" for k, v in fields.items() if v is not None]
        line = " ".join(parts)
        if record.exc_info and not fields.get("error"):
            line += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in getattr(record, _FIELDS, {}).items():
            if value is not None:
                document[key] = value
        if record.exc_info and "error" not in document:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def configure(log_format: str = "text", *, stream: TextIO | None = None) -> logging.Handler:
    """Route all logging to one stderr handler in the chosen format; returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # The SDK logs every link attach and retry at INFO; only its warnings are news here.
    for noisy in ("azure", "uamqp", "azure.servicebus._pyamqp", "azure.identity"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return handler
