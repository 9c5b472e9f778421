"""The timing rule (sebridge.timing): drain moments, leads, and the drain probe's bound."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sebridge.imds import ScheduledEvent
from sebridge.timing import (
    DEFAULT_LEADS,
    DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS,
    FIRST_SIGHT,
    REPAIR_GRACE_MINIMUM_SECONDS,
    Leads,
    TimingError,
    UnhealthyRuns,
    check_probe_bound,
    drain_moment,
    leads_from_json,
    parse_leads,
    probe_begins,
)
from tests.support.budget import examples

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def event(
    event_type: str = "Reboot", not_before: datetime | str | None = None, status: str = "Scheduled"
) -> ScheduledEvent:
    if isinstance(not_before, datetime):
        text = not_before.strftime("%a, %d %b %Y %H:%M:%S GMT")
    else:
        text = not_before or ""
    return ScheduledEvent.from_imds(
        {
            "EventId": "aaaaaaaa-0000-4000-8000-000000000001",
            "EventType": event_type,
            "EventStatus": status,
            "NotBefore": "" if status == "Started" else text,
            "Resources": ["vm1"],
        },
        strict=False,
    )


# -- the moment ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "notice", "moment_after_first_sight"),
    [
        ("Reboot", timedelta(minutes=15), timedelta(minutes=10)),  # NotBefore - 300 s
        ("Redeploy", timedelta(minutes=10), timedelta(minutes=5)),
        ("Freeze", timedelta(minutes=15), timedelta(minutes=13)),  # NotBefore - 120 s
        ("Reboot", timedelta(days=7), timedelta(days=7) - 5 * MINUTE),  # degraded hardware
        ("Reboot", timedelta(minutes=3), timedelta(0)),  # a notice shorter than the lead
        ("Reboot", timedelta(minutes=5), timedelta(0)),  # exactly the lead
        ("Preempt", timedelta(seconds=30), timedelta(0)),  # first-sight types
        ("Terminate", timedelta(minutes=15), timedelta(0)),
        ("LiveMigration", timedelta(hours=1), timedelta(0)),  # a type IMDS may add later
        ("reboot", timedelta(minutes=15), timedelta(minutes=10)),  # types ignore case
    ],
)
def test_the_moment_by_type_and_notice(
    kind: str, notice: timedelta, moment_after_first_sight: timedelta
) -> None:
    assert (
        drain_moment(event(kind, T0 + notice), T0, DEFAULT_LEADS) == T0 + moment_after_first_sight
    )


@pytest.mark.parametrize(
    "odd",
    [
        event(not_before=None),  # no NotBefore
        event(not_before="soon"),  # unreadable
        event(not_before="9999-12-31T23:59:59-01:00"),  # out of range: read as null
        event(status="Started"),  # started: act now
    ],
)
def test_an_unknown_notbefore_or_a_started_event_is_at_once(odd: ScheduledEvent) -> None:
    assert drain_moment(odd, T0, DEFAULT_LEADS) == T0


def test_a_notbefore_that_passed_is_at_first_sight() -> None:
    assert drain_moment(event(not_before=T0 - MINUTE), T0, DEFAULT_LEADS) == T0


@given(
    notice=st.integers(-3600, 8 * 86_400),
    lead=st.one_of(st.none(), st.integers(0, 7 * 86_400)),
    kind=st.sampled_from(["Reboot", "Freeze", "Redeploy", "Preempt", "Terminate", "Other"]),
)
def test_the_moment_is_never_before_first_sight_nor_after_notbefore_minus_the_lead(
    notice: int, lead: int | None, kind: str
) -> None:
    leads = Leads({kind: lead})
    not_before = T0 + timedelta(seconds=notice)
    moment = drain_moment(event(kind, not_before), T0, leads)
    assert moment >= T0
    if lead is None:
        assert moment == T0
    else:
        assert moment == max(T0, not_before - timedelta(seconds=lead))


# -- leads: the flag and the JSON spelling -------------------------------------------------------
def test_the_defaults_and_how_they_are_spelled() -> None:
    assert DEFAULT_LEADS.describe() == {
        "Freeze": 120,
        "Reboot": 300,
        "Redeploy": 300,
        "Preempt": FIRST_SIGHT,
        "Terminate": FIRST_SIGHT,
    }
    assert parse_leads(DEFAULT_LEADS.spelled()) == DEFAULT_LEADS
    assert parse_leads("") == DEFAULT_LEADS


def test_a_flag_changes_only_the_types_it_names() -> None:
    leads = parse_leads(" reboot=600, Freeze=first-sight ,Terminate=90.5")
    assert leads.describe() == {
        "Freeze": FIRST_SIGHT,
        "Reboot": 600,
        "Redeploy": 300,
        "Preempt": FIRST_SIGHT,
        "Terminate": 90.5,
    }


def test_the_json_spelling_is_the_same_rule() -> None:
    assert leads_from_json({"Reboot": 600, "Freeze": "first-sight", "Terminate": 90.5}) == (
        parse_leads("Reboot=600,Freeze=first-sight,Terminate=90.5")
    )
    assert leads_from_json(None) == DEFAULT_LEADS


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Reboot", "is not TYPE=SECONDS"),
        ("Reboot=", "is not TYPE=SECONDS"),
        ("=300", "is not TYPE=SECONDS"),
        ("Nap=300", "unknown event type 'Nap'"),
        ("Reboot=soon", "is not a number of seconds or 'first-sight'"),
        ("Reboot=-1", "must be between 0 and 604800"),
        ("Reboot=604801", "must be between 0 and 604800"),
        ("Reboot=nan", "must be between"),
        ("Reboot=inf", "must be between"),
        ("Reboot=300,reboot=200", "Reboot is given twice"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(text: str, problem: str) -> None:
    with pytest.raises(TimingError, match="--drain-lead") as caught:
        parse_leads(text)
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([300], "must be an object"),
        ({"Reboot": True}, "is not a number"),
        ({"Reboot": None}, "is not a number"),
        ({"Reboot": -5}, "must be between"),
        ({"Nap": 5}, "unknown event type"),
        ({"Reboot": 1, "REBOOT": 2}, "given twice"),
    ],
)
def test_bad_json_is_refused_naming_it(value: Any, problem: str) -> None:
    with pytest.raises(TimingError, match="leadSeconds") as caught:
        leads_from_json(value)
    assert problem in str(caught.value)


# -- the probe's bound ---------------------------------------------------------------------------
def test_the_bound_stays_below_the_shortest_repair_grace_period() -> None:
    assert DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS < REPAIR_GRACE_MINIMUM_SECONDS == 600
    assert check_probe_bound(599) == 599
    for refused in (600, 601, 3600, 0, -1, float("nan"), float("inf")):
        with pytest.raises(TimingError):
            check_probe_bound(refused)
    with pytest.raises(TimingError, match="automatic instance repairs"):
        check_probe_bound(600)


def test_the_probe_begins_no_earlier_than_notbefore_minus_the_bound() -> None:
    bound = timedelta(seconds=510)
    long_lead = event(not_before=T0 + timedelta(hours=1))
    moment = T0  # a lead of an hour (or first sight)
    assert probe_begins(long_lead, moment, bound) == T0 + timedelta(hours=1) - bound
    short = event(not_before=T0 + 5 * MINUTE)
    assert probe_begins(short, T0, bound) == T0
    assert probe_begins(event(not_before=None), T0, bound) == T0


def test_a_run_ends_at_the_bound_and_a_drain_that_began_after_it_starts_another() -> None:
    bound = timedelta(seconds=510)
    runs = UnhealthyRuns(bound)
    begins = {"a": T0, "b": T0 + timedelta(seconds=300)}
    assert runs.holding(begins, T0) == {"a"}
    assert runs.holding(begins, T0 + timedelta(seconds=400)) == {"a", "b"}
    assert runs.holding(begins, T0 + bound) == set()  # the run reached the bound: both spent
    assert runs.spent == {"a", "b"}
    begins["c"] = T0 + timedelta(seconds=600)
    assert runs.holding(begins, T0 + timedelta(seconds=600)) == {"c"}  # a new run
    assert runs.run_end() == T0 + timedelta(seconds=600) + bound
    del begins["c"]
    assert runs.holding(begins, T0 + timedelta(seconds=700)) == set()
    assert runs.run_start is None


def test_replaying_from_the_begin_times_gives_the_same_runs() -> None:
    """After a restart the begin times come back from the journal: the replay spends what
    the live probe spent and keeps what it kept."""
    bound = timedelta(seconds=510)
    begins = {"a": T0, "b": T0 + timedelta(seconds=550)}
    fresh = UnhealthyRuns(bound)
    assert fresh.holding(begins, T0 + timedelta(seconds=700)) == {"b"}
    assert fresh.spent == {"a"} and fresh.run_start == T0 + timedelta(seconds=550)


def seconds(count: float) -> datetime:
    return T0 + timedelta(seconds=count)


def held_for(runs: UnhealthyRuns, begins: dict[str, datetime], start: int, stop: int) -> list[int]:
    """The seconds from ``start`` to ``stop`` at which ``begins`` hold the probe at 503."""
    return [second for second in range(start, stop) if runs.holding(begins, seconds(second))]


def test_a_run_that_starts_soon_after_a_start_counts_its_bound_from_it() -> None:
    """The process came up at 100 s (the balancer saw the probe refused while it was down, and
    may not have seen it healthy for the gap since): a drain at 120 s still holds at once, and
    its run ends 510 s after the start, not after its own start. One at 190 s, after 90 s of
    200, runs whole."""
    runs = UnhealthyRuns(timedelta(seconds=510), timedelta(seconds=90))
    runs.came_up(seconds(100), seconds(100))
    assert runs.in_the_dark
    held = held_for(runs, {"a": seconds(120)}, 100, 800)
    assert held[0] == 120 and held[-1] == 100 + 510 - 1 and len(held) == 490
    assert runs.spent == {"a"} and not runs.in_the_dark  # 200 for the gap after the run
    later = UnhealthyRuns(timedelta(seconds=510), timedelta(seconds=90))
    later.came_up(seconds(100), seconds(100))
    held = held_for(later, {"a": seconds(190)}, 100, 800)
    assert held[0] == 190 and len(held) == 510 and not later.in_the_dark


def test_after_restarts_in_a_row_a_run_counts_from_the_first_of_them() -> None:
    """Starts in a row since 0 s (the probe never answered 200 for the gap between them), the
    last at 300 s: a drain at 310 s holds at once, until 510 s after the first."""
    runs = UnhealthyRuns(timedelta(seconds=510), timedelta(seconds=90))
    runs.came_up(seconds(0), seconds(300))
    held = held_for(runs, {"a": seconds(310)}, 300, 1200)
    assert held[0] == 310 and held[-1] == 509


def test_restarts_in_a_row_for_longer_than_the_bound_never_put_a_drain_off() -> None:
    """Starts in a row since 0 s, the last at 600 s: a run counted from 0 s would have nothing
    left; the drain holds at once all the same, for the whole bound (the balancer's view is
    the restarts' own: no process can help it)."""
    runs = UnhealthyRuns(timedelta(seconds=510), timedelta(seconds=90))
    runs.came_up(seconds(0), seconds(600))
    held = held_for(runs, {"a": seconds(620)}, 600, 1400)
    assert held[0] == 620 and len(held) == 510


def test_the_replay_of_a_run_begun_before_the_gap_was_seen_ends_where_it_did() -> None:
    """A restart 225 s into a run that began 20 s after the last start: the new instance, told
    that the probe had not answered 200 for the gap since that start, holds until the same
    moment; told only of its own start, it would hold 20 s too long."""
    begins = {"a": seconds(120)}
    live = UnhealthyRuns(timedelta(seconds=510), timedelta(seconds=90))
    live.came_up(seconds(100), seconds(100))
    held = held_for(live, begins, 100, 800)
    replay = UnhealthyRuns(timedelta(seconds=510), timedelta(seconds=90))
    replay.came_up(seconds(100), seconds(325))
    assert held_for(replay, begins, 325, 800) == [second for second in held if second >= 325]
    forgetful = UnhealthyRuns(timedelta(seconds=510), timedelta(seconds=90))
    forgetful.came_up(seconds(325), seconds(325))
    assert held_for(forgetful, begins, 325, 800)[-1] == 120 + 510 - 1


def test_no_gap_no_dark() -> None:
    runs = UnhealthyRuns(timedelta(seconds=510), timedelta(0))
    runs.came_up(seconds(0), seconds(100))
    assert not runs.in_the_dark
    assert len(held_for(runs, {"a": seconds(110)}, 100, 800)) == 510


@pytest.mark.slow  # about 8 s or more: make check leaves it to make test
@settings(max_examples=examples(200), deadline=None)
@given(
    begins=st.dictionaries(st.sampled_from("abcde"), st.integers(0, 3000), max_size=5),
    gone=st.dictionaries(st.sampled_from("abcde"), st.integers(0, 3000), max_size=5),
    bound=st.integers(30, 599),
)
def test_the_probe_is_never_unhealthy_longer_than_the_bound_at_a_stretch(
    begins: dict[str, int], gone: dict[str, int], bound: int
) -> None:
    """Drains begin and end (their event vanishes) at any second; sampled every second, no run
    of 503 lasts longer than the bound, and a drain that began while the probe was healthy
    and not spent makes it unhealthy."""
    runs = UnhealthyRuns(timedelta(seconds=bound))
    streak = 0
    for second in range(0, 3200):
        now = T0 + timedelta(seconds=second)
        current = {
            key: T0 + timedelta(seconds=at)
            for key, at in begins.items()
            if key not in gone or gone[key] > second
        }
        holding = runs.holding(current, now)
        streak = streak + 1 if holding else 0
        assert streak <= bound, (second, streak)
        fresh = [k for k, at in current.items() if at == now and k not in runs.spent]
        if fresh:
            assert holding, (second, fresh)
