"""A sealed message whose VM is gone closes what it closes (lead's review of issue 23, item a).

Event Grid reports a Terminate (or Preempt) of a VM, and after it the event's Completed: by then
the VM no longer exists in ARM. The scope check refused that Completed as a security event (the
observer "does not exist"), so its PagerDuty incident never resolved and operators got a false
alarm. The seal proves Azure reported it: it verifies with the VM resolved as gone (nothing is
drained, restored or approved for it), in the scope it was verified in for this event (the
event's record, which the gate keeps), so the resolve reaches the incident the Scheduled
triggered: the availability set's, or the VM's own for a standalone VM.

Real function objects: the Event Grid ingestion, lb-pools, the gate, the webhooks and the loopback
ARM, blob storage and webhook receivers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from emulators.fakes.arm import FakeArm
from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from emulators.fakes.eventgrid import notification, scheduled_event_id
from emulators.fakes.webhooks import PAGERDUTY, FakeWebhooks
from emulators.functions_host.eventgrid import to_function_event
from functions.shared import composition
from sebridge.contract.events import Envelope
from tests.eventgrid.conftest import STATE_CONTAINER
from tests.eventgrid.support import T0, properties
from tests.functions.support import RG, SUB, App, pagerduty_dedup_key

pytestmark = pytest.mark.timeout(60)

EVENT = "7e7e7e7e-0000-4000-8000-00000000007e"
ROUTING_KEY = "R0uting0Key0For0The0Fake0Service"


@pytest.fixture
def hooks() -> Iterator[FakeWebhooks]:
    server = FakeWebhooks()
    server.start()
    yield server
    server.stop()


def through_event_grid(app: App, vm: str, status: str, seconds: int) -> Envelope:
    """Azure's notification of the event in ``status``, ingested: the sealed message."""
    before = len(app.publisher.published)
    props = properties(status, EventId=EVENT, Resources=[vm], EventType="Terminate")
    body = notification(
        props,
        resource_id=scheduled_event_id(SUB, RG, vm, EVENT),
        event_time=T0 + timedelta(seconds=seconds),
    )
    app.call("eventgrid_ingest", to_function_event(body, "eventgrid_ingest"))
    (message,) = app.publisher.published[before:]
    return message


@pytest.mark.parametrize("placement", ["availability set", "standalone"])
def test_the_completed_of_a_terminated_vm_resolves_its_alert(
    make_app: Callable[..., App],
    arm_fake: FakeArm,
    state_storage: FakeConditionalBlobStorage,
    hooks: FakeWebhooks,
    caplog: pytest.LogCaptureFixture,
    placement: str,
) -> None:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-spot", ["pool"], rules={"http": "pool"})
    pool = f"{lb}/backendAddressPools/pool"
    if placement == "availability set":
        scope = arm_fake.add_availability_set(SUB, RG, "as-spot")
        vm = arm_fake.add_vm(SUB, RG, "spot-1", [pool], availability_set=scope)
        arm_fake.add_vm(SUB, RG, "spot-2", [pool], availability_set=scope)
    else:
        scope = vm = arm_fake.add_vm(SUB, RG, "spot-1", [pool])
        arm_fake.add_vm(SUB, RG, "spare", [pool])
    app = make_app(
        LB_MIN_HEALTHY="1",
        EVENTGRID_INGEST_ENABLED="true",
        EVENTGRID_STATE_URL=state_storage.container_url(STATE_CONTAINER),
        WebhooksSubscriptionName="webhooks",
        WEBHOOKS=json.dumps(
            [
                {
                    "name": "oncall",
                    "preset": "pagerduty",
                    "routingKeySetting": "WEBHOOK_PD_ROUTING_KEY",
                    "urlSetting": "WEBHOOK_PD_URL",
                }
            ]
        ),
        WEBHOOK_PD_URL=hooks.pagerduty_url,
        WEBHOOK_PD_ROUTING_KEY=ROUTING_KEY,
    )
    scheduled = through_event_grid(app, "spot-1", "Scheduled", 0)
    for function in ("lb_pools", "approval_gate", "webhooks"):
        app.deliver(function, scheduled)
    key = pagerduty_dedup_key(EVENT, scope)
    assert hooks.alerts == {key: "triggered"}

    arm_fake.remove(vm)  # Azure deletes the VM
    deps = composition.dependencies()
    deps.arm.forget()  # type: ignore[attr-defined] - the process's cached VM reads
    writes = len(arm_fake.writes())
    caplog.set_level(logging.INFO)
    completed = through_event_grid(app, "spot-1", "Completed", 600)
    for function in ("lb_pools", "approval_gate", "teams", "webhooks"):
        app.deliver(function, completed)
    refusals = [r.getMessage() for r in caplog.records if getattr(r, "securityEvent", False)]
    assert not refusals
    assert hooks.alerts == {key: "resolved"}
    assert [b["event_action"] for b in hooks.bodies(PAGERDUTY)] == ["trigger", "resolve"]
    assert len(arm_fake.writes()) == writes, "something was written for a VM that is gone"
    assert "Unverified" not in json.dumps(app.teams.cards[-1])
