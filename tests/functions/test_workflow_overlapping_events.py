"""Several events on one VM at once: one event's end never undoes another's drain (hostile
review of issue 23, break 3).

IMDS can show a VM two events at once (the packaged multiple-events.json scenario has a Freeze
and a Reboot of one VM). The NIC's record used to merge the pools of every event and restore
them all at the first end: a Freeze's Completed put web-1 back while its Reboot was still
scheduled, another drain counted web-1 as capacity, and web-1 rebooted in its pool. Now the NIC
says which events have it out (their claims, functions.lb_pools.nic_pools), and the pools go
back only when the last live claim ends.

The world of test_workflow_capacity_paths: web-1, web-2, web-3 in as-web and pool-a. Real
function objects, the loopback ARM and blob storage.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from functions.lb_pools import nic_pools
from functions.shared.event_record import event_of
from sebridge.contract.events import Envelope, Transition, event_message
from tests.fixtures import golden
from tests.functions.support import App, envelope, event
from tests.functions.test_workflow_capacity_paths import (
    MANUAL,
    observer,
    scheduled,
    world,  # noqa: F401 - a fixture, found by name
)

pytestmark = pytest.mark.timeout(60)

REBOOT = "11111111-0000-4000-8000-000000000001"  # Reboot of web-1, NotBefore ahead
FREEZE = "22222222-0000-4000-8000-000000000002"  # Freeze of web-1, unknown duration: drains
OTHER = "33333333-0000-4000-8000-000000000003"  # another event, draining web-3


def started(event_id: str, vms: list[str], **fields: Any) -> Envelope:
    return envelope(
        "Started", EventId=event_id, Resources=vms, EventStatus="Started", NotBefore="", **fields
    )


def ended(transition: str, event_id: str, vms: list[str], **fields: Any) -> Envelope:
    status = {"EventStatus": "Started", "NotBefore": ""} if transition == "Completed" else {}
    return envelope(transition, EventId=event_id, Resources=vms, **{**status, **fields})


def nic_of(world: dict[str, str], vm: str) -> str:  # noqa: F811 - the fixture's value
    compute, network = "Microsoft.Compute/virtualMachines", "Microsoft.Network/networkInterfaces"
    return world[vm].replace(compute, network) + "-nic"


def freeze(transition: str) -> Envelope:
    fields = {"EventType": "Freeze", "DurationInSeconds": -1}
    if transition == "Scheduled":
        return scheduled(FREEZE, ["web-1"], **fields)
    if transition == "Started":
        return started(FREEZE, ["web-1"], **fields)
    return ended(transition, FREEZE, ["web-1"], **fields)


def test_the_end_of_one_event_keeps_the_vm_out_for_another(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    """The review's case, LB_MIN_HEALTHY=2: the Reboot drains web-1; the Freeze of web-1
    starts and completes; the Reboot must still have web-1 out, so OTHER (web-3) is held (web-2
    and web-3 are the two healthy members), and the Reboot's Started finds web-1 out."""
    app = make_app(LB_MIN_HEALTHY="2", APPROVAL_POLICY=MANUAL)
    app.deliver("lb_pools", scheduled(REBOOT, ["web-1"], EventType="Reboot"))
    assert app.arm.vm_pools(world["web-1"]) == []
    for transition in ("Scheduled", "Started", "Completed"):
        app.deliver("lb_pools", freeze(transition))
    assert app.arm.vm_pools(world["web-1"]) == [], "the Freeze's end put web-1 back"
    app.deliver("lb_pools", scheduled(OTHER, ["web-3"], observer(world, "web-3")))
    assert app.arm.vm_pools(world["web-3"]) == [world["pool-a"]], "web-1 counted as capacity"
    assert [m.subject for m in app.publisher.published].count("Held") == 1
    app.deliver("lb_pools", started(REBOOT, ["web-1"], EventType="Reboot"))
    assert app.arm.vm_pools(world["web-1"]) == []
    # The Reboot ends: now web-1 goes back (and OTHER, held, is tried again and drained).
    app.deliver("lb_pools", ended("Completed", REBOOT, ["web-1"], EventType="Reboot"))
    assert app.arm.vm_pools(world["web-1"]) == [world["pool-a"]]
    assert app.arm.vm_pools(world["web-3"]) == []


