"""The forwarder against the real IMDS simulator, over HTTP.

The real `sebridge forwarder` process: every packaged scenario must yield exactly its expected
transitions and message ids; a kill -9 and restart with the same state directory must still
report what vanished meanwhile; IMDS faults must be waited out without losing or duplicating
anything; Heartbeats come at the configured interval (or not at all).

The approvals handler (``approval_handler.CommandHandler``): commands against the simulator
subprocess through the production IMDS client, with a recording stand-in for the forwarder's
outbox; IMDS refusing the POST dead-letters, IMDS failing or hanging abandons within the
per-command bound, success completes and enqueues Approved.
"""

from __future__ import annotations

import itertools
import json
import socket
import sqlite3
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.imds.testing import (
    RunningSimulator,
    expected_transitions,
    running_simulator,
    scenario_duration,
    scenario_names,
)
from emulators.processes import ChildProcess, forwarder
from emulators.servicebus.durations import parse_duration
from sebridge import __version__, lifecycle
from sebridge.contract import commands
from sebridge.contract.events import (
    Envelope,
    Observer,
    Transition,
    parse_message,
)
from sebridge.forwarder.approvals.handler import COMMAND_IMDS_BUDGET, CommandHandler, Outcome
from sebridge.forwarder.delivery.outbox import OUTBOX_FILE
from sebridge.forwarder.imds.client import CONNECT_TIMEOUT, ImdsClient
from sebridge.imds import ScheduledEvent
from tests.support.waiting import wait_until

SPEED = 8.0
# Watched without a gap, a Scheduled event that vanishes is Cancelled whatever its NotBefore
# says (Completed needs a 30 s observation gap as well), so every scenario runs at one speed:
# canceled-maintenance's event vanishes 0.875 s before NotBefore at speed 8, and a poll
# delayed past that on a loaded machine is still Cancelled.
SPEEDS: dict[str, float] = {}


REPORTS = ("Heartbeat", "Measured")  # what the forwarder reports of itself: no transitions


def messages_of(fw: ChildProcess) -> list[dict[str, Any]]:
    """The lifecycle transitions the forwarder printed (its reports left out)."""
    return [m for m in fw.json_lines() if m.get("subject") not in REPORTS]


def measured_of(fw: ChildProcess) -> list[dict[str, Any]]:
    return [m for m in fw.json_lines() if m.get("subject") == "Measured"]


