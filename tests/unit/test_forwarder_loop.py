"""The forwarder's loop in-process, against in-memory fakes of its ports (tests/support):
each fault of issue 10 on its own, with the promise it must keep. The same loop under random
sequences of all of them is tests/reliability/test_forwarder_state_machine.py."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import pytest

from sebridge.contract.events import Envelope, Observer, parse_message
from sebridge.forwarder.observability.health import Health
from sebridge.forwarder.ports import ImdsError
from sebridge.forwarder.service import OBSERVER_RETRY_SECONDS
from tests.support.forwarder_fakes import OBSERVER, World, scheduled, started

A = "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f"
B = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"
PAST_NOT_BEFORE = "Sun, 22 Nov 2026 00:59:00 GMT"  # a minute before the fake clock starts


def delivered(world: World) -> list[tuple[str, str]]:
    """The lifecycle transitions delivered (not the VM's Measured reports)."""
    return [
        (e.subject, e.session_id) for e in world.broker.transitions() if e.subject != "Measured"
    ]


def poll_and_send(world: World) -> None:
    assert world.forwarder.tick() is None
    world.forwarder.send_pending()


# -- item 1: a failed state save -------------------------------------------------------------


def test_a_notice_held_by_a_failed_save_goes_out_one_poll_after_the_disk_recovers() -> None:
    world = World(heartbeat_interval=1.0)
    poll_and_send(world)
    world.imds.set([scheduled(A)])
    world.store.fail_next = 5  # the disk is full for five polls
    for _ in range(5):
        world.clock.advance(1)
        poll_and_send(world)
        assert delivered(world) == []  # held: its state is not on disk
        assert world.outbox.held() == 1
        health = world.forwarder.health()
        assert health.state_save_failing_since is not None and not health.ok
    beats = [parse_message(e.body_bytes()) for e in world.broker.heartbeats()]
    assert beats[-1].data["heartbeat"]["health"]["stateSaveFailing"] is True
    world.clock.advance(1)
    poll_and_send(world)  # the disk has room again: this very poll saves and releases
    assert delivered(world) == [("Scheduled", A)]
    assert world.forwarder.health().state_save_failing_since is None
    world.clock.advance(1)
    poll_and_send(world)
    last = parse_message(world.broker.heartbeats()[-1].body_bytes())
    assert "health" not in last.data["heartbeat"]  # healthy Heartbeats carry no health


def test_the_save_is_retried_on_polls_that_fail_too() -> None:
    world = World()
    world.imds.set([scheduled(A)])
    world.store.fail_next = 1
    poll_and_send(world)
    assert delivered(world) == []
    world.imds.fail_next = 1  # IMDS fails the next poll; the save is retried all the same
    world.clock.advance(1)
    assert world.forwarder.tick() is not None
    world.forwarder.send_pending()
    assert delivered(world) == [("Scheduled", A)]


def test_transitions_observed_while_saves_fail_are_all_released_in_order() -> None:
    world = World()
    world.store.fail_next = 100
    for events in ([scheduled(A)], [scheduled(A), scheduled(B)], [started(A), scheduled(B)]):
        world.imds.set(events)
        world.clock.advance(1)
        poll_and_send(world)
    assert delivered(world) == []
    world.store.fail_next = 0
    world.clock.advance(1)
    poll_and_send(world)
    assert delivered(world) == [("Scheduled", A), ("Scheduled", B), ("Started", A)]


def test_a_crash_while_saves_fail_loses_nothing_and_doubles_nothing() -> None:
    world = World()
    world.imds.set([scheduled(A)])
    poll_and_send(world)
    world.store.fail_next = 100
    world.imds.set([started(A)])
    world.clock.advance(1)
    poll_and_send(world)  # Started held: the saved state still says Scheduled
    world.restart()  # crash: the held row is dropped, the saved state is the last good one
    world.store.fail_next = 0
    world.clock.advance(1)
    poll_and_send(world)
    assert delivered(world) == [("Scheduled", A), ("Started", A)]
    assert world.outbox.depth() == 0


# -- the outbox cannot be written -------------------------------------------------------------


def test_an_outbox_write_failure_keeps_the_state_where_it_was_and_the_next_poll_retries() -> None:
    world = World()
    world.imds.set([scheduled(A)])
    world.outbox.fail_writes = 2
    for _ in range(2):
        assert world.forwarder.tick() is None  # on schedule: IMDS is fine
        assert world.forwarder.state.events == {}
        assert world.forwarder.health().outbox_write_failing_since is not None
        world.clock.advance(1)
    poll_and_send(world)
    assert delivered(world) == [("Scheduled", A)]
    assert world.forwarder.health().outbox_write_failing_since is None


# -- item 2: one unsendable message ----------------------------------------------------------


def test_a_message_refused_even_alone_is_set_aside_and_the_rest_goes_on() -> None:
    world = World(heartbeat_interval=5.0)
    world.broker.refuse = lambda e: "too large even alone" if e.session_id == A else None
    world.imds.set([scheduled(A), scheduled(B)])
    poll_and_send(world)
    world.imds.set([scheduled(A), started(B)])
    world.clock.advance(1)
    poll_and_send(world)
    assert delivered(world) == [("Scheduled", B), ("Started", B)]
    assert world.outbox.depth() == 0 and world.outbox.aside_count() == 1
    (row,) = world.outbox.real.aside()
    assert row.message_id == f"{A}:Scheduled:1" and row.reason == "too large even alone"
    world.clock.advance(5)
    poll_and_send(world)
    beat = parse_message(world.broker.heartbeats()[-1].body_bytes())
    assert beat.data["heartbeat"]["health"]["setAside"] == 1


def test_a_lost_acknowledgement_resends_and_duplicate_detection_keeps_one() -> None:
    world = World()
    world.imds.set([scheduled(A), scheduled(B)])
    world.broker.lose_ack_next = 1
    world.forwarder.tick()
    with pytest.raises(Exception, match="no answer"):
        world.forwarder.send_pending()
    world.forwarder.send_pending()
    assert delivered(world) == [("Scheduled", A), ("Scheduled", B)]
    assert world.broker.calls >= 2


# -- item 4: the observation gap decides Completed by inference -------------------------------


@pytest.mark.parametrize(
    ("gap", "expected"), [(1, "Cancelled"), (29, "Cancelled"), (31, "Completed")]
)
def test_a_scheduled_event_past_not_before_vanishing_after_a_gap(gap: float, expected: str) -> None:
    world = World()
    world.imds.set([scheduled(A, NotBefore=PAST_NOT_BEFORE)])
    poll_and_send(world)
    world.imds.set([])
    world.imds.fail_next = 1000  # IMDS down: no poll sees anything for `gap` seconds
    for _ in range(int(gap)):
        world.clock.advance(1)
        world.forwarder.tick()
    world.imds.fail_next = 0
    world.clock.advance(gap - int(gap) or 0.0)
    poll_and_send(world)
    assert delivered(world) == [("Scheduled", A), (expected, A)]


@pytest.mark.parametrize(("down", "expected"), [(3, "Cancelled"), (45, "Completed")])
def test_the_gap_includes_a_restart(down: float, expected: str) -> None:
    world = World()
    world.imds.set([scheduled(A, NotBefore=PAST_NOT_BEFORE)])
    poll_and_send(world)
    for _ in range(40):  # watched, unchanged, for 40 s: the last observation is in memory only
        world.clock.advance(1)
        poll_and_send(world)
    world.forwarder.stop()
    world.forwarder.poll_loop()  # a clean stop keeps when the last poll was
    world.clock.advance(down)
    world.restart()
    world.imds.set([])
    poll_and_send(world)
    assert delivered(world)[-1] == (expected, A)


# -- item 8: instance metadata failing is logged once, then when it changes -------------------


def test_instance_metadata_failures_are_logged_once_and_again_only_when_they_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = World()
    html = "<html><body>" + "<p>Not Found</p>" * 40 + "</body></html>"
    world.imds.instance_error = ImdsError(
        f"IMDS answered 404 to GET instance: {html}", transient=False, status=404
    )
    with caplog.at_level(logging.DEBUG, logger="forwarder"):
        world.restart()
        for _ in range(10):
            world.clock.advance(OBSERVER_RETRY_SECONDS)
            world.forwarder.tick()
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "instance metadata unavailable" in warnings[0].getMessage()
        world.imds.instance_error = ImdsError("IMDS did not answer within 10.0 s", transient=True)
        for _ in range(3):
            world.clock.advance(OBSERVER_RETRY_SECONDS)
            world.forwarder.tick()
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 2
        world.imds.instance_error = None
        world.clock.advance(OBSERVER_RETRY_SECONDS)
        world.forwarder.tick()
    assert world.forwarder.observer.vm_name == "vm1"
    assert any("instance metadata available" in r.getMessage() for r in caplog.records)
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 2


# -- issue 22 item 13: a message never leaves without the VM's identity ----------------------

FALLBACK = Observer(vm_name="fallback")  # World's host-name identity


def unknown_identity(world: World) -> None:
    """Instance metadata fails (500) from the forwarder's start on."""
    world.imds.instance_error = ImdsError("IMDS answered 500 to GET instance", transient=True)
    world.restart()


def test_transitions_wait_for_the_identity_then_go_out_with_it_under_their_own_ids() -> None:
    world = World(heartbeat_interval=1.0)
    unknown_identity(world)
    world.imds.set([scheduled(A)])
    for _ in range(10):
        world.clock.advance(1)
        poll_and_send(world)
    assert world.broker.accepted == []  # no transition, and no Heartbeat either
    waiting = [envelope for _, envelope in world.outbox.peek(10)]
    assert [e.subject for e in waiting] == ["Scheduled"]
    assert parse_message(waiting[0].body_bytes()).observer == FALLBACK  # the probe's, hooks'
    world.imds.instance_error = None
    for _ in range(61):  # the next lookup comes within the backoff's cap
        world.clock.advance(1)
        poll_and_send(world)
        if world.broker.transitions():
            break
    (sent,) = world.broker.transitions()
    assert sent.message_id == waiting[0].message_id and sent.session_id == A
    message = parse_message(sent.body_bytes())
    assert message.observer == OBSERVER and message.source == OBSERVER.source
    assert sent.application_properties["vmName"] == "vm1"
    assert sent.application_properties["resourceGroup"] == "rg"
    world.clock.advance(1)
    poll_and_send(world)
    beats = [parse_message(e.body_bytes()) for e in world.broker.heartbeats()]
    assert beats and all(b.observer == OBSERVER for b in beats)


def test_rows_an_earlier_run_left_under_the_host_name_are_sent_with_the_identity() -> None:
    world = World()
    unknown_identity(world)
    world.imds.set([scheduled(A)])
    poll_and_send(world)
    assert world.outbox.depth() == 1
    world.imds.instance_error = None
    world.restart()  # a crash: the next run finds instance metadata at once
    poll_and_send(world)
    (sent,) = world.broker.transitions()
    assert parse_message(sent.body_bytes()).observer == OBSERVER


def test_an_imds_that_serves_no_instance_metadata_sends_under_the_host_name() -> None:
    world = World()
    world.imds.instance_error = ImdsError("IMDS answered 404", transient=False, status=404)
    world.restart()
    world.imds.set([scheduled(A)])
    poll_and_send(world)
    (sent,) = world.broker.transitions()
    assert parse_message(sent.body_bytes()).observer == FALLBACK


def test_the_identity_lookup_backs_off_from_one_second_to_a_minute() -> None:
    world = World()
    unknown_identity(world)
    del world.imds.lookups[:-1]  # from the restart's on
    for _ in range(900):
        world.clock.advance(1)
        world.forwarder.tick()
    gaps = [b - a for a, b in itertools.pairwise(world.imds.lookups)]
    assert 1 <= gaps[0] <= 2 and max(gaps) <= OBSERVER_RETRY_SECONDS + 1
    assert max(gaps) > OBSERVER_RETRY_SECONDS / 2  # it grew
    assert len(world.imds.lookups) < 60  # not once a second for 15 minutes


# -- what issue 14 and 16 plug in ------------------------------------------------------------


def test_listeners_see_recorded_transitions_and_every_tick() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.recorded: list[str] = []
            self.health: list[Health] = []

        def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
            self.recorded += [e.subject for e in envelopes]

        def polled(self, health: Health) -> None:
            self.health.append(health)

    class Broken:
        def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
            raise RuntimeError("a bug in a plug-in")

        def polled(self, health: Health) -> None:
            raise RuntimeError("a bug in a plug-in")

    world = World()
    recorder = Recorder()
    world.forwarder.listeners = [Broken(), recorder]
    world.imds.set([scheduled(A)])
    poll_and_send(world)
    world.imds.fail_next = 1
    world.forwarder.tick()
    assert recorder.recorded == ["Scheduled"]
    assert [h.poll_failures for h in recorder.health] == [0, 1]
    assert delivered(world) == [("Scheduled", A)]  # a broken listener changes nothing


def test_a_message_refused_during_a_poll_goes_in_once_that_poll_recorded_its_events() -> None:
    """The VM's own message for an event (a Prepared) never goes into the outbox before the
    event's transitions: while a poll derives them, deliver refuses it. A hook or the drain
    probe finishing at that moment tried once; the retries came from inside later polls, which
    refuse it too, so the Prepared waited for ever (a CI run under load: no Prepared, the
    event started unapproved). Listeners are now told once each poll has recorded them."""
    from sebridge.contract.events import prepared_message
    from sebridge.imds import ScheduledEvent

    world = World()
    event = ScheduledEvent.from_imds(scheduled(A))
    prepared = prepared_message(
        event,
        world.forwarder.observer,
        1,
        world.clock.now(),
        source=world.forwarder.observer.source,
        prepared_vms=[world.forwarder.observer.vm_name],
        cause="Scheduled|hooks|vm",
        prepared_by="hooks",
    )
    answers: list[tuple[str, bool]] = []

    class Preparation:
        """Tries to deliver the Prepared when a poll is under way (as the hook thread did),
        then again whenever the forwarder says a poll recorded its transitions."""

        def __init__(self) -> None:
            self.waiting = False

        def document_observed(self, document: object, observer: object, at: object) -> None:
            if not answers:
                answers.append(("during the poll", world.forwarder.deliver(prepared)))
                self.waiting = not answers[-1][1]

        def poll_recorded(self) -> None:
            if self.waiting:
                self.waiting = not world.forwarder.deliver(prepared)
                answers.append(("after the poll", not self.waiting))

    world.forwarder.listeners = [Preparation()]
    world.imds.set([scheduled(A)])
    poll_and_send(world)
    assert answers == [("during the poll", False), ("after the poll", True)]
    assert delivered(world) == [("Scheduled", A), ("Prepared", A)]


def test_a_heartbeat_with_health_follows_the_data_schema() -> None:
    import json
    from importlib import resources

    import jsonschema

    world = World(heartbeat_interval=1.0)
    world.imds.set([scheduled(A)])
    world.store.fail_next = 1
    world.broker.refuse = lambda e: "too large" if e.subject == "Scheduled" else None
    poll_and_send(world)  # the save fails: held
    world.clock.advance(1)
    poll_and_send(world)  # saved, released, refused and set aside
    world.store.fail_next = 1
    world.imds.set([started(A)])
    world.clock.advance(1)
    poll_and_send(world)
    text = resources.files("sebridge.contract").joinpath("schemas", "scheduled-event-data.v1.json")
    schema = json.loads(text.read_text("utf-8"))
    beats = [parse_message(e.body_bytes()) for e in world.broker.heartbeats()]
    health = beats[-1].data["heartbeat"]["health"]
    assert health["stateSaveFailing"] is True and health["setAside"] == 1
    assert "No space left" in health["lastError"]
    for beat in beats:
        jsonschema.validate(beat.data, schema, format_checker=jsonschema.FormatChecker())


def test_the_unit_bounds_memory_and_stop_time() -> None:
    from pathlib import Path

    unit = Path(__file__).resolve().parents[2] / "infra" / "scripts" / "sebridge-forwarder.service"
    values = dict(
        line.split("=", 1)
        for line in unit.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert values["MemoryMax"] == "192M" and values["MemoryHigh"] == "128M"
    assert int(values["TimeoutStopSec"]) >= 3 * 5  # SIGTERM ends it within 5 s


def test_an_approved_message_the_outbox_cannot_take_is_kept_and_retried() -> None:
    from sebridge.contract.events import Transition, event_message
    from sebridge.imds import ScheduledEvent

    world = World()
    approved = event_message(
        Transition.APPROVED,
        ScheduledEvent.from_imds(scheduled(A)),
        world.forwarder.observer,
        1,
        world.clock.now(),
        approval={"requestedBy": "ops", "reason": "patching"},
    )
    world.outbox.fail_writes = 1
    world.forwarder.enqueue(approved)  # the approvals thread: never raises
    assert world.outbox.depth() == 0
    poll_and_send(world)  # the next tick writes it
    assert delivered(world) == [("Approved", A)]


def test_a_stop_signal_ends_every_loop_at_once() -> None:
    """main's SIGTERM handler only sets the stop event: the sender, waiting for work, must be
    woken as well, or the process would wait out the join timeout (and the 5 s bound)."""
    import threading
    import time

    world = World()
    result: list[bool] = []
    runner = threading.Thread(target=lambda: result.append(world.forwarder.run()))
    runner.start()
    time.sleep(0.3)
    started = time.monotonic()
    world.forwarder.stop_event.set()
    runner.join(5)
    assert result == [True] and time.monotonic() - started < 1.0


def test_an_identity_unknown_too_long_with_messages_waiting_is_unhealthy() -> None:
    """Hostile review item 6: /healthz, the healthy gauge and `sebridge status` said healthy
    for 13 minutes while the identity was unknown and nothing could be sent. Now the one health
    rule (assess) says why once it lasts past IDENTITY_UNKNOWN_LIMIT with messages waiting, and
    is healthy again once the identity is known."""
    from sebridge.forwarder.observability.observations import IDENTITY_UNKNOWN_LIMIT, Observations

    world = World()
    unknown_identity(world)
    observations = Observations(now=world.clock.now)
    world.imds.set([scheduled(A)])
    poll_and_send(world)
    observations.polled(world.forwarder.health())
    assert observations.assess() == []  # a short outage of instance metadata is not a fault
    for _ in range(int(IDENTITY_UNKNOWN_LIMIT) + 5):
        world.clock.advance(1)
        world.forwarder.tick()
    observations.polled(world.forwarder.health())
    (reason,) = observations.assess()
    assert "identity (instance metadata) unknown since" in reason and "1 message(s)" in reason
    world.imds.instance_error = None
    for _ in range(int(OBSERVER_RETRY_SECONDS) + 1):
        world.clock.advance(1)
        poll_and_send(world)
    observations.polled(world.forwarder.health())
    assert observations.assess() == []
