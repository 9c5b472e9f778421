"""What lb-pools and the guard keep per event is the event's in its verified scope (hostile review
of issue 23, round two: breaks 1, 2 and 7).

The world of test_workflow_capacity_paths (web-1..3 in as-web and pool-a, rule http), and db-1:
a real VM of another availability set (as-db) that passes the scope check with its own vmId,
standing for a compromised VM of another set that knows as-web's EventIds. Whatever db-1 says of
an EventId reaches only what is kept for that EventId in as-db's scope: it never ends, forgets,
holds or blocks as-web's event (held lists, leaving members, the index of held events and the
NIC claims are all keyed ``<EventId>.<placement digest>``, functions.shared.verified).

And an early approval counts a VM as out only through a drain claimed for its own event: the
gate waits for lb-pools to claim a NIC another event took out, and an Approve link that goes
through claims it itself, so that the other event's end does not put the VM back while this
one has it down (break 2, "the borrowed drain").
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from emulators.fakes.arm import FakeArm, simulator_vm_id
from sebridge.contract.events import Envelope, Observer
from tests.functions.support import RG, SUB, App, envelope
from tests.functions.test_workflow_capacity_paths import (
    EVENT_A,
    EVENT_B,
    EVENT_C,
    MANUAL,
    VMS,
    approved,
    card_token,
    hold_c,
    http,
    scheduled,
    vm_side_prepared,
    world,  # noqa: F401 - the fixture
)
from tests.functions.test_workflow_event_now import E, prepared

pytestmark = pytest.mark.timeout(90)

EVENT_D = "d0d0d0d0-0000-4000-8000-00000000000d"
ENDED = {"EventStatus": "Started", "NotBefore": ""}


def db_1(arm: FakeArm, pools: list[str]) -> Observer:
    """db-1 of as-db, in ``pools``: verified with its own vmId, in another scope than as-web."""
    as_db = arm.add_availability_set(SUB, RG, "as-db")
    resource_id = arm.add_vm(SUB, RG, "db-1", pools, availability_set=as_db)
    return Observer(
        vm_name="db-1",
        vm_id=simulator_vm_id("db-1"),
        resource_id=resource_id,
        subscription_id=SUB,
        resource_group=RG,
        location="westeurope",
    )


def completed(event_id: str, vms: list[str], by: Observer | None = None) -> Envelope:
    return envelope("Completed", by, EventId=event_id, Resources=vms, **ENDED)


@pytest.mark.parametrize("forged", [False, True], ids=["control", "other-scope-cancels"])
def test_another_scope_cannot_end_a_held_event(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
    forged: bool,
) -> None:
    """Break 1a: db-1 sends Cancelled for as-web's held event C naming itself; when A ends, C
    is still held in pool-a and is resumed: web-3 drained, Prepared for C."""
    db = db_1(arm_fake, [])
    app = make_app(LB_MIN_HEALTHY="1")
    hold_c(app)
    if forged:
        app.deliver("lb_pools", envelope("Cancelled", db, EventId=EVENT_C, Resources=["db-1"]))
    app.deliver("lb_pools", completed(EVENT_A, ["web-1"]))
    assert arm_fake.vm_pools(world["web-3"]) == []
    assert EVENT_C in {m.session_id for m in prepared(app)}


@pytest.mark.parametrize("forged", [False, True], ids=["control", "other-scope-completes"])
def test_another_scope_cannot_end_an_early_approval(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
    forged: bool,
) -> None:
    """Break 1b: pool-a spans two sets (db-1 is a member), LB_MIN_HEALTHY=2. E is approved early
    through web-3's VM-side Prepared (web-3 leaving, still in the pool); db-1's Completed for E
    must not give web-3 back: A drains web-1, B is held (pool-a keeps web-2 and db-1)."""
    db = db_1(arm_fake, [world["pool-a"]])
    app = make_app(LB_MIN_HEALTHY="2")
    app.deliver("approval_gate", scheduled(E, ["web-3"]))
    app.deliver("approval_gate", vm_side_prepared(world, E, "web-3"))
    assert approved(app, E)
    if forged:
        app.deliver("lb_pools", completed(E, ["db-1"], by=db))
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    app.deliver("lb_pools", scheduled(EVENT_B, ["web-2"]))
    serving = [vm for vm in ("web-1", "web-2") if arm_fake.vm_pools(world[vm])] + ["db-1"]
    assert len(serving) >= 2, f"pool-a serves with {serving} (web-3 is in maintenance)"
    assert [m.subject for m in app.publisher.published].count("Held") == 1


@pytest.mark.parametrize("forged", [False, True], ids=["control", "other-scope-holds"])
def test_a_hold_in_another_scope_does_not_block_an_early_approval(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
    forged: bool,
) -> None:
    """Break 7: db-1, the only member of pool-db, sends Scheduled for as-web's E naming itself:
    held in pool-db, but in as-db's scope; as-web's E, drained and Prepared, is approved."""
    lb_db = arm_fake.add_load_balancer(SUB, RG, "lb-db", ["pool-db"], rules={"sql": "pool-db"})
    db = db_1(arm_fake, [f"{lb_db}/backendAddressPools/pool-db"])
    app = make_app(LB_MIN_HEALTHY="1")
    app.deliver("approval_gate", scheduled(E, ["web-1"]))  # waits for the drain
    app.deliver("lb_pools", scheduled(E, ["web-1"]))  # drains web-1, Prepared
    if forged:
        app.deliver("lb_pools", scheduled(E, ["db-1"], by=db))
        assert [m.subject for m in app.publisher.published].count("Held") == 1
    app.deliver("approval_gate", prepared(app)[0])
    assert approved(app, E)


def test_an_early_approval_does_not_borrow_another_events_drain(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
) -> None:
    """Break 2: A drained web-1; B (web-1 too) reaches the gate before lb-pools. The gate must
    not approve B on A's drain: A's end would put web-1 back under B's maintenance. B is
    approved once lb-pools claimed web-1 for B too, and A's end then leaves web-1 out."""
    app = make_app(LB_MIN_HEALTHY="1")  # the default policy: approve-when-prepared
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    app.deliver("approval_gate", scheduled(EVENT_B, ["web-1"]))
    assert not approved(app, EVENT_B)
    app.deliver("lb_pools", scheduled(EVENT_B, ["web-1"]))  # claims web-1 for B, Prepared
    (for_b,) = [m for m in prepared(app) if m.session_id == EVENT_B]
    app.deliver("approval_gate", for_b)
    assert approved(app, EVENT_B)
    app.deliver("lb_pools", completed(EVENT_A, ["web-1"]))
    assert arm_fake.vm_pools(world["web-1"]) == []  # B still has it down
    app.deliver("lb_pools", scheduled(EVENT_C, ["web-2"]))
    app.deliver("lb_pools", scheduled(EVENT_D, ["web-3"]))
    assert [vm for vm in VMS if arm_fake.vm_pools(world[vm])] == ["web-3"]


def test_an_approve_link_claims_the_drain_it_relies_on(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
) -> None:
    """Break 2 through the Approve link (MANUAL policy): B approved while web-1 is out for A.
    The approval claims web-1's NIC for B, so A's end leaves web-1 out while B has it down,
    and the pool never serves with fewer than one healthy member."""
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=MANUAL)
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    message = scheduled(EVENT_B, ["web-1"])
    token = card_token(app, message)
    app.deliver("approval_gate", message)
    assert app.call("approve", http("POST", token, EVENT_B)).status_code == 200
    assert approved(app, EVENT_B)
    app.deliver("lb_pools", completed(EVENT_A, ["web-1"]))
    assert arm_fake.vm_pools(world["web-1"]) == []
    app.deliver("lb_pools", scheduled(EVENT_C, ["web-2"]))
    app.deliver("lb_pools", scheduled(EVENT_D, ["web-3"]))
    assert [vm for vm in VMS if arm_fake.vm_pools(world[vm])] == ["web-3"]
    app.deliver("lb_pools", completed(EVENT_B, ["web-1"]))  # B's end puts web-1 back
    assert arm_fake.vm_pools(world["web-1"]) == [world["pool-a"]]