def outbox_holds(state_dir: Path, message_ids: list[str]) -> bool:
    """Whether the forwarder's outbox (read-only, beside the running forwarder) still holds a
    row of any of ``message_ids``; a busy database counts as holding."""
    try:
        db = sqlite3.connect(f"file:{state_dir / OUTBOX_FILE}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return True
    try:
        marks = ",".join("?" * len(message_ids))
        query = f"SELECT COUNT(*) FROM outbox WHERE message_id IN ({marks})"
        (count,) = db.execute(query, message_ids).fetchone()
    except sqlite3.Error:
        return True
    finally:
        db.close()
    return bool(count)


def wait_for_messages(fw: ChildProcess, count: int, timeout: float) -> list[dict[str, Any]]:
    fw.wait_for(lambda _: len(messages_of(fw)) >= count, timeout)
    return messages_of(fw)


def wait_for_subject(fw: ChildProcess, subject: str, timeout: float) -> None:
    assert fw.wait_for(lambda _: any(m["subject"] == subject for m in messages_of(fw)), timeout), (
        f"no {subject} within {timeout} s; stderr:\n{fw.stderr_text()[-3000:]}"
    )


def expected_message_ids(messages: list[dict[str, Any]]) -> list[str]:
    """The ids the documented scheme (sebridge.lifecycle) gives these transitions, in order."""
    lives: dict[str, lifecycle.Life] = {}
    ids = []
    for message in messages:
        event = ScheduledEvent.from_imds(message["body"]["data"])
        life, message_id = lifecycle.advance(lives.get(event.key), message["subject"], event)
        lives[event.key] = life
        ids.append(message_id)
    return ids


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("scenario", scenario_names())
def test_every_scenario_yields_exactly_its_transitions(scenario: str, tmp_path: Path) -> None:
    expected = [(e["transition"], e["eventId"]) for e in expected_transitions(scenario)]
    speed = SPEEDS.get(scenario, SPEED)
    budget = scenario_duration(scenario, speed) + 20
    with (
        running_simulator(scenario, speed=speed, extra_args=["--start-on-first-poll"]) as sim,
        forwarder(sim.base_url, tmp_path) as fw,
    ):
        wait_for_messages(fw, len(expected), budget)
        time.sleep(1.5)  # anything extra would show up now
        messages = messages_of(fw)
        lines = [m for m in fw.json_lines() if m.get("subject") != "Heartbeat"]
        reports = measured_of(fw)
    got = [(m["subject"], m["session_id"]) for m in messages]
    assert got == expected, fw.stderr_text()[-3000:]
    # What it measured (issue 26) follows the Completed it measured, once per appearance.
    ids = [m["message_id"] for m in lines]
    for report in reports:
        ref, _, appearance = report["message_id"].split(":")[:3]
        assert f"{ref}:Completed:{appearance}" in ids[: ids.index(report["message_id"])]
    assert len({r["message_id"] for r in reports}) == len(reports)
    assert [m["message_id"] for m in messages] == expected_message_ids(messages)
    assert len({m["message_id"] for m in messages}) == len(messages)
    for message in messages:
        parsed = parse_message(message["body"])  # every line is a valid contract message
        assert parsed.transition.value == message["subject"]
        assert parsed.observer.vm_name  # from the simulator's instance metadata


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("scenario", "seen", "advance_to_gone", "then"),
    [
        ("user-reboot", "Started", 30, "Completed"),
        ("canceled-maintenance", "Scheduled", 30, "Cancelled"),
    ],
)
@pytest.mark.slow
def test_restart_reports_what_vanished_while_down(
    scenario: str, seen: str, advance_to_gone: float, then: str, tmp_path: Path
) -> None:
    with running_simulator(scenario, speed=1.0, extra_args=["--start-on-first-poll"]) as sim:
        with forwarder(sim.base_url, tmp_path) as first:
            if seen == "Started":
                wait_for_subject(first, "Scheduled", 15)
                sim.advance(16)
            wait_for_subject(first, seen, 15)
            printed = [m["message_id"] for m in messages_of(first)]
            # The row of what it printed leaves the outbox after printing: a kill before that
            # would print it again after the restart (at-least-once), which is not tested here.
            wait_until(
                lambda: not outbox_holds(tmp_path, printed), 15, "the printed rows to be removed"
            )
            first.kill()  # kill -9: no chance to flush anything
            before = [m["message_id"] for m in messages_of(first)]
        sim.advance(advance_to_gone)
        assert sim.document()["Events"] == []  # the event is gone while the forwarder is down
        with forwarder(sim.base_url, tmp_path) as second:
            wait_for_subject(second, then, 15)
            time.sleep(1.0)
            after = messages_of(second)
    assert [m["subject"] for m in after] == [then]
    assert after[0]["message_id"].endswith(f":{then}:1")
    assert after[0]["message_id"].split(":")[0] == before[0].split(":")[0]


def fault_rule(spec: str) -> dict[str, Any]:
    """``429:count=4,retryAfter=1`` (the simulator's CLI form) as a /_sim/faults rule."""
    kind, _, options = spec.partition(":")
    rule: dict[str, Any] = {"kind": kind}
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        rule[key] = int(value) if value.isdigit() else value
    return rule


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fault", "failures"),
    [
        ("429:count=4,retryAfter=1", 4),
        ("5xx:count=3", 3),
        ("malformed:count=2,body=not-json", 2),
        ("malformed:count=2,body=not-document", 2),
        # The first reset strikes the kept-alive connection: the GET goes once more at once,
        # on a fresh connection, and meets the second (one failed poll); the third strikes the
        # next poll's fresh connection, which is not sent twice.
        ("reset:count=3", 2),
        ("hang:seconds=3,count=1", 0),
    ],
)
@pytest.mark.slow
def test_imds_faults_are_waited_out(fault: str, failures: int, tmp_path: Path) -> None:
    """Faults strike while an event is Scheduled; the scenario clock is slowed down and moved
    on by hand, so only the forwarder's handling of the fault is under test, not a race."""
    expected = [(e["transition"], e["eventId"]) for e in expected_transitions("user-reboot")]
    with (
        running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim,
        forwarder(sim.base_url, tmp_path) as fw,
    ):
        wait_for_subject(fw, "Scheduled", 15)
        sim.set_faults(fault_rule(fault))
        if failures:
            assert fw.wait_for(lambda _: fw.stderr_text().count("poll failed") >= failures, 30), (
                fw.stderr_text()[-2000:]
            )
        else:
            time.sleep(4)
        sim.advance(16)
        wait_for_subject(fw, "Started", 20)
        sim.advance(15)
        wait_for_subject(fw, "Completed", 20)
        time.sleep(1.0)
        got = [(m["subject"], m["session_id"]) for m in messages_of(fw)]
        log = fw.stderr_text()
        assert fw.alive
    assert got == expected, log[-3000:]
    assert log.count("poll failed") == failures


