"""Issue 22 item 13: a message never leaves the VM without the VM's identity.

The real forwarder publishes to the Service Bus emulator while the IMDS simulator fails its
instance metadata for the first lookups (500s, then a reset). Before, the forwarder fell back to
the host name at once and published transitions with an empty vmId and resource id for 60 s
before it looked again (27-29 of 90 messages in one run), which the functions' scope check
refuses as security events. Now the transitions wait in the outbox, no Heartbeat is built, the
lookup is retried with backoff from 1 s, and everything goes out once it succeeds, with the
VM's identity and each transition's own message id.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators.imds.testing import expected_transitions, running_simulator
from emulators.processes import forwarder
from emulators.servicebus.testing import running_emulator
from sebridge.contract.events import parse_message
from tests.support.bus import receive_all

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "infra" / "servicebus-emulator" / "Config.json"


@pytest.fixture
def emulator() -> Iterator[Any]:
    with running_emulator(CONFIG) as process:
        yield process


@pytest.mark.timeout(180)
def test_no_message_leaves_without_the_vms_identity_and_none_is_lost(
    emulator: Any, tmp_path: Path
) -> None:
    lifecycle = [e["transition"] for e in expected_transitions("user-reboot")]
    failing = [
        {"kind": "5xx", "target": "instance", "count": 3, "status": 503},
        {"kind": "reset", "target": "instance", "count": 1},
    ]
    with running_simulator("user-reboot", speed=8, extra_args=["--start-on-first-poll"]) as sim:
        sim.set_faults(*failing)
        fw = forwarder(
            sim.base_url,
            tmp_path,
            "--connection-string",
            emulator.connection_string,
            "--heartbeat-interval",
            "1",
            dry_run=False,
        )
        with fw:
            lb = receive_all(
                emulator.connection_string, "lb-pools", want=len(lifecycle), timeout=90
            )
            audit = receive_all(emulator.connection_string, "audit", want=len(lifecycle) + 1)
            log = fw.stderr_text()
            assert fw.alive, log[-3000:]
        fired = sum(rule["fired"] for rule in sim._call("GET", "/_sim/faults")["rules"])
    for message in [*lb, *audit]:
        parsed = parse_message(message["body"])
        observer = parsed.observer
        assert observer.vm_id and observer.resource_id, message
        assert observer.vm_name == message["properties"]["vmName"] == "vmss_vm1"
        assert parsed.source == observer.resource_id
    assert [m["subject"] for m in lb] == lifecycle, log[-3000:]  # every one, in order
    for message in lb:  # each with its own id
        parsed = parse_message(message["body"])
        assert message["message_id"] == f"{parsed.event_id}:{message['subject']}:1"
    assert any(m["subject"] == "Heartbeat" for m in audit)
    assert fired == 4, log[-3000:]  # the lookup met four faults before it succeeded
    assert "transitions wait in the outbox" in log
