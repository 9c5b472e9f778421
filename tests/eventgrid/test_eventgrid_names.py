"""One set of Azure name rules for the ingestion and the scope check (issue 23, finding 5).

An availability set may be named with up to 80 characters. The ingestion accepted such a name
and published the sealed Scheduled, and the scope check of lb-pools and the gate refused it
("longer than 64 characters") as a security event: the VMs were never drained, the event never
approved, and operators got a false alarm. Through the real function objects, the loopback ARM
and storage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from emulators.fakes.eventgrid import notification, scheduled_event_id
from emulators.functions_host.eventgrid import to_function_event
from sebridge.contract.events import parse_message
from tests.eventgrid.conftest import STATE_CONTAINER
from tests.eventgrid.support import T0, properties
from tests.functions.support import RG, SUB, App

pytestmark = pytest.mark.timeout(60)

EVENT = "5a5a5a5a-0000-4000-8000-00000000005a"


def long_name(length: int) -> str:
    return ("as-" + "web" * 30)[: length - 1] + "1"


@pytest.mark.parametrize("length", [65, 72, 80])
def test_an_availability_set_of_up_to_80_characters_is_drained_and_approved(
    make_app: Callable[..., App],
    arm_fake: FakeArm,
    state_storage: FakeConditionalBlobStorage,
    caplog: pytest.LogCaptureFixture,
    length: int,
) -> None:
    name = long_name(length)
    availability_set = arm_fake.add_availability_set(SUB, RG, name)
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    vms = {
        vm: arm_fake.add_vm(SUB, RG, vm, [pool], availability_set=availability_set)
        for vm in ("web-1", "web-2", "web-3")
    }
    app = make_app(
        EVENTGRID_INGEST_ENABLED="true",
        EVENTGRID_STATE_URL=state_storage.container_url(STATE_CONTAINER),
    )
    props = properties(EventId=EVENT, Resources=["web-1"])
    body = notification(
        props,
        resource_id=scheduled_event_id(SUB, RG, name, EVENT, "availabilitySets"),
        event_time=T0,
    )
    app.call("eventgrid_ingest", to_function_event(body, "eventgrid_ingest"))
    (scheduled,) = app.publisher.published
    assert parse_message(scheduled.body_bytes()).observer.vm_name == name

    app.deliver("lb_pools", scheduled)
    assert arm_fake.vm_pools(vms["web-1"]) == [], "the VM was not drained"
    prepared = [m for m in app.publisher.published if m.subject == "Prepared"]
    assert len(prepared) == 1

    app.deliver("approval_gate", prepared[0])
    assert arm_fake.acknowledged == [(availability_set, EVENT)]
    refusals = [r for r in caplog.records if getattr(r, "securityEvent", False)]
    assert not refusals, [r.getMessage() for r in refusals]


def test_a_name_longer_than_azure_allows_is_refused_alike(
    make_app: Callable[..., App],
    arm_fake: FakeArm,
    state_storage: FakeConditionalBlobStorage,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """81 characters: the ingestion refuses it (a security event), nothing is published."""
    app = make_app(
        EVENTGRID_INGEST_ENABLED="true",
        EVENTGRID_STATE_URL=state_storage.container_url(STATE_CONTAINER),
    )
    caplog.set_level(logging.INFO)
    name = long_name(81)
    body: dict[str, Any] = notification(
        properties(EventId=EVENT, Resources=["web-1"]),
        resource_id=scheduled_event_id(SUB, RG, name, EVENT, "availabilitySets"),
        event_time=T0,
    )
    app.call("eventgrid_ingest", to_function_event(body, "eventgrid_ingest"))
    assert not app.publisher.published
    assert "breaks Azure's naming rules" in caplog.text


@pytest.mark.parametrize("group", ["rg(web)", "rg-wéb"])
def test_a_uniform_scale_set_in_a_group_with_parentheses_or_unicode_is_acknowledged(
    make_app: Callable[..., App],
    arm_fake: FakeArm,
    state_storage: FakeConditionalBlobStorage,
    caplog: pytest.LogCaptureFixture,
    group: str,
) -> None:
    """Azure allows ``(``, ``)`` and Unicode letters in resource group names; the ARM client
    percent-encodes them in paths, and ARM (the fake too) decodes them. The Uniform instance's
    scale set must be compared by its id as ARM spells it: before, it was built from the quoted
    path (``rg%28web%29``), and the sealed Event Grid message was refused as a security event
    (hostile review of issue 23, break 8)."""
    lb = arm_fake.add_load_balancer(SUB, group, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    scale_set = arm_fake.add_scale_set(SUB, group, "web", orchestration="Uniform")
    for instance in ("0", "1", "2"):
        arm_fake.add_vmss_instance(SUB, group, "web", instance, [pool])
    app = make_app(
        EVENTGRID_INGEST_ENABLED="true",
        EVENTGRID_STATE_URL=state_storage.container_url(STATE_CONTAINER),
        APPROVAL_POLICY='{"rules": [], "default": "approve"}',
    )
    props = properties(EventId=EVENT, Resources=["web_0"], EventType="Freeze", DurationInSeconds=2)
    body = notification(
        props,
        resource_id=scheduled_event_id(SUB, group, "web", EVENT, "virtualMachineScaleSets"),
        event_time=T0,
    )
    app.call("eventgrid_ingest", to_function_event(body, "eventgrid_ingest"))
    (scheduled,) = app.publisher.published
    app.deliver("approval_gate", scheduled)
    refusals = [r.getMessage() for r in caplog.records if getattr(r, "securityEvent", False)]
    assert not refusals
    assert arm_fake.acknowledged == [(scale_set, EVENT)]


@pytest.mark.parametrize("other_up", [False, True])
def test_a_vm_named_like_its_availability_set_is_the_vm(
    make_app: Callable[..., App],
    arm_fake: FakeArm,
    state_storage: FakeConditionalBlobStorage,
    caplog: pytest.LogCaptureFixture,
    other_up: bool,
) -> None:
    """ARM allows a VM and its availability set one name (different resource types). Event Grid
    names the set as the observer and the VM in Resources: the VM must be looked up as a VM.
    Before, the scope check took it for the observer (the set: no NICs), so lb-pools drained
    nothing, published Prepared, and the event was acknowledged while the VM was the pool's last
    healthy member (hostile review of issue 23, break 4)."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-app", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    availability_set = arm_fake.add_availability_set(SUB, RG, "app")
    app_vm = arm_fake.add_vm(SUB, RG, "app", [pool], availability_set=availability_set)
    other = arm_fake.add_vm(SUB, RG, "app-2", [pool], availability_set=availability_set)
    arm_fake.set_probe(other, up=other_up)
    app = make_app(
        LB_MIN_HEALTHY="1",
        EVENTGRID_INGEST_ENABLED="true",
        EVENTGRID_STATE_URL=state_storage.container_url(STATE_CONTAINER),
    )
    body = notification(
        properties(EventId=EVENT, Resources=["app"]),
        resource_id=scheduled_event_id(SUB, RG, "app", EVENT, "availabilitySets"),
        event_time=T0,
    )
    app.call("eventgrid_ingest", to_function_event(body, "eventgrid_ingest"))
    (scheduled,) = app.publisher.published
    app.deliver("lb_pools", scheduled)
    app.deliver("approval_gate", scheduled)
    for message in [m for m in app.publisher.published if m.subject == "Prepared"]:
        app.deliver("approval_gate", message)
    subjects = [m.subject for m in app.publisher.published]
    if other_up:  # app-2 serves: the VM "app" may go, and goes once drained
        assert arm_fake.vm_pools(app_vm) == [] and subjects.count("Prepared") == 1
        assert set(arm_fake.acknowledged) == {(availability_set, EVENT)}
    else:  # "app" is the last healthy member: held, never acknowledged early
        assert arm_fake.vm_pools(app_vm) == [pool]
        assert "Held" in subjects and "Prepared" not in subjects
        assert not arm_fake.acknowledged
    refusals = [r for r in caplog.records if getattr(r, "securityEvent", False)]
    assert not refusals
