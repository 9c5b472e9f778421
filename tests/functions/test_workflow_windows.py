"""Maintenance windows (functions/approval_gate/windows.py): property tests over instants and
zones, and the daylight-saving cases by name."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.approval_gate.policy import PolicyError, parse_policy
from functions.approval_gate.windows import (
    WindowError,
    current_or_next,
    inside,
    parse_window,
    to_utc,
)
from tests.support.budget import examples

# Zones with daylight saving both ways, half-hour offsets and a 30-minute DST (Lord Howe).
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/Santiago",
    "Pacific/Auckland",
]
DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]

instants = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC)
)
clock = st.tuples(st.integers(0, 23), st.sampled_from([0, 15, 30, 45]))


@st.composite
def specs(draw: st.DrawFn) -> str:
    (h1, m1), (h2, m2) = draw(clock), draw(clock)
    if (h1, m1) == (h2, m2):
        h2 = (h2 + 1) % 24
    return f"{draw(st.sampled_from(DAYS))} {h1:02d}:{m1:02d}-{h2:02d}:{m2:02d} " + draw(
        st.sampled_from(ZONES)
    )


@settings(max_examples=examples(300), deadline=None)
@given(spec=specs(), at=instants)
def test_the_opening_is_current_or_the_next_and_none_is_skipped(spec: str, at: datetime) -> None:
    window = parse_window(spec)
    opening = current_or_next([window], at)
    assert opening is not None
    assert opening.start < opening.end and opening.end > at
    assert opening.contains(at) or opening.start > at
    # Within a fortnight (a weekly window skipped once by a DST gap at most).
    assert opening.start - at <= timedelta(days=15)
    # It opens on the window's weekday, at its start time where that time exists.
    zone = window.zone
    local = opening.start.astimezone(zone)
    assert local.weekday() == window.weekday
    wall = datetime.combine(local.date(), window.start)
    if to_utc(wall, zone).astimezone(zone).replace(tzinfo=None) == wall:
        assert local.time() == window.start
    else:  # its start was skipped: it opens at the change, later that day
        assert local.time() > window.start
    # Its length is the nominal one, give or take a daylight-saving shift.
    nominal = (
        datetime.combine(datetime(2000, 1, 2), window.end)
        - datetime.combine(datetime(2000, 1, 1 if window.overnight else 2), window.start)
    ) % timedelta(days=1) or timedelta(days=1)
    assert abs((opening.end - opening.start) - nominal) <= timedelta(hours=1)
    # No other opening of the window lies between ``at`` and this one.
    for other in window.openings_around(at):
        if other.end > at:
            assert (other.start, other.end) >= (opening.start, opening.end)
    # Stable: inside the opening, the same opening is current.
    assert current_or_next([window], opening.start) == opening
    assert inside([window], opening.start)
    assert inside([window], opening.end - timedelta(seconds=1))
    assert not inside([window], opening.end)


@settings(max_examples=examples(300), deadline=None)
@given(zone=st.sampled_from(ZONES), at=instants)
def test_a_wall_time_maps_to_its_first_occurrence_or_the_first_valid_instant(
    zone: str, at: datetime
) -> None:
    tz = ZoneInfo(zone)
    wall = at.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
    instant = to_utc(wall, tz)
    back = instant.astimezone(tz).replace(tzinfo=None)
    if back == wall:  # it exists: no earlier instant shows the same wall time
        earlier = instant - timedelta(hours=3)
        while earlier < instant:
            assert earlier.astimezone(tz).replace(tzinfo=None) != wall
            earlier += timedelta(minutes=15)
    else:  # skipped: the instant is the change, the wall clock jumps over ``wall`` there
        assert back > wall
        assert (instant - timedelta(seconds=1)).astimezone(tz).replace(tzinfo=None) < wall


BERLIN = ZoneInfo("Europe/Berlin")


def test_berlin_sunday_window_follows_daylight_saving() -> None:
    window = parse_window("Sun 02:00-05:00 Europe/Berlin")
    winter = current_or_next([window], datetime(2026, 11, 26, tzinfo=UTC))
    summer = current_or_next([window], datetime(2026, 7, 1, tzinfo=UTC))
    assert winter is not None and summer is not None
    assert (winter.start, winter.end) == (
        datetime(2026, 11, 29, 1, tzinfo=UTC),
        datetime(2026, 11, 29, 4, tzinfo=UTC),
    )
    assert (summer.start.hour, summer.end.hour) == (0, 3)


def test_a_window_starting_in_the_skipped_hour_starts_at_the_change() -> None:
    # 29 March 2026: Berlin's clocks go from 02:00 CET to 03:00 CEST (01:00 UTC).
    window = parse_window("Sun 02:30-04:00 Europe/Berlin")
    opening = current_or_next([window], datetime(2026, 3, 27, tzinfo=UTC))
    assert opening is not None
    assert opening.start == datetime(2026, 3, 29, 1, tzinfo=UTC)  # 03:00 CEST
    assert opening.end == datetime(2026, 3, 29, 2, tzinfo=UTC)  # 04:00 CEST
    # Wholly in the skipped hour: no window that Sunday, the next one the Sunday after.
    empty = parse_window("Sun 02:10-02:50 Europe/Berlin")
    following = current_or_next([empty], datetime(2026, 3, 27, tzinfo=UTC))
    assert following is not None and following.start.date().isoformat() == "2026-04-05"


def test_a_window_starting_in_the_repeated_hour_starts_at_its_first_occurrence() -> None:
    # 25 October 2026: 03:00 CEST becomes 02:00 CET again (01:00 UTC); 02:30 happens twice.
    window = parse_window("Sun 02:30-03:30 Europe/Berlin")
    opening = current_or_next([window], datetime(2026, 10, 23, tzinfo=UTC))
    assert opening is not None
    assert opening.start == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST
    assert opening.end == datetime(2026, 10, 25, 2, 30, tzinfo=UTC)  # 03:30 CET: two hours


def test_a_window_across_midnight_is_current_after_midnight() -> None:
    window = parse_window("Sat 23:00-02:00 UTC")
    at = datetime(2026, 11, 29, 1, 30, tzinfo=UTC)  # Sunday 01:30
    opening = current_or_next([window], at)
    assert opening is not None and opening.contains(at)
    assert opening.start == datetime(2026, 11, 28, 23, tzinfo=UTC)
    assert not inside([window], datetime(2026, 11, 29, 2, tzinfo=UTC))
    assert inside([parse_window("Fri 22:00-24:00 UTC")], datetime(2026, 11, 27, 23, 59, tzinfo=UTC))


def test_of_several_windows_the_soonest_counts() -> None:
    spec = [parse_window("Sun 02:00-05:00 Europe/Berlin"), parse_window("Wed 12:00-13:00 UTC")]
    opening = current_or_next(spec, datetime(2026, 11, 23, tzinfo=UTC))  # a Monday
    assert opening is not None and opening.start == datetime(2026, 11, 25, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("Sun 02:00-05:00 Mars/Olympus", "not an IANA time zone"),
        ("Someday 02:00-05:00 UTC", "not a day of the week"),
        ("Sun 25:00-05:00 UTC", "not a time of day"),
        ("Sun 02:00-02:00 UTC", "starts and ends"),
        ("Sun 2am-5am UTC", "not 'DAY HH:MM-HH:MM ZONE'"),
        ("Sun 02:00-05:00 ../../etc/passwd", "not 'DAY HH:MM-HH:MM ZONE'"),
    ],
)
def test_a_bad_window_is_refused_naming_why(spec: str, problem: str) -> None:
    with pytest.raises(WindowError, match=problem):
        parse_window(spec)


def test_the_policy_reads_windows_per_rule() -> None:
    policy = parse_policy(
        {
            "rules": [
                {
                    "name": "web",
                    "match": {"vmName": ["web-*"]},
                    "action": "approve-when-prepared",
                    "windows": ["Sun 02:00-05:00 Europe/Berlin", "Wednesday 12:00-13:00 UTC"],
                }
            ]
        }
    )
    (rule,) = policy.rules
    assert [w.weekday for w in rule.windows] == [6, 2]
    assert rule.windows[0].start == time(2) and rule.windows[0].zone == BERLIN
    with pytest.raises(PolicyError, match=r"rules\[0\] \(web\): windows\[0\]: .*IANA"):
        parse_policy(
            {"rules": [{"name": "web", "action": "approve", "windows": ["Sun 02:00-05:00 X/Y"]}]}
        )
    with pytest.raises(PolicyError, match="windows apply only to approve"):
        parse_policy({"rules": [{"action": "manual", "windows": ["Sun 02:00-05:00 UTC"]}]})


def test_windows_resolve_their_zones_without_the_hosts_zone_database() -> None:
    """The Function App's image may carry no zone database (Windows plans, slim images): with
    zoneinfo's search path emptied, "Europe/Berlin" still resolves through the tzdata package
    that requirements.txt ships, and keeps its daylight-saving rules."""
    script = (
        "import zoneinfo, datetime\n"
        "assert zoneinfo.TZPATH == (), zoneinfo.TZPATH\n"
        "from functions.approval_gate.windows import parse_window\n"
        "w = parse_window('Sun 02:00-05:00 Europe/Berlin')\n"
        "summer = datetime.datetime(2026, 7, 1, tzinfo=w.zone).utcoffset()\n"
        "winter = datetime.datetime(2026, 1, 1, tzinfo=w.zone).utcoffset()\n"
        "print(summer, winter)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONTZPATH": ""},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2:00:00", "1:00:00"]
