"""sebridge.retry.parse_retry_after, shared by the forwarder and the Functions: whatever the
header text, a delay in seconds (never negative) or None, never an exception (hostile review
item 8: ``Retry-After: ²`` raised ValueError, str.isdigit being true for superscripts)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sebridge.retry import parse_retry_after

NOW = 1_800_000_000.0


@pytest.mark.parametrize("header", ["²", "³¹", "٣", "\uff11\uff12", "1²", "¹⁰"])
def test_digits_that_are_not_ascii_are_unreadable_not_an_error(header: str) -> None:
    assert parse_retry_after(header, NOW) is None


@pytest.mark.parametrize(("header", "seconds"), [("0", 0.0), ("7", 7.0), (" 120 ", 120.0)])
def test_delta_seconds(header: str, seconds: float) -> None:
    assert parse_retry_after(header, NOW) == seconds


def test_an_http_date() -> None:
    assert parse_retry_after("Fri, 15 Jan 2027 08:00:00 GMT", 1_800_000_000.0) is not None
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", NOW) == 0.0


@given(st.one_of(st.none(), st.text(max_size=80)))
def test_any_header_text_gives_a_delay_or_none(header: str | None) -> None:
    delay = parse_retry_after(header, NOW)
    assert delay is None or delay >= 0.0
