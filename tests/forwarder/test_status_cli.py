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
from tests.support.imds_stub import ImdsStub
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


def _stub_event(event_id: str) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm1"],
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def _status_of_run(state: Path, pid: int) -> bool:
    path = state / "status.json"
    return path.exists() and json.loads(path.read_text() or "{}").get("pid") == pid


def test_the_last_transitions_survive_a_restart(tmp_path: Path) -> None:
    """Issue 22e, item 2a: the last transitions were kept only in the running forwarder's
    memory (status.json): after a restart, an event that ended before it was not listed and no
    transition of the earlier run was shown. Now they are saved with the state (state.json)."""
    state = tmp_path / "state"
    gone, kept = str(uuid.uuid4()), str(uuid.uuid4())
    with ImdsStub() as imds:
        imds.set_events([_stub_event(gone), _stub_event(kept)])
        with forwarder(imds.url, state, poll_interval=0.2) as fw:
            assert fw.wait_for(lambda lines: any(":Scheduled:1" in x.text for x in lines), 30)
            imds.set_events([_stub_event(kept)])
            assert fw.wait_for(lambda lines: any(":Cancelled:1" in x.text for x in lines), 30)
        with forwarder(imds.url, state, poll_interval=0.2) as fw:
            assert fw.process is not None
            pid = fw.process.pid
            wait_until(lambda: _status_of_run(state, pid), 60, "the new run's status.json")
            code, out = status(state, "--json")
            _, text = status(state)
    assert code == 0, out
    report = json.loads(out)
    assert report["forwarder"]["pid"] == pid
    by_id = {e["eventId"]: e for e in report["events"]}
    assert by_id[gone]["present"] is False and by_id[gone]["lastTransition"] == "Cancelled"
    assert by_id[kept]["present"] is True and by_id[kept]["lastTransition"] == "Scheduled"
    assert sorted((t["eventId"], t["transition"]) for t in report["lastTransitions"]) == sorted(
        [(gone, "Scheduled"), (kept, "Scheduled"), (gone, "Cancelled")]
    )
    assert report["lastTransitions"][0] == {
        "eventId": gone,
        "transition": "Cancelled",
        "messageId": f"{gone}:Cancelled:1",
        "at": report["lastTransitions"][0]["at"],
    }
    assert f"Cancelled  {gone}" in text


def test_an_event_with_a_hashed_id_is_listed_once(tmp_path: Path) -> None:
    """Issue 22e, item 2b: an EventId that is not a plain id (too long, odd characters) is
    carried as a digest in session ids, so status.json names it by the digest: it was listed
    twice, once present (by its EventId) and once gone (by the digest)."""
    state = tmp_path / "state"
    odd = "Maintenance Event #1 " + "x" * 80
    with ImdsStub() as imds:
        imds.set_events([_stub_event(odd)])
        with forwarder(imds.url, state, poll_interval=0.2) as fw:
            assert fw.wait_for(lambda lines: any(":Scheduled:1" in x.text for x in lines), 30)
            wait_until(
                lambda: (
                    "Scheduled" in (state / "status.json").read_text()
                    if (state / "status.json").exists()
                    else False
                ),
                30,
                "the transition in status.json",
            )
            code, out = status(state, "--json")
    assert code == 0, out
    events = json.loads(out)["events"]
    assert len(events) == 1, events
    assert events[0]["eventId"] == odd and events[0]["present"] is True
    assert events[0]["lastTransition"] == "Scheduled"
