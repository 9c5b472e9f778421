"""Approvals without an agent: the gate acknowledges through ARM when no forwarder can take the
command (functions/approval_gate/agentless.py), through the function objects and end to end."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.demo.sources import webhook_url
from emulators.fakes.arm import FakeArm
from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from emulators.fakes.eventgrid import EventGridPublisher
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from emulators.processes import server
from emulators.servicebus.testing import running_emulator
from functions.approval_gate.agentless import AgentlessRules, Route, choose_route
from functions.eventgrid_ingest.core import Ingestor
from functions.eventgrid_ingest.notification import raw_from_json
from functions.shared import seal
from functions.shared.settings import HEARTBEAT_CONTAINER
from sebridge.contract.events import Envelope, Observer, heartbeat_message, parse_message
from tests.eventgrid.support import (
    FixedClock,
    MemoryStore,
    Publisher,
    documented_sample,
    event_json,
)
from tests.fixtures import golden
from tests.functions.support import EVENT_ID, NOW, RG, SIGNING_KEY, SUB, App, envelope, web_vm
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def published_for(body: dict[str, Any]) -> Envelope:
    """The message the ingestion publishes for one notification (its first for the event)."""
    publisher = Publisher()
    ingestor = Ingestor(MemoryStore(), publisher, FixedClock(), sleep=lambda _: None)
    ingestor.handle_raw(raw_from_json(body))
    (message,) = publisher.published
    return message


def via_event_grid(status: str = "Scheduled", **fields: Any) -> Envelope:
    """The message the ingestion publishes for a notification about VM web-1, sealed as the
    app seals what it publishes (functions.shared.seal)."""
    key = seal.app_key(SIGNING_KEY.encode())
    return seal.seal(published_for(event_json(status, 0, **fields)), key)


# -- the route, as a table ----------------------------------------------------------------
@dataclass
class Heartbeats:
    last_seen: dict[str, datetime] = field(default_factory=dict)

    def record(self, vm_name: str, at: datetime) -> None:
        self.last_seen[vm_name] = at

    def last(self, vm_name: str) -> datetime | None:
        return self.last_seen.get(vm_name)


FORWARDER = parse_message(golden.build()["scheduled"].body_bytes())
EVENT_GRID = parse_message(via_event_grid(EventSource="User").body_bytes())
SCALE_SET = parse_message(published_for(documented_sample()).body_bytes())
STALE = timedelta(minutes=15)


@pytest.mark.parametrize(
    ("message", "rules", "beats", "route"),
    [
        (FORWARDER, None, None, Route.COMMAND),
        (FORWARDER, AgentlessRules.of(["RG-WEB"], []), None, Route.ACKNOWLEDGE),
        (FORWARDER, AgentlessRules.of([], ["web-*"]), None, Route.ACKNOWLEDGE),
        (FORWARDER, AgentlessRules.of(["rg-batch"], ["batch-*"]), None, Route.COMMAND),
        (EVENT_GRID, None, None, Route.COMMAND),  # no store: nothing says it has no forwarder
        (EVENT_GRID, None, {}, Route.ACKNOWLEDGE),  # no Heartbeat on record
        (FORWARDER, None, {}, Route.COMMAND),  # its forwarder just sent it
        (EVENT_GRID, None, {"web-1": NOW - timedelta(minutes=2)}, Route.COMMAND),
        (EVENT_GRID, None, {"web-1": NOW - timedelta(hours=1)}, Route.ACKNOWLEDGE),
        (FORWARDER, None, {"web-1": NOW - timedelta(hours=1)}, Route.ACKNOWLEDGE),
        (SCALE_SET, None, None, Route.ACKNOWLEDGE),  # no VM to send a command to
        (SCALE_SET, AgentlessRules.of([], ["myvmss"]), None, Route.ACKNOWLEDGE),
    ],
)
def test_the_route(
    message: Any, rules: AgentlessRules | None, beats: dict[str, datetime] | None, route: Route
) -> None:
    store = Heartbeats(dict(beats)) if beats is not None else None
    choice = choose_route(message, NOW, rules=rules, heartbeats=store, stale_after=STALE)
    assert choice.route is route, choice.reason


def test_a_message_without_an_arm_id_always_gets_the_command() -> None:
    bare = replace(FORWARDER, observer=Observer(vm_name="web-1"))
    rules = AgentlessRules.of([], ["*"])
    choice = choose_route(bare, NOW, rules=rules, heartbeats=None, stale_after=None)
    assert choice.route is Route.COMMAND


def test_a_forwarder_on_a_uniform_instance_gets_the_command() -> None:
    """A Uniform scale-set instance is a VM with a forwarder (its id has the scale set in it):
    it gets the command, never an acknowledgement on the scale set's id."""
    instance_id = (
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/"
        "virtualMachineScaleSets/web/virtualMachines/0"
    )
    instance = replace(
        FORWARDER,
        observer=Observer(vm_name="web_0", vm_scale_set_name="web", resource_id=instance_id),
    )
    choice = choose_route(instance, NOW, rules=None, heartbeats=None, stale_after=None)
    assert choice.route is Route.COMMAND, choice.reason
    scale_set = replace(
        instance,
        observer=replace(
            instance.observer, resource_id=instance_id.removesuffix("/virtualMachines/0")
        ),
    )
    assert scale_set.observer.resource_id.endswith("/virtualMachineScaleSets/web")
    choice = choose_route(scale_set, NOW, rules=None, heartbeats=None, stale_after=None)
    assert choice.route is Route.ACKNOWLEDGE, choice.reason


