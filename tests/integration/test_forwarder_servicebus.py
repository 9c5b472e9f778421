"""The real forwarder publishing to the local Service Bus emulator, read back with the real SDK.

Entities are the project's own (infra/servicebus-emulator/Config.json): the topic's SQL filters
and sessions decide what each subscription sees.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from emulators.imds.testing import expected_transitions, running_simulator
from emulators.processes import ChildProcess, forwarder
from emulators.servicebus.testing import running_emulator
from sebridge import servicebus
from sebridge.contract.commands import approve_command
from sebridge.contract.events import parse_message
from sebridge.forwarder.local.journal import Journal
from tests.forwarder.local_support import root_dir, script, write_hooks
from tests.support.bus import receive_all
from tests.support.root import requires_root
from tests.support.simulator import VM, add_event

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "infra" / "servicebus-emulator" / "Config.json"
TOPIC = "scheduled-events"
IDLE = str(REPO / "benchmarks" / "idle-scenario.json")


@pytest.fixture
def emulator() -> Iterator[Any]:
    with running_emulator(CONFIG) as process:
        yield process


def forwarder_to(emulator: Any, sim_url: str, state: Path, *extra: str) -> ChildProcess:
    return forwarder(
        sim_url, state, "--connection-string", emulator.connection_string, *extra, dry_run=False
    )


@pytest.mark.timeout(120)
def test_subscriptions_see_what_their_filters_select(emulator: Any, tmp_path: Path) -> None:
    lifecycle = [e["transition"] for e in expected_transitions("user-reboot")]
    with (
        running_simulator("user-reboot", speed=8, extra_args=["--start-on-first-poll"]) as sim,
        forwarder_to(emulator, sim.base_url, tmp_path, "--heartbeat-interval", "600") as fw,
    ):
        lb = receive_all(emulator.connection_string, "lb-pools", want=len(lifecycle), timeout=30)
        assert fw.alive, fw.stderr_text()[-3000:]
        # ...and the Heartbeat, and the VM's Measured of the reboot it watched (issue 26)
        audit = receive_all(emulator.connection_string, "audit", want=len(lifecycle) + 2)
        gate = receive_all(emulator.connection_string, "approval-gate", want=2)
        teams = receive_all(emulator.connection_string, "teams", want=len(lifecycle))
    assert [m["subject"] for m in lb] == lifecycle  # one session, in order
    assert len({m["session_id"] for m in lb}) == 1
    assert sorted(m["subject"] for m in audit) == sorted([*lifecycle, "Heartbeat", "Measured"])
    assert sorted(m["subject"] for m in gate) == ["Heartbeat", "Scheduled"]
    assert [m["subject"] for m in teams] == lifecycle
    for message in lb:
        parsed = parse_message(message["body"])
        assert parsed.transition.value == message["subject"] == message["properties"]["transition"]
        assert message["properties"]["eventType"] == "Reboot"
        assert message["properties"]["schemaVersion"] == 1
        assert message["session_id"] == parsed.event_id
        assert message["message_id"] == f"{parsed.event_id}:{message['subject']}:1"
    heartbeat = next(m for m in audit if m["subject"] == "Heartbeat")
    assert heartbeat["session_id"] == heartbeat["properties"]["vmName"]


@pytest.mark.timeout(120)
def test_two_forwarders_seeing_one_event_publish_it_once(emulator: Any, tmp_path: Path) -> None:
    lifecycle = [e["transition"] for e in expected_transitions("user-reboot")]
    with running_simulator("user-reboot", speed=8, extra_args=["--start-on-first-poll"]) as sim:
        first = forwarder_to(emulator, sim.base_url, tmp_path / "a", "--vm-name", "vm-a")
        second = forwarder_to(emulator, sim.base_url, tmp_path / "b", "--vm-name", "vm-b")
        with first, second:
            lb = receive_all(
                emulator.connection_string, "lb-pools", want=len(lifecycle), timeout=30
            )
            time.sleep(1.0)
            late = receive_all(emulator.connection_string, "lb-pools", want=0, timeout=3)
            published = [
                line
                for fw in (first, second)
                for line in fw.stderr_text().splitlines()
                if " Completed " in line
            ]
    assert [m["subject"] for m in lb] == lifecycle
    assert late == []  # the second forwarder's copies were dropped by duplicate detection
    assert len(published) == 2  # ...although both forwarders did observe and publish them


@pytest.mark.timeout(150)
def test_outbox_drains_in_order_after_the_broker_returns(emulator: Any, tmp_path: Path) -> None:
    with (
        running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim,
        forwarder_to(emulator, sim.base_url, tmp_path) as fw,
    ):
        first = receive_all(emulator.connection_string, "lb-pools", want=1, timeout=30)
        assert [m["subject"] for m in first] == ["Scheduled"]
        emulator.stop()
        sim.advance(16)  # Started while the broker is down
        assert fw.wait_for(lambda _: "publish failed" in fw.stderr_text(), 30)
        sim.advance(15)  # ...and Completed
        assert fw.wait_for(lambda _: " Completed " in fw.stderr_text(), 15)
        time.sleep(2)
        emulator.start()
        rest = receive_all(emulator.connection_string, "lb-pools", want=2, timeout=60)
        log = fw.stderr_text()
        assert fw.alive
    assert [m["subject"] for m in rest] == ["Started", "Completed"], log[-3000:]
    assert "Service Bus reachable again" in log


def noop_hooks(tmp_path: Path) -> Path:
    """A hooks file (root-owned) with one hook that does nothing: the local actions run."""
    etc = root_dir(tmp_path)
    command = [script(etc, "noop.sh", "true")]
    return write_hooks(etc, [{"name": "noop", "on": ["Scheduled"], "command": command}])


@requires_root("a hooks file must be root-owned")
def test_a_stop_during_an_idle_receive_keeps_when_the_last_poll_was(
    emulator: Any, tmp_path: Path
) -> None:
    """Hostile review, stop 33: SIGTERM nearly always finds the approvals receiver inside a
    receive that waits up to 20 s, so the stop leaves it behind; main then skipped closing the
    local actions, which is what keeps when the last poll was. A restart measured its gap from
    the last change instead (here 12 s earlier), and a hook ran for Completed while the topic
    got Cancelled. The receiver is parked there: the stop closes the local actions all the
    same."""
    hooks = noop_hooks(tmp_path)
    state = tmp_path / "state"
    with running_simulator(IDLE) as sim:
        fw = forwarder_to(emulator, sim.base_url, state, "--hooks-file", str(hooks)).start()
        try:
            assert fw.wait_for(lambda _: "receiving commands" in fw.stderr_text(), 60), (
                fw.stderr_text()[-3000:]
            )
            time.sleep(12)  # polls of an unchanged document: nothing rewrites the view
            stopped_at = datetime.now(UTC)
            assert fw.stop() == 0
            stderr = fw.stderr_text()
        finally:
            fw.close()
    left = [line for line in stderr.splitlines() if "not waiting longer than" in line]
    assert all("approvals (parked)" in line for line in left), left
    view = Journal(state).load().view
    assert view is not None and view["observedAt"], view
    observed = datetime.fromisoformat(view["observedAt"])
    assert stopped_at - observed < timedelta(seconds=3), (observed, stopped_at, left)


@requires_root("a hooks file must be root-owned")
def test_a_stop_in_the_middle_of_a_command_still_keeps_when_the_last_poll_was(
    emulator: Any, tmp_path: Path
) -> None:
    """Hostile review, stop 33, round two: SIGTERM while a command is handled (IMDS slow to
    take the approve) and the broker unreachable: the abandon blocks, so the receiver is left
    behind in use and the stop rightly keeps the journal open. It must still keep when the last
    poll was: the old code did not, and a restart ran the Completed hook of an event the topic
    reported Cancelled."""
    hooks = noop_hooks(tmp_path)
    state = tmp_path / "state"
    with running_simulator(IDLE) as sim:
        fw = forwarder_to(
            emulator, sim.base_url, state, "--hooks-file", str(hooks), "--log-level", "debug"
        ).start()
        try:
            assert fw.wait_for(lambda _: "receiving commands" in fw.stderr_text(), 60), (
                fw.stderr_text()[-3000:]
            )
            event_id = add_event(sim, not_before_in=600)
            assert fw.wait_for(lambda _: f"Scheduled {event_id}" in fw.stderr_text(), 20)
            time.sleep(10)  # polls of an unchanged document: nothing rewrites the view
            sim.set_faults({"kind": "hang", "seconds": 30, "target": "post"})
            expires = datetime.now(UTC) + timedelta(minutes=5)
            command = approve_command(event_id, "test", "stop mid-command", expires)
            with (
                ServiceBusClient.from_connection_string(emulator.connection_string) as client,
                client.get_queue_sender("approvals") as sender,
            ):
                sender.send_messages(servicebus.command_message(command, VM), timeout=30)
            assert fw.wait_for(lambda _: "received (enqueued" in fw.stderr_text(), 30)
            time.sleep(1)  # the approve POST hangs in IMDS
            os.kill(emulator.pid, signal.SIGSTOP)  # the abandon that follows the stop blocks
            try:
                stopped_at = datetime.now(UTC)
                fw.stop()
                stderr = fw.stderr_text()
            finally:
                os.kill(emulator.pid, signal.SIGCONT)
        finally:
            fw.close()
    left = [line for line in stderr.splitlines() if "not waiting longer than" in line]
    view = Journal(state).load().view
    assert view is not None and view["observedAt"], view
    observed = datetime.fromisoformat(view["observedAt"])
    assert stopped_at - observed < timedelta(seconds=3), (observed, stopped_at, left)
