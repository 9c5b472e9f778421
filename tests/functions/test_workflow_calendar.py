"""The maintenance calendar (RFC 5545), read back by two real iCalendar parsers: Python's
``icalendar`` and ``ical.js``, the parser of Mozilla's calendar clients (run with node from
emulators/azurite, where the Makefile's npm ci installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import icalendar
import pytest

from functions.history import calendar
from functions.history.core import EventSummary, entry_for, summarize
from tests.functions.history_support import T0, Lifecycle, scope_key, verified

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "emulators" / "azurite" / "check-ics.mjs"
NOW = T0 + timedelta(minutes=10)
WINDOW = timedelta(days=30)


def _summary(life: Lifecycle) -> EventSummary:
    # recorded in the order they came, a second apart (two Updateds: the later one counts)
    entries = [
        e
        for i, m in enumerate(life.messages)
        if (e := entry_for(verified(m), NOW + timedelta(seconds=i)))
    ]
    summary = summarize(entries)
    assert summary is not None
    return summary


def _parse(text: str) -> icalendar.Calendar:
    parsed = icalendar.Calendar.from_ical(text)
    assert isinstance(parsed, icalendar.Calendar)
    assert parsed.errors == []
    for component in parsed.walk():
        assert component.errors == [], component.errors
    return parsed


def _ical_js(text: str, tmp_path: Path) -> dict[str, object]:
    if shutil.which("node") is None or not (CHECKER.parent / "node_modules" / "ical.js").exists():
        pytest.fail("node and ical.js are needed: run `make install` (npm ci in emulators/azurite)")
    path = tmp_path / "feed.ics"
    path.write_bytes(text.encode("utf-8"))
    done = subprocess.run(
        ["node", str(CHECKER), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_an_upcoming_event_is_one_vevent_at_its_notbefore(tmp_path: Path) -> None:
    life = Lifecycle()
    life.transition("Scheduled", DurationInSeconds=600)
    text = calendar.feed([_summary(life)], NOW, WINDOW)
    assert text.endswith("\r\n") and "\n" not in text.replace("\r\n", "")
    (event,) = _parse(text).walk("VEVENT")
    assert str(event["UID"]) == f"{scope_key()}-1@sebridge"
    assert event.decoded("DTSTART").isoformat() == "2026-11-22T01:35:00+00:00"
    assert event.decoded("DTEND") - event.decoded("DTSTART") == timedelta(seconds=600)
    assert event["SEQUENCE"] == 0 and str(event["STATUS"]) == "CONFIRMED"
    assert "DTSTAMP" in event
    assert str(event["SUMMARY"]) == "Reboot: web-1, web-2"
    (seen,) = _ical_js(text, tmp_path)["events"]  # type: ignore[misc]
    assert seen["uid"] == str(event["UID"]) and seen["summary"] == "Reboot: web-1, web-2"
    assert seen["start"] == "2026-11-22T01:35:00.000Z" and seen["end"] == "2026-11-22T01:45:00.000Z"


def test_an_unknown_duration_gets_the_documented_default() -> None:
    life = Lifecycle()
    life.transition("Scheduled")  # DurationInSeconds -1
    (event,) = _parse(calendar.feed([_summary(life)], NOW, WINDOW)).walk("VEVENT")
    assert event.decoded("DTEND") - event.decoded("DTSTART") == calendar.DEFAULT_DURATION


def test_every_updated_raises_the_sequence_and_a_cancel_cancels(tmp_path: Path) -> None:
    life = Lifecycle()
    life.transition("Scheduled")
    sequences = []
    for hour in (2, 3, 2):  # A -> B -> A: three Updated, three revisions
        life.transition("Updated", NotBefore=f"Sun, 22 Nov 2026 0{hour}:00:00 GMT")
        (event,) = _parse(calendar.feed([_summary(life)], NOW, WINDOW)).walk("VEVENT")
        sequences.append(int(event["SEQUENCE"]))
        assert event.decoded("DTSTART").hour == hour
    assert sequences == [1, 2, 3]
    life.transition("Cancelled")
    text = calendar.feed([_summary(life)], NOW, WINDOW)
    (event,) = _parse(text).walk("VEVENT")
    assert str(event["STATUS"]) == "CANCELLED" and int(event["SEQUENCE"]) == 4
    (seen,) = _ical_js(text, tmp_path)["events"]  # type: ignore[misc]
    assert seen["status"] == "CANCELLED" and seen["sequence"] == 4


def test_an_event_that_comes_back_is_a_second_entry() -> None:
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Cancelled")
    life.transition("Scheduled", NotBefore="Sun, 22 Nov 2026 05:00:00 GMT")
    events = _parse(calendar.feed([_summary(life)], NOW, WINDOW)).walk("VEVENT")
    assert [str(e["UID"]).rsplit("-", 1)[1] for e in events] == ["1@sebridge", "2@sebridge"]
    assert [str(e["STATUS"]) for e in events] == ["CANCELLED", "CONFIRMED"]


def test_hostile_text_is_escaped_and_long_lines_folded(tmp_path: Path) -> None:
    description = "a;b,c\\d\nnew line \u00e9\u00e9\u00e9 " + "\U0001f6a7" * 60 + "\x07bell"
    life = Lifecycle()
    life.transition("Scheduled", Description=description, Resources=["web-1"] * 1)
    text = calendar.feed([_summary(life)], NOW, WINDOW)
    for line in text.split("\r\n"):
        assert len(line.encode("utf-8")) <= 75
        line.encode("utf-8").decode("utf-8")  # never split inside a character
    (event,) = _parse(text).walk("VEVENT")
    described = str(event["DESCRIPTION"])
    assert "Description: a;b,c\\d\nnew line \u00e9\u00e9\u00e9 " + "\U0001f6a7" * 60 in described
    assert "\x07" not in described and "BEGIN:VALARM" not in text
    (seen,) = _ical_js(text, tmp_path)["events"]  # type: ignore[misc]
    assert seen["description"] == described


def test_a_completed_event_says_measured_or_not() -> None:
    life = Lifecycle()
    life.transition("Scheduled", DurationInSeconds=300)
    life.transition("Started")
    life.transition("Completed")
    (event,) = _parse(calendar.feed([_summary(life)], NOW, WINDOW)).walk("VEVENT")
    assert "Announced duration: 300 s" in str(event["DESCRIPTION"])
    assert "Measured impact: not measured" in str(event["DESCRIPTION"])
    life.messages[-1].body["data"]["impact"] = {"measuredSeconds": 12.5, "method": "reboot-gap"}
    (event,) = _parse(calendar.feed([_summary(life)], NOW, WINDOW)).walk("VEVENT")
    assert "Measured impact: 12.5 s (reboot-gap)" in str(event["DESCRIPTION"])


def test_the_window_keeps_old_events_out() -> None:
    life = Lifecycle()
    life.transition("Scheduled")
    text = calendar.feed([_summary(life)], NOW + timedelta(days=31), WINDOW)
    assert _parse(text).walk("VEVENT") == []
