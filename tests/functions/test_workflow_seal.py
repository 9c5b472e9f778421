"""The app's seal: what the Function App publishes itself is trusted as the app checked it; a
message that claims Event Grid (or the seal) without a seal that verifies is a forgery.

A forwarder may send anything to the topic. Without the seal it could pass itself off as Azure's
own Event Grid notification, whose observer (a VM, scale set or availability set named by Azure)
carries no vmId to check, and so get another resource group's VMs drained or acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import pytest

from emulators.fakes.arm import FakeArm
from functions.shared import seal
from sebridge.contract.events import Envelope, Observer, event_message, parse_message
from tests.fixtures import golden
from tests.functions.support import EVENT_ID, RG, SIGNING_KEY, SUB, App, event, web_vm

pytestmark = pytest.mark.timeout(30)

KEY = seal.app_key(SIGNING_KEY.encode())
PROVENANCE = {
    "id": "0b2e3f06-4f6a-4c3b-9b8a-2f2a1f0e9c11",
    "eventTime": "2026-11-22T01:20:00Z",
    "topic": f"/subscriptions/{SUB}",
    "resourceId": f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/"
    f"virtualMachines/web-1/providers/Microsoft.Maintenance/scheduledevents/{EVENT_ID}",
}
PAYMENTS = "rg-payments"


def from_event_grid(observer: Observer, **fields: object) -> Envelope:
    """A Scheduled as the ingestion derives it from an Event Grid notification (unsealed)."""
    return event_message(
        golden.Transition.SCHEDULED,
        event(**fields),
        observer,
        None,
        golden.OBSERVED_AT,
        event_grid=PROVENANCE,
    )


def vm_observer(group: str, name: str) -> Observer:
    return Observer(
        vm_name=name,
        resource_id=f"/subscriptions/{SUB}/resourceGroups/{group}/providers/"
        f"Microsoft.Compute/virtualMachines/{name}",
        subscription_id=SUB,
        resource_group=group,
    )


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"])
    pay = arm_fake.add_load_balancer(SUB, PAYMENTS, "lb-pay", ["pool-db"])
    pool_a, pool_db = f"{lb}/backendAddressPools/pool-a", f"{pay}/backendAddressPools/pool-db"
    spare = arm_fake.add_vm(SUB, PAYMENTS, "db-spare", [pool_db])
    return {
        "web-1": web_vm(arm_fake, "web-1", [pool_a]),
        "web-2": web_vm(arm_fake, "web-2", [pool_a]),
        "web-3": web_vm(arm_fake, "web-3", [pool_a]),
        "db-1": arm_fake.add_vm(SUB, PAYMENTS, "db-1", [pool_db]),
        "db-spare": spare,
    }


def security_events(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "securityEvent", False)]


def test_the_seal_binds_id_transition_source_and_data() -> None:
    sealed = seal.seal(from_event_grid(vm_observer(RG, "web-1")), KEY)
    message = parse_message(sealed.body_bytes(), sealed.message_id)
    assert seal.verify(message, KEY)
    assert not seal.verify(message, seal.app_key(b"another-signing-key-0123456789-abcdef"))
    assert not seal.verify(replace(message, message_id=message.message_id + "x"), KEY)
    assert not seal.verify(replace(message, source=message.source + "x"), KEY)
    tampered = dict(message.data, Resources=["db-1"])
    assert not seal.verify(replace(message, data=tampered), KEY)
    assert seal.app_key(SIGNING_KEY.encode()) != SIGNING_KEY.encode()  # never the key itself


@pytest.mark.parametrize("sealed_with", [None, b"a forwarder's guess at the key, 0123456789"])
def test_a_forged_event_grid_message_changes_nothing(
    app: App,
    world: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    sealed_with: bytes | None,
) -> None:
    """A VM sends an 'Event Grid' Scheduled for db-1 in another resource group, with no seal or
    a seal of its own making: no drain, no command, no acknowledgement."""
    forged = from_event_grid(vm_observer(PAYMENTS, "db-1"), Resources=["db-1"], EventSource="User")
    if sealed_with is not None:
        forged = seal.seal(forged, sealed_with)
    before = app.arm.vm_pools(world["db-1"])
    with caplog.at_level(logging.WARNING):
        for function in ("teams", "lb_pools", "approval_gate"):
            app.deliver(function, forged)
    assert app.arm.vm_pools(world["db-1"]) == before
    assert not app.arm.writes() and not app.arm.acknowledged
    assert not app.commands.sent and not app.publisher.published
    events = security_events(caplog)
    assert events and all("seal does not verify" in r.getMessage() for r in events)


def test_a_sealed_event_grid_message_is_acted_on_without_a_vmid(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    """The app's own Event Grid transition for web-1 (no vmId: Azure's notification has none)
    drains web-1, and what lb-pools publishes about it carries the seal and the provenance."""
    app = make_app(AGENTLESS_RESOURCE_GROUPS=RG)
    scheduled = seal.seal(
        from_event_grid(vm_observer(RG, "web-1"), Resources=["web-1"], EventSource="User"), KEY
    )
    app.deliver("lb_pools", scheduled)
    assert app.arm.vm_pools(world["web-1"]) == []
    (prepared,) = app.publisher.published
    parsed = parse_message(prepared.body_bytes(), prepared.message_id)
    assert parsed.data["eventGrid"] == PROVENANCE and seal.verify(parsed, KEY)
    app.deliver("approval_gate", scheduled)
    assert app.arm.acknowledged == [(world["web-1"], EVENT_ID)] and not app.commands.sent


def test_a_scale_set_named_by_event_grid_is_acknowledged_on_its_own_id(
    make_app: Callable[..., App], arm_fake: FakeArm
) -> None:
    """Event Grid names the scale set as the observer: no VM to command, so ARM."""
    scale_set = "web-ss"
    arm_fake.add_scale_set(SUB, RG, scale_set, orchestration="Uniform")
    observer = Observer(
        vm_name=scale_set,
        resource_id=f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/"
        f"Microsoft.Compute/virtualMachineScaleSets/{scale_set}",
        subscription_id=SUB,
        resource_group=RG,
        vm_scale_set_name=scale_set,
    )
    app = make_app(LB_IMPACTFUL_EVENT_TYPES="Reboot")
    freeze = seal.seal(
        from_event_grid(observer, Resources=[], EventType="Freeze", DurationInSeconds=5), KEY
    )
    app.deliver("approval_gate", freeze)
    assert not app.commands.sent
    assert app.arm.acknowledged == [(observer.resource_id, EVENT_ID)]
