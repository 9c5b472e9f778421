"""The real `sebridge forwarder` process against the real IMDS simulator, over HTTP.

Every packaged scenario must yield exactly its expected transitions and message ids; a kill -9
and restart with the same state directory must still report what vanished meanwhile; IMDS
faults must be waited out without losing or duplicating anything.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from emulators.imds.testing import (
    expected_transitions,
    running_simulator,
    scenario_duration,
    scenario_names,
)
from emulators.processes import ChildProcess, forwarder
from sebridge.contract.events import Transition, message_id_for, parse_message

SPEED = 8.0


def messages_of(fw: ChildProcess) -> list[dict[str, Any]]:
    return [m for m in fw.json_lines() if m.get("subject") != "Heartbeat"]


def wait_for_messages(fw: ChildProcess, count: int, timeout: float) -> list[dict[str, Any]]:
    fw.wait_for(lambda _: len(messages_of(fw)) >= count, timeout)
    return messages_of(fw)


def wait_for_subject(fw: ChildProcess, subject: str, timeout: float) -> None:
    assert fw.wait_for(lambda _: any(m["subject"] == subject for m in messages_of(fw)), timeout), (
        f"no {subject} within {timeout} s; stderr:\n{fw.stderr_text()[-3000:]}"
    )


def expected_message_id(message: dict[str, Any]) -> str:
    transition = Transition(message["subject"])
    changes = message["body"]["data"].get("changes")
    return message_id_for(message["session_id"], transition, changes)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("scenario", scenario_names())
def test_every_scenario_yields_exactly_its_transitions(scenario: str, tmp_path: Path) -> None:
    expected = [(e["transition"], e["eventId"]) for e in expected_transitions(scenario)]
    budget = scenario_duration(scenario, SPEED) + 20
    with (
        running_simulator(scenario, speed=SPEED, extra_args=["--start-on-first-poll"]) as sim,
        forwarder(sim.base_url, tmp_path) as fw,
    ):
        wait_for_messages(fw, len(expected), budget)
        time.sleep(1.5)  # anything extra would show up now
        messages = messages_of(fw)
    got = [(m["subject"], m["session_id"]) for m in messages]
    assert got == expected, fw.stderr_text()[-3000:]
    for message in messages:
        assert message["message_id"] == expected_message_id(message)
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
def test_restart_reports_what_vanished_while_down(
    scenario: str, seen: str, advance_to_gone: float, then: str, tmp_path: Path
) -> None:
    with running_simulator(scenario, speed=1.0, extra_args=["--start-on-first-poll"]) as sim:
        with forwarder(sim.base_url, tmp_path) as first:
            if seen == "Started":
                wait_for_subject(first, "Scheduled", 15)
                sim.advance(16)
            wait_for_subject(first, seen, 15)
            time.sleep(0.5)  # let the outbox row be removed after printing
            first.kill()  # kill -9: no chance to flush anything
            before = [m["message_id"] for m in messages_of(first)]
        sim.advance(advance_to_gone)
        assert sim.document()["Events"] == []  # the event is gone while the forwarder is down
        with forwarder(sim.base_url, tmp_path) as second:
            wait_for_subject(second, then, 15)
            time.sleep(1.0)
            after = messages_of(second)
    assert [m["subject"] for m in after] == [then]
    assert after[0]["message_id"].endswith(f":{then}")
    assert after[0]["message_id"].rsplit(":", 1)[0] == before[0].rsplit(":", 1)[0]


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
        ("reset:count=2", 2),
        ("hang:seconds=3,count=1", 0),
    ],
)
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
