"""Generated invalid approval commands sent through the emulator to a running forwarder: each is
dead-lettered with the reason the contract gives it, none causes an IMDS POST, none stops it.

Hypothesis generates the bodies (fixed seed, so a CI run is repeatable); they are sent in one
batch and read back from the dead-letter queue.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from hypothesis import HealthCheck, given, seed, settings

from emulators.imds.testing import running_simulator
from emulators.processes import forwarder
from emulators.servicebus.testing import running_emulator
from sebridge.contract import commands
from tests.reliability.test_generated_input import command_bodies

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

REPO = Path(__file__).resolve().parents[2]
VM = "vmss_vm1"
COMMANDS = 600


def generated_invalid_commands(count: int) -> list[tuple[bytes, str]]:
    """``count`` distinct invalid bodies with the reason the contract gives each."""
    found: dict[bytes, str] = {}

    @seed(20261122)
    @settings(
        max_examples=count * 4,  # fixed: data for the test, not a test's examples
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(command_bodies)
    def collect(body: bytes) -> None:
        if len(found) >= count:
            return
        try:
            commands.parse_command(body, datetime.now(UTC))
        except commands.CommandError as exc:
            found.setdefault(body, exc.reason)

    collect()
    return list(found.items())


def drain_dead_letters(connection_string: str, want: int, timeout: float) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(
            "approvals", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=2
        ) as receiver,
    ):
        while len(out) < want and time.monotonic() < deadline:
            batch = receiver.receive_messages(max_message_count=100, max_wait_time=2)
            for message in batch:
                receiver.complete_message(message)
            out.extend(batch)
    return out


@pytest.mark.timeout(300)
def test_generated_invalid_commands_are_dead_lettered_and_never_posted(tmp_path: Path) -> None:
    cases = generated_invalid_commands(COMMANDS)
    assert len(cases) >= COMMANDS * 0.9
    reasons = {f"gen-{i}": reason for i, (_, reason) in enumerate(cases)}
    config = REPO / "infra" / "servicebus-emulator" / "Config.json"
    with (
        running_emulator(config) as bus,
        running_simulator("user-reboot", speed=0.1) as sim,
        forwarder(
            sim.base_url, tmp_path, "--connection-string", bus.connection_string, dry_run=False
        ) as fw,
    ):
        assert fw.wait_for(lambda _: "receiving commands" in fw.stderr_text(), 30)
        with (
            ServiceBusClient.from_connection_string(bus.connection_string) as client,
            client.get_queue_sender("approvals") as sender,
        ):
            batch = [
                ServiceBusMessage(body, message_id=f"gen-{i}", session_id=VM)
                for i, (body, _) in enumerate(cases)
            ]
            for start in range(0, len(batch), 100):
                sender.send_messages(batch[start : start + 100], timeout=30)
        dead = drain_dead_letters(bus.connection_string, len(cases), timeout=180)
        assert fw.alive
        posts = sim.posts()
    got = {m.message_id: m.dead_letter_reason for m in dead}
    assert got == reasons
    assert all(m.dead_letter_error_description for m in dead)
    assert posts == []
    assert json.dumps(sorted(set(reasons.values())))  # several classes were exercised
    assert len(set(reasons.values())) >= 5
