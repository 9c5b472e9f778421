"""Logging for the daemons: text for people, JSON lines for log pipelines; always stderr."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from sebridge.text import printable_lines

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra={...}`` fields are carried as top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """One line per record for people (a traceback or a multi-line message goes on indented
    continuation lines). Text from outside (IMDS strings, hook output) is in messages: every
    control, escape or bidi character is shown escaped (:mod:`sebridge.text`), so a record can
    neither drive the terminal nor pass for another record."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return printable_lines(super().format(record))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


def setup_logging(fmt: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The AMQP stack logs every frame at INFO; keep it to warnings.
    for noisy in ("azure", "uamqp", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
