"""Text from outside made safe for a person's terminal (pure).

IMDS strings (Description, EventType, bodies quoted in errors), command reasons and hook output
reach ``sebridge status`` and the text log. A terminal obeys what it is sent: ESC sequences
clear the screen or move the cursor, a carriage return overwrites the line with something else
(a fake ``HEALTHY``), bidi overrides make text read backwards. :func:`printable` shows every
such character as an escape (``\\x1b``, ``\\r``, ``\\u202e``); :func:`printable_lines` does the
same but keeps line breaks, each continuation line indented, so no line of it can pass for a
line of its own (a forged log record).

The rule is Python's ``str.isprintable``: every character Unicode files under Other (controls
C0/C1 and DEL, formatting such as the bidi overrides and zero-width characters, surrogates,
private use, unassigned) or Separator (line and paragraph separators, and every space but the
ASCII one) is escaped. JSON output needs none of this: ``json.dumps`` escapes them already.
"""

from __future__ import annotations

CONTINUATION = "    "  # the indent of a continuation line in printable_lines
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on, or that reads as something else,
    shown escaped (a line break too): one line, safe to print."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def printable_lines(text: str, indent: str = CONTINUATION) -> str:
    """Like :func:`printable`, but a line break (``\\n``) stays one: each line after the first
    starts with ``indent`` (so it can never look like a record of its own)."""
    lines = text.split("\n")
    return ("\n" + indent).join(printable(line) for line in lines)