@pytest.mark.timeout(60)
def test_slow_first_call_and_missing_instance_metadata(tmp_path: Path) -> None:
    args = ["--start-on-first-poll", "--first-call-delay", "3", "--no-instance-metadata"]
    with (
        running_simulator("user-reboot", speed=1.0, extra_args=args) as sim,
        forwarder(sim.base_url, tmp_path) as fw,
    ):
        (first, *_) = wait_for_messages(fw, 1, 30)
        log = fw.stderr_text()
    assert first["subject"] == "Scheduled"
    assert "instance metadata unavailable" in log
    assert first["application_properties"]["vmName"] == socket.gethostname().split(".")[0]


@pytest.mark.timeout(60)
def test_vm_name_override_and_once(tmp_path: Path) -> None:
    with running_simulator("user-reboot", speed=1.0) as sim:
        fw = forwarder(sim.base_url, tmp_path, "--once", "--vm-name", "override-7")
        with fw:
            assert fw.process is not None
            assert fw.process.wait(timeout=30) == 0
            (message,) = messages_of(fw)
    assert message["subject"] == "Scheduled"
    assert message["application_properties"]["vmName"] == "override-7"
    assert message["body"]["data"]["observer"]["vmName"] == "override-7"


@pytest.mark.timeout(30)
def test_bad_configuration_fails_fast_with_a_clear_message(tmp_path: Path) -> None:
    fw = ChildProcess("forwarder", ["--state-dir", str(tmp_path), "--poll-interval", "fast"])
    with fw:
        assert fw.process is not None
        assert fw.process.wait(timeout=20) == 2
        assert "--poll-interval must be a number" in fw.stderr_text()
    nowhere = ChildProcess("forwarder", ["--state-dir", str(tmp_path)])
    with nowhere:
        assert nowhere.process is not None
        assert nowhere.process.wait(timeout=20) == 2
        assert "nowhere to publish" in nowhere.stderr_text()


# -- Heartbeats ------------------------------------------------------------------------------


def heartbeats_of(fw: ChildProcess) -> list[tuple[float, dict[str, Any]]]:
    """(arrival time, message) of every Heartbeat line printed so far."""
    out = []
    for line in list(fw.lines):
        if line.text.startswith("{"):
            message = json.loads(line.text)
            if message.get("subject") == "Heartbeat":
                out.append((line.at, message))
    return out


def iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_heartbeats_come_once_a_second_and_say_how_the_forwarder_is(tmp_path: Path) -> None:
    with (
        running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim,
        forwarder(sim.base_url, tmp_path, heartbeat_interval=1) as fw,
    ):
        wait_for_subject(fw, "Scheduled", 15)
        incarnation = sim.document()["DocumentIncarnation"]
        assert fw.wait_for(lambda _: len(heartbeats_of(fw)) >= 6, 15), fw.stderr_text()[-3000:]
        healthy = heartbeats_of(fw)
        # IMDS down: Heartbeats go on (at the poll backoff's pace), the last good poll stays put.
        sim.set_faults({"kind": "5xx", "count": 1000})
        outage_from = len(heartbeats_of(fw))
        assert fw.wait_for(lambda _: len(heartbeats_of(fw)) >= outage_from + 3, 20), (
            fw.stderr_text()[-3000:]
        )
        during = heartbeats_of(fw)[outage_from + 1 :]  # the first may predate the fault
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(healthy)]
    assert 0.8 <= statistics.median(gaps) <= 1.3, gaps
    assert max(gaps) < 2.5, gaps
    for _, message in healthy:
        parsed = parse_message(message["body"])  # a valid contract message
        assert parsed.transition is Transition.HEARTBEAT and parsed.event is None
        assert message["session_id"] == parsed.observer.vm_name == "vmss_vm1"
        assert message["message_id"].startswith("heartbeat:vmss_vm1:")
        beat = message["body"]["data"]["heartbeat"]
        assert beat["forwarderVersion"] == __version__
        assert isinstance(beat["outboxDepth"], int) and 0 <= beat["outboxDepth"] <= 5
        sent_at, last_poll = iso(message["body"]["time"]), iso(beat["lastSuccessfulPoll"])
        assert timedelta(0) <= sent_at - last_poll < timedelta(seconds=1.5)  # polls every 0.2 s
    assert healthy[-1][1]["body"]["data"]["heartbeat"]["lastIncarnation"] == incarnation
    frozen = {m["body"]["data"]["heartbeat"]["lastSuccessfulPoll"] for _, m in during}
    assert len(frozen) == 1, frozen  # no successful poll while IMDS answers 500
    (last_good,) = frozen
    # ...while the Heartbeats carrying it are well past it (they are >= 1 s apart).
    assert iso(during[-1][1]["body"]["time"]) - iso(last_good) >= timedelta(seconds=1)


