"""The workflows end to end: the local functions host runs the real function_app.py against the
Service Bus emulator, with Teams, ARM, managed identity and blob storage played by loopback fakes.

A Scheduled message on the topic must lead to a Teams card, the VM's removal from its pool, a
Prepared transition on the topic and an approve command on the observing VM's session of the
approvals queue; Completed must put the VM back. Two events on one pool of two, handled at the
same time by two functions-host processes, must not both pass the capacity guard.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from emulators.fakes.arm import FakeArm, simulator_vm_id
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from emulators.fakes.teams import FakeTeams
from emulators.processes import server
from emulators.servicebus.testing import running_emulator
from sebridge.contract.commands import parse_command
from sebridge.contract.events import Transition, event_message
from sebridge.imds import Document
from sebridge.servicebus import envelope_message as to_service_bus_message
from sebridge.servicebus import message_body
from tests.fixtures import golden
from tests.support.bus import receive_all
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

REPO = Path(__file__).resolve().parents[2]
# One session per trigger and host (an app setting overriding host.json, as in Azure): the
# two-hosts test's two events then go to two hosts; with host.json's 64, one host could take
# both and decide them in one batch, and the pool's lease would never be contended.
ONE_SESSION_PER_TRIGGER = {
    "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentSessions": "1"
}
SUBSCRIPTION = golden.OBSERVER.subscription_id
GROUP = golden.OBSERVER.resource_group


def add_world(arm: FakeArm) -> tuple[str, dict[str, str]]:
    """pool-a: web-1 (the golden observer) and web-2, with web-3 to spare, in availability set
    as-web; pool-p (its own load balancer, rule `http`): pair-1 and pair-2 only."""
    aset = arm.add_availability_set(SUBSCRIPTION, GROUP, "as-web")
    lb = arm.add_load_balancer(SUBSCRIPTION, GROUP, "lb-web", ["pool-a"])
    pool = f"{lb}/backendAddressPools/pool-a"
    vms = {
        name: arm.add_vm(
            SUBSCRIPTION,
            GROUP,
            name,
            [pool],
            availability_set=aset,
            vm_id=golden.OBSERVER.vm_id if name == "web-1" else None,
        )
        for name in ("web-1", "web-2", "web-3")
    }
    pair = arm.add_load_balancer(
        SUBSCRIPTION, GROUP, "lb-pair", ["pool-p"], rules={"http": "pool-p"}
    )
    for name in ("pair-1", "pair-2"):
        vms[name] = arm.add_vm(
            SUBSCRIPTION, GROUP, name, [f"{pair}/backendAddressPools/pool-p"], availability_set=aset
        )
    return pool, vms


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    teams, arm, identity, storage = FakeTeams(), FakeArm(), FakeIdentity(), FakeBlobStorage()
    for fake in (teams, arm, identity, storage):
        fake.start()
    pool, vms = add_world(arm)
    try:
        with running_emulator(REPO / "infra" / "servicebus-emulator" / "Config.json") as bus:
            settings = tmp_path_factory.mktemp("host") / "local.settings.json"
            settings.write_text(
                json.dumps(
                    {
                        "IsEncrypted": False,
                        "Values": {
                            "ServiceBusConnection": bus.connection_string,
                            "TopicName": "scheduled-events",
                            "TeamsSubscriptionName": "teams",
                            "LbPoolsSubscriptionName": "lb-pools",
                            "ApprovalGateSubscriptionName": "approval-gate",
                            "ApprovalsQueueName": "approvals",
                            "TEAMS_WEBHOOK_URL": teams.webhook_url,
                            "APPROVAL_SIGNING_KEY": secrets.token_urlsafe(32),
                            "APPROVAL_BASE_URL": "http://127.0.0.1:9",
                            "ARM_ENDPOINT": arm.url,
                            "LB_POOL_STATE_URL": storage.container_url("sebridge-pools"),
                            **ONE_SESSION_PER_TRIGGER,
                            **identity.environ(),
                        },
                    }
                )
            )
            # A real `sebridge functions-host` process, as a developer runs it.
            host, _ = server(
                "functions-host",
                "--app",
                str(REPO / "function_app.py"),
                "--settings",
                str(settings),
            )
            try:
                yield {
                    "bus": bus,
                    "teams": teams,
                    "arm": arm,
                    "storage": storage,
                    "vms": vms,
                    "pool": pool,
                    "host": host,
                    "settings": settings,
                }
            finally:
                host.close()
    finally:
        for fake in (teams, arm, identity, storage):
            fake.stop()


def publish(bus: Any, transition: Transition, fields: dict[str, Any], incarnation: int) -> str:
    (event,) = Document.from_imds({"DocumentIncarnation": incarnation, "Events": [fields]}).events
    envelope = event_message(transition, event, golden.OBSERVER, incarnation, datetime.now(UTC))
    with (
        ServiceBusClient.from_connection_string(bus.connection_string) as client,
        client.get_topic_sender("scheduled-events") as sender,
    ):
        sender.send_messages(to_service_bus_message(envelope), timeout=10)
    return envelope.message_id


@pytest.mark.timeout(120)
def test_scheduled_to_completed_through_the_workflows(world: dict[str, Any]) -> None:
    bus, teams, arm, vms, pool = (world[k] for k in ("bus", "teams", "arm", "vms", "pool"))
    not_before = datetime.now(UTC) + timedelta(minutes=10)
    scheduled = dict(golden.SCHEDULED, NotBefore=not_before.strftime("%a, %d %b %Y %H:%M:%S GMT"))
    publish(bus, Transition.SCHEDULED, scheduled, 11)

    # Pool removal for both affected VMs, a card, and Prepared on the topic.
    pair = ("web-1", "web-2")
    wait_until(lambda: all(arm.vm_pools(vms[vm]) == [] for vm in pair), 30, "pool removal")
    wait_until(lambda: teams.cards, 30, "a Teams card")
    audit = receive_all(bus.connection_string, "audit", want=2, timeout=30)
    assert [m["subject"] for m in audit] == ["Scheduled", "Prepared"]
    prepared = json.loads(audit[1]["body"])["data"]
    assert sorted(prepared["prepared"]["vms"]) == ["web-1", "web-2"]

    # The gate's approve command waits on the observing VM's session.
    with (
        ServiceBusClient.from_connection_string(bus.connection_string) as client,
        client.get_queue_receiver(
            "approvals", session_id=golden.OBSERVER.vm_name, max_wait_time=20
        ) as receiver,
    ):
        (command_message,) = receiver.receive_messages(max_message_count=1, max_wait_time=20)
        receiver.complete_message(command_message)
    command = parse_command(message_body(command_message), datetime.now(UTC))
    assert command.event_id == golden.EVENT_ID.lower()
    assert command_message.message_id == f"approve:{command.event_id}"
    assert command.expires_at <= not_before + timedelta(seconds=1)

    # Started, then Completed: the VMs go back into exactly the pool they left.
    publish(bus, Transition.STARTED, dict(scheduled, EventStatus="Started", NotBefore=""), 12)
    publish(bus, Transition.COMPLETED, dict(scheduled, EventStatus="Started", NotBefore=""), 13)
    wait_until(lambda: all(arm.vm_pools(vms[vm]) == [pool] for vm in pair), 30, "restore")
    wait_until(lambda: len(teams.cards) >= 4, 30, "cards for every transition")
    titles = [json.dumps(card) for card in teams.cards]
    assert any("scheduled" in t.lower() for t in titles)
    assert any("completed" in t.lower() for t in titles)


@pytest.mark.timeout(120)
def test_a_replayed_scheduled_changes_nothing_more(world: dict[str, Any]) -> None:
    bus, arm, vms, pool = world["bus"], world["arm"], world["vms"], world["pool"]
    pair = ("web-1", "web-2")
    wait_until(lambda: all(arm.vm_pools(vms[vm]) == [pool] for vm in pair), 30, "a clean world")
    receive_all(bus.connection_string, "audit", want=0, timeout=3)  # what earlier tests left
    not_before = datetime.now(UTC) + timedelta(minutes=10)
    scheduled = dict(
        golden.SCHEDULED,
        EventId="5D6E7F80-1A2B-4C3D-8E9F-0A1B2C3D4E5F",
        NotBefore=not_before.strftime("%a, %d %b %Y %H:%M:%S GMT"),
    )
    publish(bus, Transition.SCHEDULED, scheduled, 21)
    wait_until(lambda: all(arm.vm_pools(vms[vm]) == [] for vm in pair), 30, "pool removal")
    audit = receive_all(bus.connection_string, "audit", want=2, timeout=30)
    assert [m["subject"] for m in audit] == ["Scheduled", "Prepared"]
    writes_before = len(arm.writes())
    # The same transition seen by another VM after the duplicate window: a replay.
    (event,) = Document.from_imds({"DocumentIncarnation": 21, "Events": [scheduled]}).events
    other = replace(
        golden.OBSERVER,
        vm_name="web-2",
        vm_id=simulator_vm_id("web-2"),
        resource_id=vms["web-2"],
    )
    replay = event_message(Transition.SCHEDULED, event, other, 21, datetime.now(UTC))
    message = to_service_bus_message(replay)
    message.message_id = f"{replay.message_id}:replayed"  # past duplicate detection
    with (
        ServiceBusClient.from_connection_string(bus.connection_string) as client,
        client.get_topic_sender("scheduled-events") as sender,
    ):
        sender.send_messages(
            ServiceBusMessage(
                b"".join(message.body),
                message_id=message.message_id,
                session_id=replay.session_id,
                subject=replay.subject,
                application_properties=message.application_properties,
                content_type=message.content_type,
            ),
            timeout=10,
        )
    receive_all(bus.connection_string, "audit", want=1, timeout=30)
    time.sleep(2)
    assert len(arm.writes()) == writes_before  # nothing was rewritten
    assert all(arm.vm_pools(vms[vm]) == [] for vm in pair)


def publish_many(bus: Any, envelopes: list[Any]) -> None:
    with (
        ServiceBusClient.from_connection_string(bus.connection_string) as client,
        client.get_topic_sender("scheduled-events") as sender,
    ):
        sender.send_messages([to_service_bus_message(e) for e in envelopes], timeout=10)


@pytest.mark.timeout(240)
def test_two_hosts_do_not_both_pass_the_guard_on_one_pool(world: dict[str, Any]) -> None:
    """pool-p holds pair-1 and pair-2 (LB_MIN_HEALTHY 1). Two Scheduled events, one for each,
    reach two functions-host processes (one session at a time each); ARM holds the first
    drain's NIC PUT, which happens under the pool's lease, until the other decision has found
    the lease taken, so the two overlap however long each host takes to get going. The blob
    lease serialises them: one is drained, one is held; when the drained one completes, the
    held one is drained and the pool keeps a member throughout."""
    bus, arm, storage, vms = world["bus"], world["arm"], world["storage"], world["vms"]
    receive_all(bus.connection_string, "audit", want=0, timeout=3)  # what earlier tests left
    second, _ = server(
        "functions-host",
        "--app",
        str(REPO / "function_app.py"),
        "--settings",
        str(world["settings"]),
    )
    try:
        # The first drain's NIC PUT happens under the pool's lease: held until the other
        # decision has found the lease taken (the host busy with the first event takes no
        # second session, so the other host must take it).
        release = threading.Event()
        arm.slow(90, method="PUT", path_contains="/networkInterfaces/", times=1, until=release)
        not_before = (datetime.now(UTC) + timedelta(minutes=10)).strftime(
            "%a, %d %b %Y %H:%M:%S GMT"
        )
        events = {}
        for vm, event_id in (
            ("pair-1", "aaaaaaaa-1111-4111-8111-000000000001"),
            ("pair-2", "aaaaaaaa-2222-4222-8222-000000000002"),
        ):
            fields = dict(golden.SCHEDULED, EventId=event_id, Resources=[vm], NotBefore=not_before)
            (event,) = Document.from_imds({"DocumentIncarnation": 31, "Events": [fields]}).events
            events[vm] = (fields, event)
        started = len(arm.pool_events)
        publish_many(
            bus,
            [
                event_message(Transition.SCHEDULED, e, golden.OBSERVER, 31, datetime.now(UTC))
                for _, e in events.values()
            ],
        )
        try:
            wait_until(
                lambda: any(c.code == "LeaseAlreadyPresent" for c in storage.lease_log),
                90,
                "the second decision to find the pool's lease taken by the first",
            )
        finally:
            release.set()
        audit = receive_all(bus.connection_string, "audit", want=4, timeout=90)
        subjects = sorted(m["subject"] for m in audit)
        assert subjects == ["Held", "Prepared", "Scheduled", "Scheduled"], subjects
        out = [vm for vm in ("pair-1", "pair-2") if arm.vm_pools(vms[vm]) == []]
        assert len(out) == 1, f"both or neither drained: {out}"
        assert any(c.code == "LeaseAlreadyPresent" for c in storage.lease_log), (
            "the two decisions never contended for the pool's lease"
        )
        (held,) = [m for m in audit if m["subject"] == "Held"]
        held_data = json.loads(held["body"])["data"]["held"]
        (kept,) = held_data["vms"]
        assert kept != out[0] and held_data["healthy"] == 0 and held_data["minimum"] == 1

        # The drained one completes: it goes back, and the held one is drained then.
        fields, _ = events[out[0]]
        publish(bus, Transition.COMPLETED, dict(fields, EventStatus="Started", NotBefore=""), 32)
        wait_until(
            lambda: arm.vm_pools(vms[kept]) == [] and arm.vm_pools(vms[out[0]]) != [],
            60,
            "the held event drained after the first completed",
        )
        members = {vm: True for vm in ("pair-1", "pair-2")}
        for change in arm.pool_events[started:]:
            members[change.nic.removesuffix("-nic")] = change.joined
            assert any(members.values()), "pool-p was left without a member"
    finally:
        second.close()


@pytest.mark.timeout(180)
def test_a_late_prepared_approves_nothing_the_event_names_now(world: dict[str, Any]) -> None:
    """Hostile review of issue 23, break 1, end to end. Event E names late-1; ARM is slow on
    late-1's NIC (3 s), so the Updated that grows E to late-1..3 reaches the gate before
    lb-pools' Prepared [late-1] does. lb-pools holds the Updated (pool-l would have no member
    left); the gate, handed the late Prepared, must send no approve command: IMDS would release
    every VM E lists then, late-2 and late-3 among them, while they serve in pool-l."""
    bus, arm, host = world["bus"], world["arm"], world["host"]
    receive_all(bus.connection_string, "audit", want=0, timeout=3)  # what earlier tests left
    aset = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Compute/"
    aset += "availabilitySets/as-web"
    lb = arm.add_load_balancer(SUBSCRIPTION, GROUP, "lb-late", ["pool-l"])
    pool = f"{lb}/backendAddressPools/pool-l"
    vms = {
        name: arm.add_vm(SUBSCRIPTION, GROUP, name, [pool], availability_set=aset)
        for name in ("late-1", "late-2", "late-3")
    }
    arm.slow(3.0, method="PUT", path_contains="/late-1-nic", times=1)
    event_id = "e1a7e000-0000-4000-8000-0000000000e1"
    not_before = (datetime.now(UTC) + timedelta(minutes=15)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    first = dict(golden.SCHEDULED, EventId=event_id, Resources=["late-1"], NotBefore=not_before)
    grown = dict(first, Resources=["late-1", "late-2", "late-3"])
    (scheduled,) = Document.from_imds({"DocumentIncarnation": 41, "Events": [first]}).events
    (updated,) = Document.from_imds({"DocumentIncarnation": 42, "Events": [grown]}).events
    now = datetime.now(UTC)
    publish_many(bus, [event_message(Transition.SCHEDULED, scheduled, golden.OBSERVER, 41, now)])
    # late-1's NIC is read (by lb-pools, about to write it for 3 s, or by the gate): the
    # Updated goes out now, well before lb-pools can publish its Prepared.
    wait_until(
        lambda: any(r.method == "GET" and r.path.endswith("/late-1-nic") for r in arm.requests),
        30,
        "late-1's NIC read",
    )
    changes = {"Resources": {"from": ["late-1"], "to": ["late-1", "late-2", "late-3"]}}
    later = now + timedelta(seconds=1)
    publish_many(
        bus,
        [event_message(Transition.UPDATED, updated, golden.OBSERVER, 42, later, changes=changes)],
    )
    audit = receive_all(bus.connection_string, "audit", want=4, timeout=90)
    subjects = [m["subject"] for m in audit]
    assert sorted(subjects) == ["Held", "Prepared", "Scheduled", "Updated"], subjects
    (prepared,) = [m for m in audit if m["subject"] == "Prepared"]
    assert json.loads(prepared["body"])["data"]["prepared"]["vms"] == ["late-1"]
    # The gate handled the late Prepared (the host logs each invocation when it is done).
    wait_until(
        lambda: f"function=approval_gate message_id={prepared['message_id']}" in host.stderr_text(),
        60,
        "the gate's invocation for the late Prepared",
    )
    (grown_message,) = [m for m in audit if m["subject"] == "Updated"]
    log = host.stderr_text()
    gate_saw_updated = log.find(f"function=approval_gate message_id={grown_message['message_id']}")
    gate_saw_prepared = log.find(f"function=approval_gate message_id={prepared['message_id']}")
    assert 0 <= gate_saw_updated < gate_saw_prepared, "no race: the Prepared reached the gate first"
    with (
        ServiceBusClient.from_connection_string(bus.connection_string) as client,
        client.get_queue_receiver(
            "approvals", session_id=golden.OBSERVER.vm_name, max_wait_time=2
        ) as receiver,
    ):
        waiting = receiver.peek_messages(max_message_count=100, timeout=10)
    assert f"approve:{event_id}" not in {m.message_id for m in waiting}
    assert arm.vm_pools(vms["late-2"]) == [pool] and arm.vm_pools(vms["late-3"]) == [pool]


@pytest.mark.timeout(240)
def test_another_sets_cancelled_does_not_end_a_held_event(world: dict[str, Any]) -> None:
    """Hostile review of issue 23, round two, break 1a, end to end. In pool-x (x-1..3 of
    as-web, LB_MIN_HEALTHY 1), A drains x-1, B drains x-2 and C, on x-3, is held. db-1, a real
    VM of another availability set that knows C's EventId, sends Cancelled for C naming itself:
    it verifies (db-1 is who it says), but only in as-db's scope. When A completes, C is tried
    again and drains x-3 (before, db-1's Cancelled had dropped C's hold, and x-3 stayed in)."""
    bus, arm, host = world["bus"], world["arm"], world["host"]
    receive_all(bus.connection_string, "audit", want=0, timeout=3)  # what earlier tests left
    aset = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Compute/"
    aset += "availabilitySets/as-web"
    lb = arm.add_load_balancer(SUBSCRIPTION, GROUP, "lb-x", ["pool-x"], rules={"http": "pool-x"})
    pool = f"{lb}/backendAddressPools/pool-x"
    vms = {
        name: arm.add_vm(SUBSCRIPTION, GROUP, name, [pool], availability_set=aset)
        for name in ("x-1", "x-2", "x-3")
    }
    as_db = arm.add_availability_set(SUBSCRIPTION, GROUP, "as-db")
    db = replace(
        golden.OBSERVER,
        vm_name="db-1",
        vm_id=simulator_vm_id("db-1"),
        resource_id=arm.add_vm(SUBSCRIPTION, GROUP, "db-1", [], availability_set=as_db),
        vm_scale_set_name="",
    )
    ids = {name: f"{n}c5c0e00-0000-4000-8000-0000000000c5" for n, name in enumerate("ABC", 1)}
    not_before = (datetime.now(UTC) + timedelta(minutes=30)).strftime("%a, %d %b %Y %H:%M:%S GMT")

    def envelope(transition: Transition, name: str, vm: str, by: Any, incarnation: int) -> Any:
        status = "Started" if transition is Transition.COMPLETED else "Scheduled"
        fields = dict(
            golden.SCHEDULED,
            EventId=ids[name],
            Resources=[vm],
            EventStatus=status,
            NotBefore="" if status == "Started" else not_before,
        )
        (event,) = Document.from_imds(
            {"DocumentIncarnation": incarnation, "Events": [fields]}
        ).events
        return event_message(transition, event, by, incarnation, datetime.now(UTC))

    for name, vm in (("A", "x-1"), ("B", "x-2"), ("C", "x-3")):
        publish_many(bus, [envelope(Transition.SCHEDULED, name, vm, golden.OBSERVER, 51)])
        audit = receive_all(bus.connection_string, "audit", want=2, timeout=90)
        assert {m["subject"] for m in audit} == {"Scheduled", "Held" if name == "C" else "Prepared"}
    assert arm.vm_pools(vms["x-3"]) == [pool]
    cancelled = envelope(Transition.CANCELLED, "C", "db-1", db, 52)
    publish_many(bus, [cancelled])
    wait_until(
        lambda: f"function=lb_pools message_id={cancelled.message_id}" in host.stderr_text(),
        60,
        "lb-pools handled db-1's Cancelled",
    )
    publish_many(bus, [envelope(Transition.COMPLETED, "A", "x-1", golden.OBSERVER, 53)])
    wait_until(lambda: arm.vm_pools(vms["x-1"]) == [pool], 90, "A's end put x-1 back")
    wait_until(lambda: arm.vm_pools(vms["x-3"]) == [], 90, "C resumed: x-3 drained")
