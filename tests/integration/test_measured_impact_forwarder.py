"""Measured impact (issue 26 part B) from the real `sebridge forwarder` process, over loopback.

IMDS is tests/support/imds_stub.py (the document the test sets); the forwarder runs with
``--dry-run`` and prints the messages it would send. The faults are the real ones as far as a
process can tell: SIGSTOP/SIGCONT is a freeze (the process sees nothing, then a jump on both
clocks), SIGKILL and a new process on the same state directory is a reboot without a clean stop.
The measurement is checked against bounds the test takes outside the process (a lower bound from
how long the fault lasted, an upper bound from how long the whole run took), never against a
speed target.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators.processes import ChildProcess, forwarder
from tests.support.imds_stub import ImdsStub
from tests.support.waiting import wait_until

VM = "stub-vm"
PAUSE = 3.0  # seconds the fault lasts (the fault itself, not a wait for a condition)


def event(event_id: str, event_type: str, status: str) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": [VM],
        "EventStatus": status,
        "NotBefore": "",
        "EventSource": "Platform",
        "DurationInSeconds": 9 if event_type == "Freeze" else -1,
    }


def transition(fw: ChildProcess, event_id: str, subject: str) -> dict[str, Any] | None:
    for message in fw.json_lines():
        if message.get("subject") == subject and message.get("session_id") == event_id:
            return message
    return None


def wait_for(fw: ChildProcess, event_id: str, subject: str, timeout: float = 60) -> dict[str, Any]:
    assert fw.wait_for(lambda _: transition(fw, event_id, subject) is not None, timeout), (
        f"no {subject} for {event_id} in {timeout} s:\n{fw.stderr_text()[-3000:]}"
    )
    found = transition(fw, event_id, subject)
    assert found is not None
    return found


def polls_after(imds: ImdsStub, moment: float, count: int) -> bool:
    return sum(1 for at in imds.gets() if at > moment) >= count


@pytest.fixture
def imds() -> Iterator[ImdsStub]:
    with ImdsStub() as stub:
        yield stub


def start(imds: ImdsStub, state: Path) -> ChildProcess:
    return forwarder(imds.url, state, "--vm-name", VM, poll_interval=0.2).start()


def test_a_sigstopped_forwarder_measures_the_pause_as_a_freeze(
    imds: ImdsStub, tmp_path: Path
) -> None:
    event_id = str(uuid.uuid4())
    imds.set_events([event(event_id, "Freeze", "Started")])
    began = time.monotonic()
    with start(imds, tmp_path / "state") as fw:
        wait_for(fw, event_id, "Started")
        assert fw.process is not None
        fw.process.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        time.sleep(PAUSE)  # the freeze itself
        fw.process.send_signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        wait_until(lambda: polls_after(imds, resumed_at, 3), 30, "polls after SIGCONT")
        imds.set_events([])
        completed = wait_for(fw, event_id, "Completed")
        ended = time.monotonic()
    impact = completed["body"]["data"]["impact"]
    assert impact["method"] == "freeze-pause"
    paused = resumed_at - stopped_at
    # At least the pause less one poll interval (a poll may have been due just before it);
    # at most the whole run.
    assert paused - 0.2 - 0.1 <= impact["measuredSeconds"] <= ended - began


def test_a_forwarder_killed_across_a_started_reboot_measures_the_gap(
    imds: ImdsStub, tmp_path: Path
) -> None:
    event_id = str(uuid.uuid4())
    state = tmp_path / "state"
    imds.set_events([event(event_id, "Reboot", "Started")])
    began = time.monotonic()
    first = start(imds, state)
    try:
        wait_for(first, event_id, "Started")
        # Watched long enough for a periodic save after the Started one (every 5 s at most).
        seen = time.monotonic()
        wait_until(lambda: polls_after(imds, seen, 30), 60, "30 polls while Started")
        first.kill()  # no clean stop: the last poll on disk is at most 5 s old
        killed_at = time.monotonic()
    finally:
        first.close()
    time.sleep(PAUSE)  # the reboot itself
    imds.set_events([])  # the event ended while the VM was down
    restarted_at = time.monotonic()
    with start(imds, state) as second:
        completed = wait_for(second, event_id, "Completed")
        ended = time.monotonic()
    impact = completed["body"]["data"]["impact"]
    assert impact["method"] == "reboot-gap"
    assert restarted_at - killed_at <= impact["measuredSeconds"] <= ended - began


def test_an_event_of_another_vm_carries_no_measurement(imds: ImdsStub, tmp_path: Path) -> None:
    event_id = str(uuid.uuid4())
    other = event(event_id, "Freeze", "Started") | {"Resources": ["another-vm"]}
    imds.set_events([other])
    with start(imds, tmp_path / "state") as fw:
        wait_for(fw, event_id, "Started")
        imds.set_events([])
        completed = wait_for(fw, event_id, "Completed")
    assert "impact" not in completed["body"]["data"]
