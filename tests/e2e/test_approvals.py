"""The return path end to end: command on the approvals queue -> forwarder -> IMDS POST.

Real processes over loopback: the IMDS simulator, the Service Bus emulator (project config)
and `sebridge forwarder`; commands are sent with the real SDK and `sebridge approve`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from emulators.imds.testing import running_simulator
from emulators.processes import ChildProcess, forwarder
from emulators.servicebus.testing import running_emulator
from tests.support.bus import as_dict, receive_all
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "infra" / "servicebus-emulator" / "Config.json"
EVENT_ID = "614cb437-89a4-491a-a160-bf8dc81fe15a"  # user-reboot's event
VM = "vmss_vm1"  # the simulator's default compute.name, listed in the event's Resources


@pytest.fixture
def emulator() -> Iterator[Any]:
    with running_emulator(CONFIG) as process:
        yield process


def command(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schemaVersion": 1,
        "command": "approve",
        "eventId": EVENT_ID,
        "requestedBy": "e2e-test",
        "reason": "testing",
        "expiresAt": (datetime.now(UTC) + timedelta(minutes=10)).isoformat(),
    }
    body.update(overrides)
    return body


def send(
    emulator: Any, body: dict[str, Any] | bytes, *, session: str = VM, message_id: str | None = None
) -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    message_id = message_id or f"test:{time.monotonic_ns()}"
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_sender("approvals") as sender,
    ):
        sender.send_messages(
            ServiceBusMessage(raw, message_id=message_id, session_id=session), timeout=10
        )
    return message_id


def dead_letters(emulator: Any, want: int, timeout: float = 20) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_receiver(
            "approvals", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=1
        ) as receiver:
            while len(out) < want and time.monotonic() < deadline:
                for message in receiver.receive_messages(max_message_count=50, max_wait_time=1):
                    out.append(as_dict(message))
                    receiver.complete_message(message)
    return out


def running_forwarder(emulator: Any, sim: Any, state: Path, *extra: str) -> ChildProcess:
    return forwarder(
        sim.base_url,
        state,
        "--connection-string",
        emulator.connection_string,
        *extra,
        dry_run=False,
    )


@pytest.mark.timeout(120)
def test_valid_approval_is_posted_once_and_the_lifecycle_goes_on(
    emulator: Any, tmp_path: Path
) -> None:
    with running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim:
        with running_forwarder(emulator, sim, tmp_path) as fw:
            wait_until(lambda: "receiving commands" in fw.stderr_text(), 30, "the receiver")
            wait_until(lambda: sim.state()["document"]["Events"], 10, "the scenario to start")
            send(emulator, command(eventId=EVENT_ID.upper()), message_id=f"approve:{EVENT_ID}")
            wait_until(lambda: sim.posts(), 20, "the IMDS POST")
            # The forwarder's next poll sees it Started; only then may it go away (moved on
            # before that poll, as on a loaded machine, it would vanish unseen while Scheduled).
            wait_until(lambda: f"Started {EVENT_ID}" in fw.stderr_text(), 30, "Started seen")
            sim.advance(11)  # the approved event has been Started for 10 s: it goes away
            audit = receive_all(emulator.connection_string, "audit", want=4, timeout=30)
            log = fw.stderr_text()
        (post,) = sim.posts()
    assert post["status"] == 200
    assert json.loads(post["body"]) == {"StartRequests": [{"EventId": EVENT_ID}]}
    assert post["headers"].get("Metadata") == "true"
    subjects = [m["subject"] for m in audit]
    # The forwarder's Measured report (issue 26), when it measured, follows the Completed.
    assert subjects in (
        ["Scheduled", "Approved", "Started", "Completed"],
        ["Scheduled", "Approved", "Started", "Completed", "Measured"],
    ), log[-3000:]
    approved = json.loads(audit[1]["body"])["data"]["approval"]
    assert approved == {"requestedBy": "e2e-test", "reason": "testing"}


@pytest.mark.timeout(150)
def test_invalid_commands_are_dead_lettered_with_their_reason_and_never_posted(
    emulator: Any, tmp_path: Path
) -> None:
    cases: list[tuple[dict[str, Any] | bytes, str]] = [
        (b"{not json", "InvalidJson"),
        (command(command="reboot"), "UnknownCommand"),
        (command(schemaVersion=2), "UnsupportedSchemaVersion"),
        ({k: v for k, v in command().items() if k != "requestedBy"}, "InvalidField"),
        (command(eventId="not-a-guid"), "InvalidEventId"),
        (command(expiresAt="2020-01-01T00:00:00Z"), "CommandExpired"),
        (command(eventId="00000000-0000-4000-8000-000000000000"), "EventNotFound"),
    ]
    with running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim:
        with running_forwarder(emulator, sim, tmp_path) as fw:
            wait_until(lambda: "receiving commands" in fw.stderr_text(), 30, "the receiver")
            sent = {send(emulator, body): reason for body, reason in cases}
            dead = dead_letters(emulator, want=len(cases), timeout=40)
            time.sleep(1)
            assert fw.alive
            assert sim.posts() == []
    assert {m["message_id"]: m["dead_letter_reason"] for m in dead} == sent
    assert all(m["dead_letter_error_description"] for m in dead)


@pytest.mark.timeout(120)
def test_require_listed_refuses_an_event_for_other_vms(emulator: Any, tmp_path: Path) -> None:
    with running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim:
        fw = running_forwarder(emulator, sim, tmp_path, "--require-listed", "--vm-name", "web-9")
        with fw:
            wait_until(lambda: "receiving commands" in fw.stderr_text(), 30, "the receiver")
            wait_until(lambda: sim.state()["document"]["Events"], 10, "the scenario to start")
            sent = send(emulator, command(), session="web-9")
            (dead,) = dead_letters(emulator, want=1)
            assert sim.posts() == []
    assert dead["message_id"] == sent
    assert dead["dead_letter_reason"] == "VmNotInResources"


def peek_approvals(emulator: Any, *, session: str | None = None) -> list[Any]:
    """Every message still on the approvals queue in ``session``, or (None) in its dead-letter
    queue: peeked with the SDK, so locked (unsettled) ones count too and nothing is consumed."""
    target: dict[str, Any] = (
        {"session_id": session}
        if session is not None
        else {"sub_queue": ServiceBusSubQueue.DEAD_LETTER}
    )
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver("approvals", max_wait_time=2, **target) as receiver,
    ):
        return list(receiver.peek_messages(max_message_count=100, timeout=10))


@pytest.mark.timeout(120)
def test_duplicate_commands_approve_once_and_complete_both(emulator: Any, tmp_path: Path) -> None:
    with running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim:
        with running_forwarder(emulator, sim, tmp_path) as fw:
            wait_until(lambda: "receiving commands" in fw.stderr_text(), 30, "the receiver")
            wait_until(lambda: sim.state()["document"]["Events"], 10, "the scenario to start")
            # Different message ids, so the broker's duplicate detection does not hide the
            # second one: the forwarder itself must not approve twice.
            send(emulator, command(), message_id="approve-a")
            send(emulator, command(), message_id="approve-b")
            wait_until(
                lambda: "command approve-b for" in fw.stderr_text(), 30, "the second command"
            )
            time.sleep(1)  # its settlement reaches the broker
            log = fw.stderr_text()
        posts = sim.posts()
    # The forwarder has stopped and let go of its session: what is left in it can be peeked.
    left_in_session = peek_approvals(emulator, session=VM)
    dead = [m for m in peek_approvals(emulator) if m.session_id == VM]
    assert [p["status"] for p in posts] == [200]  # exactly one POST reached IMDS
    assert json.loads(posts[0]["body"]) == {"StartRequests": [{"EventId": EVENT_ID}]}
    assert log.count(f"command approve-a: approved {EVENT_ID} (Reboot)") == 1, log[-3000:]
    assert log.count(f"command approve-b for {EVENT_ID}: already approved by this forwarder") == 1
    assert log.count(": approved ") == 1 and "dead-lettered" not in log
    assert left_in_session == [] and dead == []  # both completed: none waits, none dead


@pytest.mark.timeout(150)
def test_command_during_an_imds_outage_lands_after_recovery(emulator: Any, tmp_path: Path) -> None:
    with running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim:
        with running_forwarder(emulator, sim, tmp_path) as fw:
            wait_until(lambda: "receiving commands" in fw.stderr_text(), 30, "the receiver")
            wait_until(lambda: sim.state()["document"]["Events"], 10, "the scenario to start")
            sim.set_faults({"kind": "5xx", "count": 2, "target": "post"})
            send(emulator, command())
            wait_until(lambda: any(p["status"] == 200 for p in sim.posts()), 60, "a good POST")
            time.sleep(1)
            log = fw.stderr_text()
            assert dead_letters(emulator, want=1, timeout=3) == []
        statuses = [p["status"] for p in sim.posts()]
    assert statuses[-1] == 200 and statuses.count(200) == 1
    assert len(statuses) == 3 and all(s >= 500 for s in statuses[:-1])
    assert "approving" in log and "failed" in log


@pytest.mark.timeout(120)
def test_a_command_for_another_vm_is_never_seen(emulator: Any, tmp_path: Path) -> None:
    with running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim:
        with running_forwarder(emulator, sim, tmp_path) as fw:
            wait_until(lambda: "receiving commands" in fw.stderr_text(), 30, "the receiver")
            sent = send(emulator, command(), session="some-other-vm")
            time.sleep(4)
            assert sim.posts() == []
            assert sent not in fw.stderr_text()
        with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
            with client.get_queue_receiver(
                "approvals", session_id="some-other-vm", max_wait_time=2
            ) as receiver:
                (still_there,) = receiver.receive_messages(max_message_count=5, max_wait_time=2)
                receiver.complete_message(still_there)
    assert still_there.message_id == sent


@pytest.mark.timeout(120)
def test_sebridge_approve_sends_a_valid_command(emulator: Any, tmp_path: Path) -> None:
    with running_simulator("user-reboot", speed=0.1, extra_args=["--start-on-first-poll"]) as sim:
        with running_forwarder(emulator, sim, tmp_path) as fw:
            wait_until(lambda: "receiving commands" in fw.stderr_text(), 30, "the receiver")
            wait_until(lambda: sim.state()["document"]["Events"], 10, "the scenario to start")
            cli = ChildProcess(
                "approve",
                [
                    "--vm",
                    VM,
                    "--event-id",
                    EVENT_ID,
                    "--reason",
                    "by hand",
                    "--by",
                    "ops",
                    "--connection-string",
                    emulator.connection_string,
                ],
            )
            with cli:
                assert cli.process is not None and cli.process.wait(timeout=30) == 0
                assert cli.wait_for_line("sent approve:", 5)
                note = cli.wait_for_line("note: the queue drops a message id", 5)
                assert "az maintenance scheduledevents acknowledge" in note and EVENT_ID in note
            wait_until(lambda: sim.posts(), 20, "the IMDS POST")
            time.sleep(0.5)
        assert [p["status"] for p in sim.posts()] == [200]
