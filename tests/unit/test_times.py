"""Issue 24 review, item 1: odd times never raise. One reading rule in the kernel
(sebridge.times, applied by sebridge.imds.parse_not_before and the CloudEvent time) keeps every
time the bridge acts on within 1970..9000, and the timing arithmetic saturates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sebridge.contract.cloudevents import CloudEventError, parse_time
from sebridge.imds import ScheduledEvent, parse_not_before
from sebridge.times import EARLIEST, LATEST, clamp, parse_iso, shifted, stored
from sebridge.timing import MAX_LEAD_SECONDS, Leads, drain_moment, probe_begins
from tests.support.budget import examples

DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
# The edges of datetime and of the range, and ordinary times.
EDGE = st.one_of(
    st.datetimes(datetime(1, 1, 1), datetime(1, 1, 3)),
    st.datetimes(datetime(1969, 12, 30), datetime(1970, 1, 2)),
    st.datetimes(datetime(2020, 1, 1), datetime(2040, 1, 1)),
    st.datetimes(datetime(8999, 12, 30), datetime(9000, 1, 2)),
    st.datetimes(datetime(9999, 12, 29), datetime.max),
)
OFFSET = st.sampled_from([UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=14))])


def rfc1123(moment: datetime) -> str:
    """As IMDS spells it, the year always with four digits (strftime drops the zeros)."""
    return (
        f"{DAYS[moment.weekday()]}, {moment.day:02d} {MONTHS[moment.month - 1]} "
        f"{moment.year:04d} {moment:%H:%M:%S} GMT"
    )


def iso(moment: datetime, offset: timezone) -> str:
    return moment.replace(tzinfo=offset).isoformat()


def event(not_before: str, event_type: str = "Reboot", duration: object = -1) -> ScheduledEvent:
    return ScheduledEvent.from_imds(
        {
            "EventId": "aaaaaaaa-0000-4000-8000-000000000001",
            "EventType": event_type,
            "EventStatus": "Scheduled",
            "NotBefore": not_before,
            "Resources": ["vm1"],
            "DurationInSeconds": duration,
        },
        strict=False,
    )


@pytest.mark.parametrize(
    "text",
    [
        "0001-01-01T00:00:00Z",
        "Mon, 01 Jan 0001 00:00:00 GMT",  # email.utils reads "0001" as 2001
        "Sat, 01 Jan 0099 00:00:00 GMT",  # ... and "0099" as 1999
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-14:00",  # not representable in UTC
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "1969-12-31T23:59:59Z",
    ],
)
def test_a_time_outside_the_range_is_unreadable_never_another_year(text: str) -> None:
    assert parse_not_before(text) is None
    odd = event(text)
    assert odd.not_before is None and odd.raw["NotBefore"] == text  # kept verbatim
    assert odd.warnings == (f'NotBefore: "{text}" is not a time: read as null',)


def test_real_spellings_still_read() -> None:
    assert parse_not_before("Mon, 19 Sep 2016 18:29:47 GMT") == datetime(
        2016, 9, 19, 18, 29, 47, tzinfo=UTC
    )
    assert parse_not_before("Mon, 19 Sep 16 18:29:47 GMT") == datetime(
        2016, 9, 19, 18, 29, 47, tzinfo=UTC
    )  # an obsolete two-digit year is still what RFC 2822 says
    assert parse_not_before("2026-11-22T10:00:00") == datetime(2026, 11, 22, 10, tzinfo=UTC)


@settings(max_examples=examples(300), deadline=None)
@given(moment=EDGE, offset=OFFSET, rfc=st.booleans())
def test_any_time_reads_as_itself_within_the_range_or_as_unreadable(
    moment: datetime, offset: timezone, rfc: bool
) -> None:
    text = rfc1123(moment.replace(microsecond=0)) if rfc else iso(moment, offset)
    parsed = parse_not_before(text)
    if parsed is None:
        return
    assert EARLIEST <= parsed <= LATEST
    expected = moment.replace(microsecond=0, tzinfo=UTC) if rfc else moment.replace(tzinfo=offset)
    assert parsed == expected  # never another year


@settings(max_examples=examples(300), deadline=None)
@given(
    moment=EDGE,
    offset=OFFSET,
    rfc=st.booleans(),
    lead=st.one_of(st.none(), st.sampled_from([0.0, 0.5, 300.0, float(MAX_LEAD_SECONDS)])),
    first_seen=EDGE,
    bound=st.sampled_from([1, 510, 599]),
    event_type=st.sampled_from(["Reboot", "Freeze", "Preempt", "Terminate", "Later"]),
    duration=st.sampled_from([-1, 0, 5, 10**6, 366 * 86_400 + 1, 10**30, "1e400", 2**63]),
)
def test_the_timing_never_raises_whatever_the_times(
    moment: datetime,
    offset: timezone,
    rfc: bool,
    lead: float | None,
    first_seen: datetime,
    bound: int,
    event_type: str,
    duration: object,
) -> None:
    text = rfc1123(moment.replace(microsecond=0)) if rfc else iso(moment, offset)
    odd = event(text, event_type, duration)
    assert odd.duration_in_seconds is None or abs(odd.duration_in_seconds) <= 366 * 86_400
    leads = Leads({event_type: lead})
    seen = first_seen.replace(tzinfo=UTC)
    when = drain_moment(odd, seen, leads)
    assert when >= seen
    begins = probe_begins(odd, when, timedelta(seconds=bound))
    assert begins >= when


@settings(max_examples=examples(300), deadline=None)
@given(
    moment=st.datetimes(datetime.min, datetime.max, timezones=st.just(UTC)),
    seconds=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**20), 10**20),
        st.timedeltas(),
    ),
)
def test_shifted_saturates_and_never_raises(moment: datetime, seconds: float | timedelta) -> None:
    assert EARLIEST <= shifted(moment, seconds) <= LATEST


def test_a_message_time_outside_the_range_is_refused_with_a_reason() -> None:
    for text in ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "9999-12-31T23:59:59-14:00"):
        with pytest.raises(CloudEventError, match="out of range"):
            parse_time(text)
    assert parse_time("2026-11-22T10:00:00Z") == datetime(2026, 11, 22, 10, tzinfo=UTC)


# ---- the one reader of stored times (sebridge.times.stored) --------------------------------


@given(st.one_of(st.text(max_size=80), st.integers(), st.none(), st.floats(), st.lists(st.text())))
@settings(max_examples=examples(300), deadline=None)
def test_a_stored_time_reads_as_an_aware_utc_time_in_range_or_as_none(value: object) -> None:
    moment = stored(value)
    assert moment is None or (moment.tzinfo is UTC and EARLIEST <= moment <= LATEST)


@given(EDGE, OFFSET)
@settings(max_examples=examples(300), deadline=None)
def test_what_the_bridge_writes_reads_back_as_the_same_time(moment: datetime, zone: object) -> None:
    assert isinstance(zone, timezone) or zone is UTC
    try:
        aware = moment.replace(tzinfo=zone)  # type: ignore[arg-type]
        in_utc = aware.astimezone(UTC)
    except OverflowError:
        assert stored(moment.replace(tzinfo=zone).isoformat()) is None  # type: ignore[arg-type]
        return
    read = stored(aware.isoformat())
    if EARLIEST <= in_utc <= LATEST:
        assert read == in_utc and read is not None and read.tzinfo is UTC
    else:
        assert read is None


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-26T10:00:00",  # no zone: never written by the bridge, its zone a guess
        datetime(2026, 11, 26, 10),  # the same as a datetime
        "1969-12-31T23:59:59Z",
        "9999-12-31T23:59:59-01:00",  # past datetime.max in UTC
        "2026-11-26T10:00:00Z" + " " * 60,  # longer than any time
        "",
        "yesterday",
    ],
)
def test_a_damaged_stored_time_is_none(value: object) -> None:
    assert stored(value) is None


def test_z_in_either_case_and_offsets_read_as_utc() -> None:
    expected = datetime(2026, 11, 26, 10, tzinfo=UTC)
    assert stored("2026-11-26T10:00:00Z") == expected
    assert stored("2026-11-26T10:00:00z") == expected
    assert stored("2026-11-26T11:00:00+01:00") == expected
    assert parse_iso(datetime(2026, 11, 26, 10, tzinfo=UTC)) == expected
    # A store with a range of its own clamps what parse_iso gives (the history's table range).
    table_latest = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    far = parse_iso("9999-12-31T23:59:59-01:00")
    assert far is not None and clamp(far, EARLIEST, table_latest) == table_latest
