"""`sebridge status` (issue 14, item 3): on a live state directory (the real forwarder running
against the IMDS simulator), on a stopped one with set-aside messages and approvals, on a
damaged one (read only: nothing created, moved or changed), and on none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from emulators.imds.testing import running_simulator
from emulators.processes import forwarder
from sebridge.contract.events import Observer, Transition, event_message
from sebridge.forwarder.delivery.outbox import Outbox
from sebridge.forwarder.observability.health import Health
from sebridge.forwarder.observability.observations import Observations
from sebridge.forwarder.observability.status_cli import collect
from sebridge.forwarder.observability.status_file import StatusWriter
from sebridge.imds import ScheduledEvent
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
IDLE = str(REPO / "benchmarks" / "idle-scenario.json")
pytestmark = pytest.mark.timeout(120)


def status(state_dir: Path, *args: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "sebridge.cli", "status", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.stderr == "" or "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout


def snapshot(directory: Path) -> dict[str, tuple[int, float, bytes]]:
    return {
        p.name: (p.stat().st_size, p.stat().st_mtime, p.read_bytes())
        for p in sorted(directory.iterdir())
    }


def test_live_state_directory_while_the_forwarder_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    event_id = str(uuid.uuid4())
    with running_simulator(IDLE) as sim, forwarder(sim.base_url, state, poll_interval=0.2) as fw:
        wait_until(lambda: (state / "status.json").exists(), 60, "status.json")
        sim.event(
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
        wait_until(
            lambda: event_id in (state / "status.json").read_text(), 30, "the event in status"
        )
        code, out = status(state, "--json")
        assert code == 0, out
        report = json.loads(out)
        assert report["verdict"] == "healthy" and report["reasons"] == []
        assert report["forwarder"]["running"] is True
        assert report["forwarder"]["pid"] == fw.process.pid  # type: ignore[union-attr]
        assert report["forwarder"]["lastPoll"]["result"] == "ok"
        assert report["forwarder"]["lastSuccessfulSend"] is not None
        assert report["outbox"]["depth"] == 0
        [event] = [e for e in report["events"] if e["eventId"] == event_id]
        assert event["present"] and event["status"] == "Scheduled"
        assert event["lastTransition"] == "Scheduled"
        code, text = status(state)
        assert code == 0 and text.startswith("HEALTHY") and event_id in text
        # The forwarder goes on undisturbed: the event's end is still reported.
        sim.event("remove", eventId=event_id)
        assert fw.wait_for(lambda lines: any(":Cancelled:1" in x.text for x in lines), 30)
    # Stopped: its pid is gone, so degraded (exit 1), and the last status is still readable.
    code, out = status(state, "--json")
    report = json.loads(out)
    assert code == 1 and report["forwarder"]["running"] is False
    assert any("not running" in r for r in report["reasons"])
    [event] = [e for e in report["events"] if e["eventId"] == event_id]
    assert event == {
        "eventId": event_id,
        "present": False,
        "lastTransition": "Cancelled",
        "lastTransitionAt": event["lastTransitionAt"],
    }


def _envelope(subject: Transition, event_id: str) -> Any:
    event = ScheduledEvent(event_id=event_id, event_type="Reboot", status="Scheduled")
    return event_message(subject, event, Observer(vm_name="vm1"), 1, datetime.now(UTC))


def test_set_aside_messages_and_approvals_are_listed_with_their_reasons(tmp_path: Path) -> None:
    event_id = str(uuid.uuid4())
    outbox = Outbox(tmp_path)
    outbox.put([_envelope(Transition.SCHEDULED, event_id), _envelope(Transition.STARTED, event_id)])
    [(seq, _), *_] = outbox.peek(1)
    outbox.set_aside(seq, "larger than the entity allows (300000 bytes)")
    observations = Observations()
    observations.polled(
        Health(last_successful_poll=datetime.now(UTC), polls=1, outbox_depth=1, set_aside=1)
    )
    observations.command_settled(f"approve:{event_id.upper()}", "complete", "")
    observations.command_settled("approve:../../etc", "dead-letter", "InvalidCommand")
    StatusWriter(observations, tmp_path).write()
    code, out = status(tmp_path, "--json")
    outbox.close()
    report = json.loads(out)
    assert code == 0, report  # set-aside messages are reported, not a failure
    assert report["outbox"]["depth"] == 1 and report["outbox"]["setAsideCount"] == 1
    [aside] = report["outbox"]["setAside"]
    assert aside["reason"] == "larger than the entity allows (300000 bytes)"
    assert aside["messageId"].startswith(event_id)
    assert [(a["eventId"], a["outcome"]) for a in report["approvals"]] == [
        (event_id, "complete"),
        (None, "dead-letter"),  # a name that is not an EventId is never echoed
    ]
    code, text = status(tmp_path)
    assert "set aside" in text and "larger than the entity allows" in text


def test_damaged_state_directory_is_reported_read_only(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"version": 1, "events": [')
    (tmp_path / "outbox.sqlite3").write_bytes(b"this is not a database" * 100)
    (tmp_path / "status.json").write_bytes(b"\xff\xfe garbage")
    os.chmod(tmp_path, 0o500)  # read-only, as for an operator who is not the service user
    try:
        before = snapshot(tmp_path)
        code, out = status(tmp_path, "--json")
        after = snapshot(tmp_path)
    finally:
        os.chmod(tmp_path, 0o700)
    assert before == after  # nothing created, moved or changed
    report = json.loads(out)
    assert code == 1 and report["verdict"] == "degraded"
    reasons = " | ".join(report["reasons"])
    assert "state.json unreadable" in reasons
    assert "outbox.sqlite3 unreadable" in reasons
    assert "status.json unreadable" in reasons
    code, text = status(tmp_path)
    assert code == 1 and text.startswith("DEGRADED")


def test_a_live_database_is_read_without_creating_or_blocking(tmp_path: Path) -> None:
    """The writer holds the WAL open with a write transaction in progress: status reads the
    last committed rows at once."""
    outbox = Outbox(tmp_path)
    outbox.put([_envelope(Transition.SCHEDULED, str(uuid.uuid4()))])
    outbox._db.execute("BEGIN IMMEDIATE")
    outbox._db.execute("DELETE FROM outbox")
    try:
        report = collect(tmp_path)
        assert report.outbox_depth == 1
    finally:
        outbox._db.execute("ROLLBACK")
        outbox.close()


def test_no_state_is_exit_2(tmp_path: Path) -> None:
    code, out = status(tmp_path / "missing")
    assert code == 2 and out.startswith("NO-STATE")
    (tmp_path / "empty").mkdir()
    code, out = status(tmp_path / "empty", "--json")
    assert code == 2 and json.loads(out)["verdict"] == "no-state"
    assert list((tmp_path / "empty").iterdir()) == []
