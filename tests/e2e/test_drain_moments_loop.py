"""lb-pools drains at the moment, end to end: the local functions host runs function_app.py with
DrainMomentsQueueName against the Service Bus emulator, whose scheduled messages (the SDK's own
schedule_messages and cancel_scheduled_messages) carry the moment; ARM, Teams, identity and blob
storage are the loopback fakes. Short leads keep it quick: NotBefore is ten minutes out, the
lead a few seconds under that.

Event A stays in its pool until its moment, then drains and is Prepared. Event B's moment comes
before A's, but an Updated moves it an hour later: when A has drained (after B's first moment),
B's VM is still in its pool.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from emulators.fakes.teams import FakeTeams, card_lines
from emulators.processes import server
from emulators.servicebus.testing import running_emulator
from sebridge.contract.events import Transition, event_message
from sebridge.imds import Document
from sebridge.servicebus import envelope_message
from tests.fixtures import golden
from tests.support.bus import receive_all
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SUBSCRIPTION = golden.OBSERVER.subscription_id
GROUP = golden.OBSERVER.resource_group
NOTICE = timedelta(minutes=10)
A_IN = timedelta(seconds=25)  # A's moment, from the start of the test
B_IN = timedelta(seconds=15)  # B's first moment (before A's)
LEAD_A = int((NOTICE - A_IN).total_seconds())
LEAD_B = int((NOTICE - B_IN).total_seconds())


def _imds_time(at: datetime) -> str:
    return at.strftime("%a, %d %b %Y %H:%M:%S GMT")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    teams, arm, identity, storage = FakeTeams(), FakeArm(), FakeIdentity(), FakeBlobStorage()
    for fake in (teams, arm, identity, storage):
        fake.start()
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
        for name in ("web-1", "web-2", "web-3", "web-4")
    }
    # Reboot (A) and Redeploy (B) get leads of their own: A's moment is A_IN away, B's B_IN.
    policy = {
        "rules": [{"name": "prepare-first", "match": {}, "action": "approve-when-prepared"}],
        "leadSeconds": {"Reboot": LEAD_A, "Redeploy": LEAD_B},
    }
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
                            "DrainMomentsQueueName": "drain-moments",
                            "APPROVAL_POLICY": json.dumps(policy),
                            "TEAMS_WEBHOOK_URL": teams.webhook_url,
                            "APPROVAL_SIGNING_KEY": secrets.token_urlsafe(32),
                            "APPROVAL_BASE_URL": "http://127.0.0.1:9",
                            "ARM_ENDPOINT": arm.url,
                            "LB_POOL_STATE_URL": storage.container_url("sebridge-pools"),
                            **identity.environ(),
                        },
                    }
                )
            )
            app = str(REPO / "function_app.py")
            host, _ = server("functions-host", "--app", app, "--settings", str(settings))
            try:
                yield {"bus": bus, "teams": teams, "arm": arm, "vms": vms, "pool": pool}
            finally:
                host.close()
    finally:
        for fake in (teams, arm, identity, storage):
            fake.stop()


def publish(
    bus: Any,
    transition: Transition,
    fields: dict[str, Any],
    incarnation: int,
    changes: dict[str, Any] | None = None,
) -> None:
    (event,) = Document.from_imds({"DocumentIncarnation": incarnation, "Events": [fields]}).events
    envelope = event_message(
        transition, event, golden.OBSERVER, incarnation, datetime.now(UTC), changes=changes
    )
    with (
        ServiceBusClient.from_connection_string(bus.connection_string) as client,
        client.get_topic_sender("scheduled-events") as sender,
    ):
        sender.send_messages(envelope_message(envelope), timeout=10)


def _drain_fact(card: dict[str, Any]) -> str:
    return next((line for line in card_lines(card) if "Drain from pools" in line), "")


@pytest.mark.timeout(180)
def test_the_drain_waits_for_its_moment_and_an_updated_moves_it(world: dict[str, Any]) -> None:
    bus, teams, arm, vms, pool = (world[k] for k in ("bus", "teams", "arm", "vms", "pool"))
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    a = dict(
        golden.SCHEDULED,
        EventType="Reboot",
        Resources=["web-2"],
        NotBefore=_imds_time(start + NOTICE),
    )
    b = dict(
        golden.SCHEDULED,
        EventId="5D6E7F80-1A2B-4C3D-8E9F-0A1B2C3D4E5F",
        EventType="Redeploy",
        Resources=["web-3"],
        NotBefore=_imds_time(start + NOTICE),
    )
    publish(bus, Transition.SCHEDULED, a, 11)
    publish(bus, Transition.SCHEDULED, b, 12)
    # Both cards say when their VMs leave their pools; by then nothing has left.
    wait_until(lambda: len(teams.cards) >= 2, 30, "the Scheduled cards")
    facts = sorted(_drain_fact(card) for card in teams.cards[:2])
    assert all(" UTC" in fact and "now" not in fact for fact in facts), facts
    # B moves an hour later, before its first moment.
    later = dict(b, NotBefore=_imds_time(start + NOTICE + timedelta(hours=1)))
    moved = {"NotBefore": {"from": b["NotBefore"], "to": later["NotBefore"]}}
    publish(bus, Transition.UPDATED, later, 13, moved)
    wait_until(lambda: len(teams.cards) >= 3, 30, "the Updated card")
    assert datetime.now(UTC) < start + B_IN, "too slow to test the moved moment"
    assert arm.vm_pools(vms["web-2"]) == [pool] and arm.vm_pools(vms["web-3"]) == [pool]

    # A drains at its moment (after B's first one) and is Prepared; B stays in its pool.
    wait_until(lambda: arm.vm_pools(vms["web-2"]) == [], 60, "A's drain at its moment")
    assert datetime.now(UTC) >= start + A_IN - timedelta(seconds=1)
    assert arm.vm_pools(vms["web-3"]) == [pool]
    audit = receive_all(bus.connection_string, "audit", want=4, timeout=30)
    assert sorted(m["subject"] for m in audit) == ["Prepared", "Scheduled", "Scheduled", "Updated"]
    (prepared,) = [json.loads(m["body"]) for m in audit if m["subject"] == "Prepared"]
    assert prepared["data"]["prepared"]["vms"] == ["web-2"]
    # Cancelled: B's moved moment goes, and B's VM never leaves its pool.
    publish(bus, Transition.CANCELLED, later, 14)
    receive_all(bus.connection_string, "audit", want=1, timeout=30)
    wait_until(lambda: len(teams.cards) >= 5, 30, "the Cancelled card")
    assert arm.vm_pools(vms["web-3"]) == [pool]
