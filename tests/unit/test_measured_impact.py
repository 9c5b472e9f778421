"""Measured impact (issue 26 part B): the real forwarder loop in-process with injected clocks
(tests/support/forwarder_fakes.py), and the contract's side of ``data.impact``.

The clocks are the attack: a pause that only the monotonic clock shows, one that only the wall
clock shows (stepped by time sync on resume), failed polls whose backoff is not a pause, a
crash across a Started event, a crash between the outbox write and the state save."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import jsonschema
import pytest

from sebridge import lifecycle
from sebridge.contract.events import (
    Observer,
    Transition,
    event_message,
    measured_message,
    parse_message,
)
from sebridge.forwarder.imds.impact import PERSIST_EVERY, Impact
from sebridge.forwarder.state import ForwarderState
from tests.fixtures import golden
from tests.support.forwarder_fakes import World, scheduled, started
from tests.unit.test_contract import DATA_SCHEMA, FORMATS

A = "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f"
B = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"


def step(world: World, seconds: float = 1.0) -> None:
    """One poll on schedule, one interval after the last, then send."""
    world.clock.advance(seconds)
    assert world.forwarder.tick() is None
    world.forwarder.send_pending()


def completed(world: World) -> list[dict[str, Any] | None]:
    """The ``data.impact`` of every Completed delivered (None where it has none)."""
    out = []
    for envelope in world.broker.transitions():
        if envelope.subject == "Completed":
            out.append(envelope.body["data"].get("impact"))
    return out


def measured(world: World) -> list[tuple[str, dict[str, Any]]]:
    """(message id, ``data.impact``) of every Measured delivered."""
    return [
        (envelope.message_id, envelope.body["data"]["impact"])
        for envelope in world.broker.transitions()
        if envelope.subject == "Measured"
    ]


def freeze_started(world: World, event_id: str = A, **fields: Any) -> None:
    world.imds.set([scheduled(event_id, EventType="Freeze", DurationInSeconds=9, **fields)])
    step(world)
    world.imds.set([started(event_id, EventType="Freeze", DurationInSeconds=9, **fields)])
    step(world)


def test_a_pause_the_monotonic_clock_shows_is_measured_as_a_freeze_pause() -> None:
    world = World()
    freeze_started(world)
    step(world)
    step(world, 9.0)  # the VM was paused: the next poll came 8 s late
    step(world)
    world.imds.set([])
    step(world)
    assert completed(world) == [{"measuredSeconds": 8.0, "method": "freeze-pause"}]


def test_a_pause_only_the_wall_clock_shows_is_measured_too() -> None:
    """Hyper-V's reference clock may stop with the guest: monotonic shows 1 s, the wall clock
    (stepped to the host's time on resume) shows 12 s."""
    world = World()
    freeze_started(world)
    world.clock.wall += timedelta(seconds=11)
    step(world)
    world.imds.set([])
    step(world)
    assert completed(world) == [{"measuredSeconds": 11.0, "method": "freeze-pause"}]


def test_a_pause_in_the_poll_that_sees_the_event_gone_counts() -> None:
    world = World()
    freeze_started(world)
    world.imds.set([])
    step(world, 6.5)
    assert completed(world) == [{"measuredSeconds": 5.5, "method": "freeze-pause"}]


def test_a_watched_event_without_a_pause_reads_zero_not_absent() -> None:
    world = World()
    freeze_started(world)
    for _ in range(5):
        step(world)
    world.imds.set([])
    step(world)
    assert completed(world) == [{"measuredSeconds": 0.0, "method": "freeze-pause"}]


def test_the_backoff_after_failed_polls_is_not_a_pause() -> None:
    world = World()
    freeze_started(world)
    world.imds.fail_next = 3
    for _ in range(3):
        delay = world.forwarder.tick()
        assert delay is not None
        world.clock.advance(delay)  # the loop waits its backoff, no more
    assert world.forwarder.tick() is None
    world.imds.set([])
    step(world)
    assert completed(world) == [{"measuredSeconds": 0.0, "method": "freeze-pause"}]


def test_a_gap_before_the_event_started_is_not_its_impact() -> None:
    world = World()
    world.imds.set([scheduled(A, EventType="Freeze")])
    step(world)
    step(world, 30.0)  # a long gap while it is only Scheduled
    world.imds.set([started(A, EventType="Freeze")])
    step(world)
    step(world)
    world.imds.set([])
    step(world)
    assert completed(world) == [{"measuredSeconds": 0.0, "method": "freeze-pause"}]


def test_an_event_of_another_vm_is_not_measured() -> None:
    """Every VM of an availability set sees the others' events: only the named VM measures."""
    world = World()
    freeze_started(world, Resources=["vm2"])
    step(world, 9.0)
    world.imds.set([])
    step(world)
    assert completed(world) == [None]
    assert measured(world) == []  # nothing measured, nothing reported


def test_a_reboot_gap_is_measured_across_a_crash_from_the_state_on_disk() -> None:
    world = World()
    world.imds.set([scheduled(A)])
    step(world)
    world.imds.set([started(A)])
    step(world)
    for _ in range(12):  # watched for 12 s: the state is saved every PERSIST_EVERY s at most
        step(world)
    saved = ForwarderState.from_json(json.loads(world.store.disk or b"{}"))
    assert saved.observed_at is not None
    lag = (world.clock.now() - saved.observed_at).total_seconds()
    assert 0 <= lag <= PERSIST_EVERY
    world.clock.advance(120)  # the VM reboots: the process is gone, no clean stop
    world.restart()
    world.imds.set([])
    step(world)
    (impact,) = completed(world)
    assert impact is not None and impact["method"] == "reboot-gap"
    assert 121 <= impact["measuredSeconds"] <= 121 + PERSIST_EVERY


def test_a_clean_stop_saves_the_last_poll_exactly() -> None:
    world = World()
    world.imds.set([started(A)])
    step(world)
    step(world)
    step(world)
    world.forwarder.stop()
    world.forwarder.poll_loop()  # stopped: it only saves the state and returns
    world.clock.advance(60)
    world.restart()
    world.imds.set([])
    step(world)
    assert completed(world) == [{"measuredSeconds": 61.0, "method": "reboot-gap"}]


def test_a_freeze_pause_survives_a_restart_before_the_completed() -> None:
    world = World()
    freeze_started(world)
    step(world, 9.0)
    step(world, PERSIST_EVERY)  # the next periodic save has the measurement
    world.clock.advance(2)
    world.restart()
    world.imds.set([started(A, EventType="Freeze", DurationInSeconds=9)])
    step(world)
    world.imds.set([])
    step(world)
    # The 8 s pause beats the restart's 3 s gap (the largest measurement is kept).
    assert completed(world) == [{"measuredSeconds": 8.0, "method": "freeze-pause"}]


def test_a_crash_between_the_outbox_write_and_the_state_save_loses_no_completed() -> None:
    world = World()
    world.imds.set([started(A)])
    step(world)
    step(world)
    world.imds.set([])
    world.store.fail_next = 1  # the Completed is in the outbox, held; its state is not saved
    world.clock.advance(1)
    assert world.forwarder.tick() is None
    assert world.outbox.held() == 2  # the Completed and this VM's Measured
    world.clock.advance(5)
    world.restart()  # the crash: the held row is dropped, derived again from the saved state
    step(world)
    world.forwarder.send_pending()
    (impact,) = completed(world)
    assert impact is not None and impact["method"] == "reboot-gap"
    assert impact["measuredSeconds"] >= 6


def test_state_saves_are_bounded_while_an_event_is_watched_and_none_when_idle() -> None:
    world = World()
    world.imds.set([scheduled(B, NotBefore="Mon, 30 Nov 2026 10:00:00 GMT")])  # far away
    step(world)
    before = world.store.saves
    for _ in range(60):
        step(world)
    assert world.store.saves == before  # nothing watched: no write per poll
    world.imds.set([started(A)])
    step(world)
    before = world.store.saves
    for _ in range(60):
        step(world)
    assert 60 / PERSIST_EVERY - 1 <= world.store.saves - before <= 60 / PERSIST_EVERY + 1


def test_a_state_file_with_an_unreadable_impact_still_loads() -> None:
    world = World()
    world.imds.set([started(A)])
    step(world)
    body = json.loads(world.store.disk or b"{}")
    body["impacts"] = {A: {"measuredSeconds": "lots", "method": "freeze-pause"}, "x": 5}
    state = ForwarderState.from_json(body)
    assert state.impacts == {} and A in state.events
    body["impacts"] = {A: {"measuredSeconds": 3, "method": "reboot-gap"}}
    assert ForwarderState.from_json(body).impacts == {A: Impact(3.0, "reboot-gap")}


# -- the contract ------------------------------------------------------------------------------


def _completed_with(impact: Any) -> dict[str, Any]:
    envelope = golden.build()["completed"]
    body = dict(envelope.body)
    body["data"] = dict(body["data"]) | {"impact": impact}
    return body


def test_a_completed_with_impact_fits_the_schema_and_reads_back() -> None:
    event = parse_message(golden.build()["started"].body_bytes()).event
    assert event is not None
    envelope = event_message(
        Transition.COMPLETED,
        event,
        golden.OBSERVER,
        14,
        golden.OBSERVED_AT,
        impact={"measuredSeconds": 312.4, "method": "reboot-gap"},
    )
    jsonschema.validate(envelope.body["data"], DATA_SCHEMA, format_checker=FORMATS)
    message = parse_message(envelope.body_bytes())
    assert message.warnings == ()
    assert message.impact is not None and message.impact.seconds == 312.4
    assert message.impact.method == "reboot-gap"
    # Never part of the id: every observer's copy collapses under duplicate detection.
    assert envelope.message_id == golden.build()["completed"].message_id


def test_impact_is_refused_on_any_other_transition_when_building() -> None:
    event = parse_message(golden.build()["started"].body_bytes()).event
    assert event is not None
    with pytest.raises(ValueError, match="Completed only"):
        event_message(
            Transition.STARTED,
            event,
            golden.OBSERVER,
            13,
            golden.OBSERVED_AT,
            impact={"measuredSeconds": 1, "method": "freeze-pause"},
        )


@pytest.mark.parametrize(
    ("impact", "warning"),
    [
        ("fast", 'data.impact: "fast" is not an object'),
        ({"measuredSeconds": -1, "method": "x"}, "data.impact.measuredSeconds: -1"),
        ({"measuredSeconds": True, "method": "x"}, "data.impact.measuredSeconds: true"),
        ({"measuredSeconds": 1e12, "method": "x"}, "data.impact.measuredSeconds"),
        ({"method": "x"}, "data.impact.measuredSeconds: null"),
        ({"measuredSeconds": 4, "method": 7}, "data.impact.method: 7"),
    ],
)
def test_an_odd_impact_is_named_and_never_refuses_the_message(impact: Any, warning: str) -> None:
    message = parse_message(_completed_with(impact))
    assert message.transition is Transition.COMPLETED and message.event is not None
    assert any(w.startswith(warning) for w in message.warnings), message.warnings
    if isinstance(impact, dict) and impact.get("method") == 7:
        assert message.impact is not None and message.impact.method == "unknown"
    else:
        assert message.impact is None


def test_a_reader_that_does_not_know_impact_still_reads_the_message() -> None:
    """The minor-addition rule: an unknown optional field changes nothing for old readers
    (the schema of v1 before this field had no additionalProperties at the top)."""
    body = _completed_with({"measuredSeconds": 2.5, "method": "some-future-method"})
    message = parse_message(body)
    assert message.warnings == ()
    assert message.impact is not None and message.impact.method == "some-future-method"


def test_each_measurement_also_goes_in_a_measured_of_this_vm() -> None:
    """Issue 26 in a set: the topic keeps one Completed of the N VMs' copies (one id for the
    event), so the measurement also travels in a message whose id names this VM."""
    world = World()
    world.imds.set([started(A)])
    step(world)
    step(world, 7.0)
    world.imds.set([])
    step(world)
    (impact,) = completed(world)
    ((message_id, reported),) = measured(world)
    assert reported == impact
    vm = world.forwarder.observer.vm_name
    assert message_id == lifecycle.measured_id(A, 1, vm)
    assert message_id != lifecycle.measured_id(A, 1, vm + "-other")
    delivered = [e.subject for e in world.broker.transitions()]
    assert delivered.index("Measured") == delivered.index("Completed") + 1


def test_a_measured_fits_the_schema_and_is_per_observer() -> None:
    event = parse_message(golden.build()["completed"].body_bytes()).event
    assert event is not None
    impact = {"measuredSeconds": 4.2, "method": "freeze-pause"}
    other = Observer(vm_name="web-2")
    mine = measured_message(
        event, golden.OBSERVER, 14, golden.OBSERVED_AT, appearance=1, impact=impact
    )
    theirs = measured_message(event, other, 9, golden.OBSERVED_AT, appearance=1, impact=impact)
    jsonschema.validate(mine.body["data"], DATA_SCHEMA, format_checker=FORMATS)
    assert mine.message_id != theirs.message_id  # both survive duplicate detection
    assert mine.session_id == golden.build()["completed"].session_id  # the event's session
    assert mine.subject == mine.application_properties["transition"] == "Measured"
    message = parse_message(mine.body_bytes())
    assert message.transition is Transition.MEASURED and message.warnings == ()
    assert message.impact is not None and message.impact.seconds == 4.2
    with pytest.raises(ValueError):
        measured_message(event, other, 9, golden.OBSERVED_AT, appearance=1, impact={"x": 1})
    with pytest.raises(ValueError, match="measured_message"):
        event_message(Transition.MEASURED, event, other, 9, golden.OBSERVED_AT, impact=impact)