@pytest.mark.timeout(40)
def test_heartbeat_interval_zero_sends_none(tmp_path: Path) -> None:
    with (
        running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim,
        forwarder(sim.base_url, tmp_path, heartbeat_interval=0) as fw,
    ):
        wait_for_subject(fw, "Scheduled", 15)
        time.sleep(3.5)  # more than three Heartbeat intervals of the test above
        assert fw.alive
        subjects = [m["subject"] for m in fw.json_lines()]
    assert subjects == ["Scheduled"]


# -- The approvals handler against the simulator --------------------------------------------

IDLE_SCENARIO = Path(__file__).resolve().parents[2] / "benchmarks" / "idle-scenario.json"
SHORT_BUDGET = 3.0  # seconds, for the fault cases (the production budget is tested below)
SHORT_READ_TIMEOUT = 1.0


@dataclass
class RecordingForwarder:
    """The forwarder as the handler sees it: its identity and an outbox that records."""

    observer: Observer = field(default_factory=lambda: Observer(vm_name="vmss_vm1"))
    enqueued: list[Envelope] = field(default_factory=list)

    def enqueue(self, envelope: Envelope) -> None:
        self.enqueued.append(envelope)

    def life_of(self, key: str) -> lifecycle.Life | None:
        return None  # the handler's Approved then gets the first appearance's id


@pytest.fixture(scope="module")
def idle_sim() -> Iterator[RunningSimulator]:
    with running_simulator(str(IDLE_SCENARIO)) as running:
        yield running


@pytest.fixture
def scheduled(idle_sim: RunningSimulator) -> str:
    """A fresh simulator with one Scheduled Reboot on vmss_vm1; its EventId (upper case)."""
    idle_sim.reset()
    event_id = str(uuid.uuid4()).upper()
    idle_sim.event(
        "add",
        notBeforeIn=600,
        event={
            "EventId": event_id,
            "EventType": "Reboot",
            "ResourceType": "VirtualMachine",
            "Resources": ["vmss_vm1"],
            "EventStatus": "Scheduled",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        },
    )
    return event_id


def command_body(event_id: str) -> bytes:
    expires = datetime.now(UTC) + timedelta(minutes=10)
    return commands.approve_command(event_id, "ops", "patching", expires).body_bytes()


def posts_for(sim: RunningSimulator, event_id: str) -> list[dict[str, Any]]:
    return [p for p in sim.posts() if event_id in p["body"]]


def handle(handler: CommandHandler, event_id: str) -> tuple[Outcome, float]:
    started = time.monotonic()
    outcome = handler.handle(command_body(event_id.lower()), f"approve:{event_id.lower()}")
    return outcome, time.monotonic() - started


def short_handler(sim: RunningSimulator, fake: RecordingForwarder) -> CommandHandler:
    return CommandHandler(
        fake,
        ImdsClient(sim.base_url),
        budget=SHORT_BUDGET,
        read_timeout=SHORT_READ_TIMEOUT,
    )


@pytest.mark.timeout(30)
def test_handler_approves_completes_and_enqueues_approved(
    idle_sim: RunningSimulator, scheduled: str
) -> None:
    fake = RecordingForwarder()
    handler = CommandHandler(fake, ImdsClient(idle_sim.base_url))
    outcome, _ = handle(handler, scheduled)
    assert outcome == Outcome("complete", description="approved")
    (post,) = posts_for(idle_sim, scheduled)
    assert post["status"] == 200 and post["headers"]["Metadata"] == "true"
    assert json.loads(post["body"]) == {"StartRequests": [{"EventId": scheduled}]}  # IMDS's case
    (event,) = idle_sim.document()["Events"]
    assert event["EventStatus"] == "Started"
    (approved,) = fake.enqueued
    assert approved.subject == "Approved"
    assert approved.message_id == f"{scheduled.lower()}:Approved:1"
    parsed = parse_message(approved.body_bytes())
    assert parsed.data["approval"] == {"requestedBy": "ops", "reason": "patching"}
    # The same command again (a redelivery): IMDS now says Started; nothing more is POSTed.
    again, _ = handle(handler, scheduled)
    assert again == Outcome(
        "complete", description="already approved by this forwarder (now Started)"
    )
    assert len(posts_for(idle_sim, scheduled)) == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("status", [400, 404])
