"""No message leaves without the VM's identity, even when instance metadata answers 200 with a
name only (review round four, item 3).

The review's stub answered ``{"compute": {"name": "vm1", "vmId": "", "resourceId": ""}}``:
the forwarder took the name as the identity and the Scheduled went out with an empty vmId and
resource id, which the workflows' scope check refuses (the notice lost, nothing logged). Now
such an answer is no identity: the transition waits in the outbox, the lookup is retried with
backoff, the condition is logged at ERROR once (then a periodic reminder) and the status says
the identity is unknown; once instance metadata answers in full, the transition goes out with
it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.processes import forwarder
from sebridge.contract.events import Observer
from sebridge.forwarder.observability.health import ConditionLog
from sebridge.forwarder.service import OBSERVER_RETRY_SECONDS
from sebridge.forwarder.state import ForwarderState, StateStore, is_identity
from tests.support.imds_stub import ImdsStub
from tests.support.waiting import wait_until

FULL = {
    "name": "vm1",
    "vmId": "0f0f0f0f-1111-2222-3333-444455556666",
    "resourceId": "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/"
    "virtualMachines/vm1",
    "resourceGroupName": "rg",
    "subscriptionId": "sub",
}
NAME_ONLY = {
    "empty": {"name": "vm1", "vmId": "", "resourceId": ""},
    "missing": {"name": "vm1"},
    "no-resource-id": {"name": "vm1", "vmId": FULL["vmId"], "resourceId": " "},
}


@pytest.fixture
def imds() -> Iterator[ImdsStub]:
    with ImdsStub() as stub:
        stub.instance_status = 200
        yield stub


def reboot() -> dict[str, Any]:
    return {
        "EventId": str(uuid.uuid4()),
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm1"],
        "EventStatus": "Scheduled",
        "NotBefore": (datetime.now(UTC) + timedelta(minutes=10)).strftime(
            "%a, %d %b %Y %H:%M:%S GMT"
        ),
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def instance_lookups(imds: ImdsStub) -> int:
    return sum(1 for r in imds.requests if r.path.startswith("/metadata/instance"))


@pytest.mark.slow
@pytest.mark.timeout(150)  # the backoff may draw up to 60 s before the lookup that succeeds
@pytest.mark.parametrize("compute", list(NAME_ONLY.values()), ids=list(NAME_ONLY))
def test_an_answer_with_a_name_only_is_no_identity(
    imds: ImdsStub, tmp_path: Path, compute: dict[str, Any]
) -> None:
    imds.instance_compute = dict(compute)
    event = reboot()
    imds.set_events([event])
    state = tmp_path / "state"
    with forwarder(imds.url, state, "--log-format", "json") as fw:
        # Retried with backoff (1 s, then 2 s): three lookups take about 3 s.
        wait_until(lambda: instance_lookups(imds) >= 3 or not fw.alive, 30, "lookups retried")
        wait_until(
            lambda: (
                (state / "status.json").exists()
                and json.loads((state / "status.json").read_text()).get("polls", 0) >= 3
            ),
            30,
            "polls written to the status file",
        )
        assert fw.alive, fw.stderr_text()[-3000:]
        sent = [m for m in fw.json_lines() if m.get("subject") not in (None, "Heartbeat")]
        assert sent == [], f"sent without the VM's identity: {sent}"
        status = json.loads((state / "status.json").read_text())
        assert status["identityUnknownSince"], status
        assert "no vmId or no resource id" in (status["lastError"] or ""), status
        said = [
            line
            for line in (json.loads(text) for text in fw.stderr_text().splitlines() if text)
            if "no vmId or no resource id" in line.get("message", "")
        ]
        assert [line["level"] for line in said if line["level"] != "DEBUG"] == ["ERROR"], said
        imds.instance_compute = dict(FULL)
        # The next lookup comes after the backoff's current delay: by now up to 32 s or the
        # cap, OBSERVER_RETRY_SECONDS (a fixed 30 s wait failed once when it drew more).
        looked_up = instance_lookups(imds)
        wait_until(
            lambda: instance_lookups(imds) > looked_up,
            OBSERVER_RETRY_SECONDS + 5,
            "the next instance metadata lookup",
        )
        assert fw.wait_for(
            lambda _: any(m.get("subject") == "Scheduled" for m in fw.json_lines()), 10
        ), fw.stderr_text()[-3000:]
        (scheduled,) = [m for m in fw.json_lines() if m.get("subject") == "Scheduled"]
    observer = scheduled["body"]["data"]["observer"]
    assert (observer["vmId"], observer["resourceId"]) == (FULL["vmId"], FULL["resourceId"])


def test_a_saved_identity_without_vmid_or_resource_id_is_not_read_back(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    for observer in (
        Observer(vm_name="vm1"),
        Observer(vm_name="vm1", vm_id="", resource_id="/subscriptions/s/x"),
        Observer(vm_name="vm1", vm_id=FULL["vmId"], resource_id=""),
    ):
        store.save(ForwarderState(identity=observer))
        assert store.load().identity is None, observer
    full = Observer(vm_name="vm1", vm_id=FULL["vmId"], resource_id=FULL["resourceId"])
    assert is_identity(full)
    store.save(ForwarderState(identity=full))
    assert store.load().identity == full


def test_a_lasting_error_is_said_again_as_a_reminder(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    said = ConditionLog(logging.getLogger("reminder"), remind_every=900, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, "reminder"):
        assert said.report("no identity", logging.ERROR)
        now[0] = 899
        assert not said.report("no identity", logging.ERROR)
        now[0] = 900
        assert said.report("no identity", logging.ERROR)
        assert not said.report("no identity", logging.ERROR)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["no identity", "no identity (still, for 900 s)"]
