"""Retry-After parsing and the log redaction the HTTP adapters rely on (no network)."""

from __future__ import annotations

import logging

import pytest
import requests

from functions.adapters.retry import RedactQueryStrings, retry_after

NOW = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT


def response(value: str | None) -> requests.Response:
    r = requests.Response()
    if value is not None:
        r.headers["Retry-After"] = value
    return r


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("", None),
        ("7", 7.0),
        ("Tue, 14 Nov 2023 22:13:50 GMT", 30.0),
        ("Tue, 14 Nov 2023 22:00:00 GMT", 0.0),  # a date in the past: retry now
        ("soon", None),
    ],
)
def test_retry_after(header: str | None, seconds: float | None) -> None:
    assert retry_after(response(header), now=lambda: NOW) == seconds


def test_query_strings_are_cut_from_log_arguments() -> None:
    record = logging.LogRecord(
        "urllib3.connectionpool",
        logging.DEBUG,
        __file__,
        1,
        '%s "%s %s" %s',
        ("https://x", "POST", "/workflows/a?sig=secret", 202),
        None,
    )
    assert RedactQueryStrings().filter(record)
    assert "secret" not in record.getMessage() and "/workflows/a?<redacted>" in record.getMessage()