def test_imds_refusing_the_post_dead_letters_with_its_answer(
    idle_sim: RunningSimulator, scheduled: str, status: int
) -> None:
    idle_sim.set_faults({"kind": "4xx", "status": status, "target": "post"})
    fake = RecordingForwarder()
    outcome, _ = handle(short_handler(idle_sim, fake), scheduled)
    assert outcome.action == "dead-letter" and outcome.reason == commands.IMDS_REJECTED
    assert outcome.description.startswith(f"IMDS answered {status}: ")
    assert f"Refused ({status}, injected)" in outcome.description  # the simulator's own body
    assert [p["status"] for p in posts_for(idle_sim, scheduled)] == [status]
    assert idle_sim.document()["Events"][0]["EventStatus"] == "Scheduled"
    assert fake.enqueued == []


TRANSIENT = [
    pytest.param({"kind": kind, "count": 1000, **extra}, target, id=f"{kind}-on-{target}")
    for target in ("get", "post")
    for kind, extra in (
        ("429", {"retryAfter": 1}),
        ("5xx", {"status": 503}),
        ("hang", {"seconds": 4}),  # longer than the read timeout: the request times out
    )
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("rule", "target"), TRANSIENT)
def test_imds_failing_or_hanging_abandons_within_the_budget(
    idle_sim: RunningSimulator, scheduled: str, rule: dict[str, Any], target: str
) -> None:
    idle_sim.set_faults({**rule, "target": target})
    fake = RecordingForwarder()
    outcome, took = handle(short_handler(idle_sim, fake), scheduled)
    assert outcome.action == "abandon" and outcome.reason == "ImdsUnavailable"
    # Bounded by the budget; a connect timeout could add at most CONNECT_TIMEOUT (not on loopback).
    assert took <= SHORT_BUDGET + 0.5, took
    assert fake.enqueued == []
    posted = posts_for(idle_sim, scheduled)
    if target == "get":
        assert posted == []  # never POSTs without a fresh document
    elif rule["kind"] != "hang":
        assert posted and all(p["status"] == rule.get("status", 429) for p in posted)


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_handler_never_waits_for_the_slow_first_call(
    idle_sim: RunningSimulator, scheduled: str
) -> None:
    """A brand-new client, IMDS holding its first answer for 20 s: the command uses the normal
    read timeout (10 s), re-reads, and approves; it never waits the poller's 125 s."""
    idle_sim.set_faults(first_call_delay=20)
    fake = RecordingForwarder()
    handler = CommandHandler(fake, ImdsClient(idle_sim.base_url))  # production defaults
    outcome, took = handle(handler, scheduled)
    assert outcome.action == "complete", outcome
    assert took < 15, took
    assert [p["status"] for p in posts_for(idle_sim, scheduled)] == [200]


def test_the_command_budget_fits_inside_the_approvals_lock() -> None:
    """The production bound against the deployed lock (see forwarder/approvals/receiver.py)."""
    from sebridge.forwarder.approvals.receiver import (
        ABANDON_PAUSE_MAX,
        RECEIVE_WAIT,
        RECEIVER_SOCKET_TIMEOUT,
        SESSION_RENEW_EVERY,
    )
    from sebridge.forwarder.imds.client import FIRST_CALL_READ_TIMEOUT, READ_TIMEOUT

    config = Path(__file__).resolve().parents[2] / "infra" / "servicebus-emulator" / "Config.json"
    (namespace,) = json.loads(config.read_text())["UserConfig"]["Namespaces"]
    (queue,) = [q for q in namespace["Queues"] if q["Name"] == "approvals"]
    lock = parse_duration(queue["Properties"]["LockDuration"])
    assert COMMAND_IMDS_BUDGET <= 30
    # The oldest the session lock can be: at a settlement, after the pause past an abandon, and
    # at the end of an idle receive (its wait, overrun by one socket read).
    at_settlement = SESSION_RENEW_EVERY + COMMAND_IMDS_BUDGET + CONNECT_TIMEOUT
    after_pause = SESSION_RENEW_EVERY + ABANDON_PAUSE_MAX
    after_receive = SESSION_RENEW_EVERY + RECEIVE_WAIT + RECEIVER_SOCKET_TIMEOUT
    assert max(at_settlement, after_pause, after_receive) < lock - 10, lock
    assert READ_TIMEOUT < COMMAND_IMDS_BUDGET < FIRST_CALL_READ_TIMEOUT