@pytest.mark.parametrize("end", ["Cancelled", "Updated"])
def test_a_cancelled_or_dropped_event_keeps_the_vm_out_for_another(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    end: str,
) -> None:
    """The other ways one event lets a VM go (its Cancelled; an Updated that drops the VM from
    its Resources) follow the same claims."""
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=MANUAL)
    app.deliver("lb_pools", scheduled(REBOOT, ["web-1"], EventType="Reboot"))
    app.deliver("lb_pools", scheduled(FREEZE, ["web-1", "web-2"], EventType="Redeploy"))
    if end == "Cancelled":
        app.deliver("lb_pools", ended("Cancelled", FREEZE, ["web-1", "web-2"]))
    else:
        dropped = event_message(
            Transition.UPDATED,
            event(EventId=FREEZE, Resources=["web-2"], EventType="Redeploy"),
            golden.OBSERVER,
            12,
            golden.OBSERVED_AT,
            changes={"Resources": {"from": ["web-1", "web-2"], "to": ["web-2"]}},
        )
        app.deliver("lb_pools", dropped)
    assert app.arm.vm_pools(world["web-1"]) == [], "web-1 back while the Reboot has it out"
    if end == "Cancelled":
        assert app.arm.vm_pools(world["web-2"]) == [world["pool-a"]]
    app.deliver("lb_pools", ended("Cancelled", REBOOT, ["web-1"], EventType="Reboot"))
    assert app.arm.vm_pools(world["web-1"]) == [world["pool-a"]]


def test_a_claim_whose_time_passed_does_not_keep_the_vm_out_for_ever(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
) -> None:
    """The Reboot's Completed was lost. Its claim lasts until its NotBefore, its duration (an
    hour when unknown) and half an hour of margin; the Freeze that ends after that brings web-1
    back instead of keeping it out for good."""
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=MANUAL)
    app.deliver("lb_pools", scheduled(REBOOT, ["web-1"], EventType="Reboot"))
    app.deliver("lb_pools", freeze("Scheduled"))
    claims = nic_pools.decode_claims(arm_fake.nic(nic_of(world, "web-1"))["tags"])
    # each claim names its event in its verified scope: <EventId>.<placement digest>
    assert claims is not None and {event_of(ref) for ref in claims} == {REBOOT, FREEZE}
    app.clock.now = app.clock.now.replace(year=app.clock.now.year + 1)
    app.deliver("lb_pools", freeze("Completed"))
    assert app.arm.vm_pools(world["web-1"]) == [world["pool-a"]]


def test_a_record_from_before_claims_is_restored_by_the_first_end(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
) -> None:
    """A NIC drained by an older version carries a record without claims: its first end puts
    it back, as that version promised."""
    app = make_app(LB_MIN_HEALTHY="1")
    app.deliver("lb_pools", scheduled(REBOOT, ["web-1"], EventType="Reboot"))
    nic_id = nic_of(world, "web-1")
    with arm_fake.lock:
        tags = arm_fake.resources[nic_id.lower()]["tags"]
        for name in nic_pools.CLAIM_TAG_NAMES:
            tags.pop(name, None)
    app.deliver("lb_pools", ended("Completed", FREEZE, ["web-1"], EventType="Freeze"))
    assert app.arm.vm_pools(world["web-1"]) == [world["pool-a"]]
    assert not {k for k in arm_fake.nic(nic_id)["tags"] if k.startswith("sebridge-")}


def test_the_claims_say_which_events_have_the_nic_out(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
) -> None:
    """What an operator reads on the NIC: the removed pools, and for which events until when."""
    app = make_app(LB_MIN_HEALTHY="1")
    app.deliver("lb_pools", scheduled(REBOOT, ["web-1"], EventType="Reboot"))
    app.deliver("lb_pools", freeze("Scheduled"))
    tags = arm_fake.nic(nic_of(world, "web-1"))["tags"]
    assert tags["owner"] == "web-team"  # the NIC's own tags stay
    assert tags[nic_pools.TAG] == "ipconfig1=lb-web/pool-a"
    refs = [claim.partition("@")[0] for claim in tags[nic_pools.CLAIMS_TAG].split(",")]
    assert [event_of(ref) for ref in refs] == sorted([REBOOT, FREEZE])
    writes = len(arm_fake.writes())
    app.deliver("lb_pools", freeze("Scheduled"))  # a replay writes nothing
    app.deliver("lb_pools", freeze("Started"))  # nor does its Started
    assert len(arm_fake.writes()) == writes, json.dumps([r.path for r in arm_fake.writes()])
