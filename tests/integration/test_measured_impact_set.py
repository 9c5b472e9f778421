"""Measured impact of an event that names a set of VMs reaches the history for every VM (issue 26).

Three real ``sebridge forwarder`` processes, one per VM of an availability set, each against its
own IMDS (tests/support/imds_stub.py) showing the same event that names all three, publish to the
Service Bus emulator with the project's own entities (infra/servicebus-emulator/Config.json: the
topic's duplicate detection keeps one copy of each message id). What the ``history``
subscription delivers is recorded by the history workflow, as its trigger would hand it over. The
topic keeps one Completed for the event (every VM's has the same id), so a measurement that rode
only on the Completed would reach the history for one VM at most.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.processes import ChildProcess, forwarder
from emulators.servicebus.testing import running_emulator
from functions.history.core import History, impact_by_type
from sebridge.contract.events import parse_message
from tests.functions.history_support import MemoryHistoryStore, scope_key
from tests.functions.support import as_verified
from tests.support.bus import receive_all
from tests.support.imds_stub import ImdsStub

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "infra" / "servicebus-emulator" / "Config.json"
VMS = ("web-1", "web-2", "web-3")


def event(event_id: str, status: str) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventType": "Freeze",
        "ResourceType": "VirtualMachine",
        "Resources": list(VMS),
        "EventStatus": status,
        "NotBefore": "",
        "EventSource": "Platform",
        "DurationInSeconds": 9,
    }


@pytest.fixture
def emulator() -> Iterator[Any]:
    with running_emulator(CONFIG) as process:
        yield process


def started_seen(fw: ChildProcess) -> Callable[[object], bool]:
    return lambda _: " Started " in fw.stderr_text()  # its publish line


def test_every_vm_of_a_set_gets_its_measurement_into_the_history(
    emulator: Any, tmp_path: Path
) -> None:
    event_id = str(uuid.uuid4())
    with ExitStack() as stack:
        stubs = [stack.enter_context(ImdsStub()) for _ in VMS]
        for stub in stubs:
            stub.set_events([event(event_id, "Started")])
        forwarders = [
            stack.enter_context(
                forwarder(
                    stub.url,
                    tmp_path / vm,
                    "--vm-name",
                    vm,
                    "--connection-string",
                    emulator.connection_string,
                    dry_run=False,
                ).start()
            )
            for vm, stub in zip(VMS, stubs, strict=True)
        ]
        for fw in forwarders:
            assert fw.wait_for(started_seen(fw), 60), fw.stderr_text()[-3000:]
        for stub in stubs:
            stub.set_events([])  # the freeze is over: each forwarder reports Completed
        # Scheduled is not seen (the event was first seen Started): Started, Completed, and one
        # measurement per VM.
        delivered = receive_all(
            emulator.connection_string, "history", want=2 + len(VMS), timeout=60
        )
        for fw in forwarders:
            assert fw.alive, fw.stderr_text()[-3000:]
    store = MemoryHistoryStore()
    history = History(store, retention=timedelta(days=30))
    now = datetime.now(UTC)
    for message in delivered:
        parsed = parse_message(message["body"], message["message_id"])
        history.record(as_verified(parsed), now)
    found = store.summary(scope_key(event_id))
    assert found is not None and found.summary is not None
    impact = found.summary.to_json()["impact"]
    measured = {row["vm"]: row for row in impact["vms"]}
    assert sorted(measured) == sorted(VMS), delivered
    for row in measured.values():
        assert row["method"] == "freeze-pause"
        assert row["announcedSeconds"] == 9
        assert row["measuredSeconds"] >= 0
    by_type = impact_by_type([found.summary])
    assert by_type["Freeze"]["measured"] == len(VMS)  # every VM's figure counts
    # One Completed whoever won it: the set's other subscribers act once.
    assert [m["subject"] for m in delivered].count("Completed") == 1