def test_patterns_match_the_scale_set_name_too() -> None:
    rules = AgentlessRules.of([], ["batch*"])
    vmss = Observer(vm_name="node_3", vm_scale_set_name="batchpool", resource_group="rg")
    assert not rules.expects_forwarder(vmss)
    assert rules.expects_forwarder(replace(vmss, vm_scale_set_name="web"))


# -- through the function objects ---------------------------------------------------------
@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"])
    pool = f"{lb}/backendAddressPools/pool-a"
    web_vm(arm_fake, "web-spare", [pool])  # so that the capacity guard lets web-1 go
    return {"web-1": web_vm(arm_fake, "web-1", [pool])}


def test_an_agentless_resource_group_is_acknowledged_through_arm(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    app = make_app(AGENTLESS_RESOURCE_GROUPS=RG)
    scheduled = envelope("Scheduled", EventSource="User")
    app.deliver("lb_pools", scheduled)  # an impactful event is approved once drained
    app.deliver("approval_gate", scheduled)
    assert not app.commands.sent
    assert app.arm.acknowledged == [(world["web-1"], EVENT_ID)]
    (ack,) = [w for w in app.arm.writes() if w.method == "POST"]  # besides the drain's PUT
    assert ack.path.endswith(f"/scheduledevents/{EVENT_ID}/acknowledge")


def test_an_event_grid_event_of_a_vm_without_heartbeats_is_acknowledged(
    make_app: Callable[..., App], storage_fake: FakeBlobStorage, world: dict[str, str]
) -> None:
    app = make_app(
        ACKNOWLEDGE_FALLBACK_ENABLED="true",
        HEARTBEAT_STORE_URL=storage_fake.container_url(HEARTBEAT_CONTAINER),
    )
    scheduled = via_event_grid(EventSource="User")
    app.deliver("lb_pools", scheduled)  # an impactful event is approved once drained
    app.deliver("approval_gate", scheduled)
    assert not app.commands.sent
    assert app.arm.acknowledged == [(world["web-1"], EVENT_ID)]


def test_an_event_grid_event_of_a_vm_with_a_live_forwarder_gets_the_command(
    make_app: Callable[..., App], storage_fake: FakeBlobStorage, world: dict[str, str]
) -> None:
    app = make_app(
        ACKNOWLEDGE_FALLBACK_ENABLED="true",
        HEARTBEAT_STORE_URL=storage_fake.container_url(HEARTBEAT_CONTAINER),
    )
    beat = heartbeat_message(
        golden.OBSERVER,
        NOW - timedelta(minutes=1),
        forwarder_version="0.2.0",
        last_incarnation=11,
        outbox_depth=0,
        last_successful_poll=None,
    )
    app.deliver("approval_gate", beat)
    scheduled = via_event_grid(EventSource="User")
    app.deliver("lb_pools", scheduled)  # an impactful event is approved once drained
    app.deliver("approval_gate", scheduled)
    ((_, session),) = app.commands.sent
    assert session == "web-1" and not app.arm.acknowledged


# -- end to end: Event Grid in, ARM acknowledge out, no forwarder anywhere ------------------
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_agentless_end_to_end(tmp_path: Path) -> None:
    """Everything but Teams' rendering real on loopback: the ingestion, lb-pools and the gate in
    a `sebridge functions-host` process, the Service Bus emulator, the ARM fake holding web-1.
    A Scheduled notification from Event Grid drains web-1 and the gate acknowledges the event
    through ARM; nothing goes to the approvals queue; Completed puts web-1 back."""
    arm, identity, storage = FakeArm(), FakeIdentity(), FakeConditionalBlobStorage()
    for fake in (arm, identity, storage):
        fake.start()
    lb = arm.add_load_balancer(SUB, RG, "lb-web", ["pool-a"])
    pool = f"{lb}/backendAddressPools/pool-a"
    vm_id = arm.add_vm(SUB, RG, "web-1", [pool])
    try:
        with running_emulator(REPO / "infra" / "servicebus-emulator" / "Config.json") as bus:
            values = {
                "ServiceBusConnection": bus.connection_string,
                "TopicName": "scheduled-events",
                "TeamsSubscriptionName": "teams",
                "LbPoolsSubscriptionName": "lb-pools",
                "ApprovalGateSubscriptionName": "approval-gate",
                "ApprovalsQueueName": "approvals",
                "TEAMS_WEBHOOK_URL": "http://127.0.0.1:9/teams",
                "APPROVAL_SIGNING_KEY": secrets.token_urlsafe(32),
                "APPROVAL_BASE_URL": "http://127.0.0.1:9",
                "ARM_ENDPOINT": arm.url,
                "EVENTGRID_INGEST_ENABLED": "true",
                "EVENTGRID_STATE_URL": storage.container_url("sebridge-eventgrid-state"),
                "AGENTLESS_RESOURCE_GROUPS": RG,
                "LB_MIN_HEALTHY": "0",  # the capacity guard is not what this test is about
                **identity.environ(),
            }
            settings = tmp_path / "local.settings.json"
            settings.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
            host, url = server(
                "functions-host",
                "--app",
                str(REPO / "function_app.py"),
                "--settings",
                str(settings),
                "--functions",
                "eventgrid_ingest,lb_pools,approval_gate",
            )
            with host:
                publisher = EventGridPublisher(webhook_url(url))
                publisher.validate()
                not_before = (datetime.now().astimezone() + timedelta(minutes=10)).strftime(
                    "%a, %d %b %Y %H:%M:%S GMT"
                )
                publisher.deliver([event_json("Scheduled", 0, NotBefore=not_before)])
                wait_until(lambda: arm.acknowledged, 60, "the ARM acknowledgement")
                # Scheduled and then Prepared may each approve (whichever finds web-1 drained):
                # the same acknowledgement, as two commands would be the same approve:<id>.
                assert set(arm.acknowledged) == {(vm_id, EVENT_ID)}
                assert arm.vm_pools(vm_id) == []  # lb-pools drained the agentless VM too
                publisher.deliver([event_json("Completed", 30)])
                wait_until(lambda: arm.vm_pools(vm_id) == [pool], 60, "web-1 back in its pool")
                assert receive_queue(bus.connection_string) == []
    finally:
        for fake in (arm, identity, storage):
            fake.stop()


def receive_queue(connection_string: str) -> list[Any]:
    """Whatever waits on the approvals queue (no forwarder session would ever take it)."""
    from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient
    from azure.servicebus.exceptions import OperationTimeoutError

    with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        try:
            with client.get_queue_receiver(
                "approvals", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
            ) as receiver:
                return list(receiver.receive_messages(max_wait_time=1))
        except OperationTimeoutError:
            return []


@pytest.mark.parametrize("status", [400, 404, 403])  # 409 is ARM's "try again": retried
def test_an_acknowledgement_arm_refuses_for_good_is_logged_not_retried(
    make_app: Callable[..., App],
    world: dict[str, str],
    status: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refusal no retry changes (the event gone or already acknowledged, a missing role)
    completes the message with an ERROR instead of cycling it into the dead-letter queue."""
    app = make_app(AGENTLESS_RESOURCE_GROUPS=RG)
    scheduled = envelope("Scheduled", EventSource="User")
    app.deliver("lb_pools", scheduled)
    app.arm.fail(status, times=1, method="POST", path_contains="/acknowledge")
    app.deliver("approval_gate", scheduled)  # returns: the message completes
    assert not app.arm.acknowledged and not app.commands.sent
    assert any("did not take the acknowledgement" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_transient_acknowledgement_failure_is_redelivered(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    from functions.adapters.retry import TransientHttpError

    app = make_app(AGENTLESS_RESOURCE_GROUPS=RG)
    scheduled = envelope("Scheduled", EventSource="User")
    app.deliver("lb_pools", scheduled)
    app.arm.fail(503, times=10, method="POST", path_contains="/acknowledge")
    with pytest.raises(TransientHttpError):
        app.deliver("approval_gate", scheduled)
