"""sebridge.text and the text log formatter (issue 22, item 11): nothing a terminal acts on
passes through, everything else is left as it is."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sebridge.logs import JsonFormatter, TextFormatter
from sebridge.text import printable, printable_lines


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("Host server is undergoing maintenance.", "Host server is undergoing maintenance."),
        ("\x1b[2J\x1b[H HEALTHY", "\\x1b[2J\\x1b[H HEALTHY"),  # clear screen, cursor home
        ("bad\rHEALTHY", "bad\\rHEALTHY"),  # overwrite the line
        ("a\nb\tc", "a\\nb\\tc"),
        ("\x00\x07\x7f", "\\x00\\x07\\x7f"),  # NUL, BEL, DEL
        ("\x9b31m", "\\x9b31m"),  # C1 CSI: an ESC [ in one character
        ("\u202eevil\u202c \u2066x\u2069 \u200f", "\\u202eevil\\u202c \\u2066x\\u2069 \\u200f"),
        ("line\u2028sep", "line\\u2028sep"),
        ("\ud800 lone surrogate", "\\ud800 lone surrogate"),  # stderr could not even encode it
        ("\U000e0041 tag", "\\U000e0041 tag"),
        ("Grüße, 東京, emoji \U0001f600", "Grüße, 東京, emoji \U0001f600"),
        ("a\\x1b stays", "a\\x1b stays"),  # text that merely looks escaped is left alone
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown


@given(st.text())
def test_printable_output_is_always_printable_and_unchanged_when_it_was(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable()
    if text.isprintable():
        assert shown == text


def test_printable_lines_keeps_line_breaks_as_indented_continuations() -> None:
    shown = printable_lines("first\nsecond\r\n2026-01-01T00:00:00 INFO forged")
    assert shown.splitlines() == [
        "first",
        "    second\\r",
        "    2026-01-01T00:00:00 INFO forged",
    ]


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom \x1b[31m\nTraceback forged")
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("forwarder", logging.WARNING, __file__, 1, message, args, exc_info)


def test_text_log_lines_carry_no_raw_control_and_no_forged_record() -> None:
    hostile = "\x1b[2J\x1b[H HEALTHY\r\u202eok\n2026-01-01T00:00:00.000+00:00 INFO    x: forged"
    text = TextFormatter().format(record("event %s (%s)", "id", hostile, exc=True))
    lines = text.split("\n")
    assert all(line.isprintable() for line in lines), lines
    assert "\\x1b[2J\\x1b[H HEALTHY\\r\\u202eok" in lines[0]
    # Every line after the first (the message's own break, the traceback) is indented.
    assert all(line.startswith("    ") for line in lines[1:]), lines
    assert any("ValueError: boom \\x1b[31m" in line for line in lines)


def test_json_log_lines_stay_one_json_object_with_the_text_intact() -> None:
    hostile = "\x1b[2J\r\u202e\nx"
    line = JsonFormatter().format(record("%s", hostile))
    assert "\n" not in line and line.isprintable()
    assert json.loads(line)["message"] == hostile
