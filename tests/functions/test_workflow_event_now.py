"""Decide by what the event names now, never by what a message or a token happened to carry
(hostile review of issue 23, breaks 1, 2 and 5).

- A late Prepared: lb-pools drains web-1 for E and publishes Prepared [web-1]; an Updated grows
  E to the whole availability set. The gate got the Updated and waited; then the earlier Prepared
  came and it approved E, which starts maintenance on all three VMs (IMDS releases every VM
  listed then) while web-2 and web-3 were healthy members of their pool.
- An Approve link from the card of E's Scheduled (its token names web-1) approved E after the
  Updated, held by lb-pools.
- An Updated that moves a held event to other VMs left its held entry in the first pool; when
  that pool got members back, the stale entry drained a VM the event no longer named, and
  nothing ever restored it.

Real function objects, the loopback ARM and blob storage. The world of
test_workflow_capacity_paths: web-1, web-2, web-3 in as-web and pool-a, LB_MIN_HEALTHY=1.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import pytest

from emulators.fakes.arm import FakeArm
from sebridge.contract.events import Envelope, Transition, event_message
from tests.fixtures import golden
from tests.functions.support import RG, SUB, App, envelope, event, web_vm
from tests.functions.test_workflow_capacity_paths import (
    APPROVE_ALL,
    EVENT_A,
    EVENT_B,
    EVENT_C,
    MANUAL,
    VMS,
    approved,
    card_token,
    http,
    scheduled,
    world,  # noqa: F401 - a fixture, found by name
)

pytestmark = pytest.mark.timeout(60)

E = "e0e0e0e0-0000-4000-8000-00000000000e"


def updated(event_id: str, before: list[str], after: list[str]) -> Envelope:
    return event_message(
        Transition.UPDATED,
        event(EventId=event_id, Resources=after),
        golden.OBSERVER,
        12,
        golden.OBSERVED_AT,
        changes={"Resources": {"from": before, "to": after}},
    )


def prepared(app: App) -> list[Envelope]:
    return [m for m in app.publisher.published if m.subject == "Prepared"]


@pytest.mark.parametrize("held_first", [True, False], ids=["held-first", "gate-first"])
def test_a_late_prepared_does_not_approve_what_the_event_names_now(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    held_first: bool,
) -> None:
    """Default policy. held-first: lb-pools held the Updated before the Prepared reaches the
    gate (the event is held in pool-a). gate-first: the gate has the Updated, lb-pools has not
    decided it yet (the end-to-end race: ARM was slow on web-1's NIC)."""
    app = make_app(LB_MIN_HEALTHY="1")
    app.deliver("lb_pools", scheduled(E, ["web-1"]))
    (late,) = prepared(app)
    grown = updated(E, ["web-1"], list(VMS))
    if held_first:
        app.deliver("lb_pools", grown)
        assert [m.subject for m in app.publisher.published].count("Held") == 1
    app.deliver("approval_gate", grown)
    assert not approved(app, E)
    app.deliver("approval_gate", late)
    assert not approved(app, E), "approved: web-2 and web-3 are healthy members of pool-a"


def test_the_event_is_approved_once_every_vm_it_names_is_out(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
) -> None:
    """The promise the other way: with room in the pool (web-4 joins pool-a), lb-pools drains
    the grown event and its Prepared approves it."""
    web_vm(arm_fake, "web-4", [world["pool-a"]])
    app = make_app(LB_MIN_HEALTHY="1")
    app.deliver("lb_pools", scheduled(E, ["web-1"]))
    grown = updated(E, ["web-1"], ["web-1", "web-2"])
    app.deliver("approval_gate", grown)
    app.deliver("approval_gate", prepared(app)[0])
    assert not approved(app, E)  # web-2 is still in the pool
    app.deliver("lb_pools", grown)
    app.deliver("approval_gate", prepared(app)[-1])
    assert approved(app, E)


@pytest.mark.parametrize("held", [True, False], ids=["held", "not-decided-yet"])
def test_an_old_link_does_not_approve_what_the_event_names_now(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    held: bool,
) -> None:
    """The card of E's Scheduled names web-1; after the Updated the link must not approve."""
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=MANUAL)
    first = scheduled(E, ["web-1"])
    app.deliver("lb_pools", first)
    token = card_token(app, first)
    grown = updated(E, ["web-1"], list(VMS))
    app.deliver("approval_gate", grown)  # the gate notes what the event names now
    if held:
        app.deliver("lb_pools", grown)
    response = app.call("approve", http("POST", token, E))
    assert response.status_code == 409, response.get_body()[:300]
    assert not approved(app, E)


def test_an_updated_that_moves_a_held_event_leaves_no_stale_entry(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C is held in pool-a (web-3 is its last healthy member). An Updated moves C to web-4
    (pool-b), which drains. When A completes and pool-a gets web-1 back, nothing may drain web-3
    for C: C no longer names it, and C's Completed restores only web-4."""
    lb_api = arm_fake.add_load_balancer(SUB, RG, "lb-api", ["pool-b"], rules={"api": "pool-b"})
    pool_b = f"{lb_api}/backendAddressPools/pool-b"
    web_4, _ = web_vm(arm_fake, "web-4", [pool_b]), web_vm(arm_fake, "web-5", [pool_b])
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=APPROVE_ALL)
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    app.deliver("lb_pools", scheduled(EVENT_B, ["web-2"]))
    app.deliver("lb_pools", scheduled(EVENT_C, ["web-3"]))
    assert [m.subject for m in app.publisher.published].count("Held") == 1
    app.deliver("lb_pools", updated(EVENT_C, ["web-3"], ["web-4"]))
    assert arm_fake.vm_pools(web_4) == []
    caplog.set_level(logging.INFO)
    done = {"EventStatus": "Started", "NotBefore": ""}
    app.deliver("lb_pools", envelope("Completed", EventId=EVENT_A, Resources=["web-1"], **done))
    assert arm_fake.vm_pools(world["web-3"]) == [world["pool-a"]], "drained for a stale entry"
    app.deliver("lb_pools", envelope("Completed", EventId=EVENT_C, Resources=["web-4"], **done))
    assert arm_fake.vm_pools(web_4) == [pool_b]
    assert arm_fake.vm_pools(world["web-3"]) == [world["pool-a"]]


# lb-pools' wait for restored members to be probed Up: 0.5 s, looking every 0.1 s.
SHORT_SETTLE = {"restore_settle_seconds": 0.5, "restore_settle_poll_seconds": 0.1}


def held_in(app: App, pool: str, event_id: str) -> bool:
    from functions.adapters.pool_state import blob_name
    from functions.lb_pools import held
    from tests.functions.support import POOL_CONTAINER

    assert app.storage is not None
    raw = app.storage.blobs.get(POOL_CONTAINER, {}).get(blob_name(pool))
    return raw is not None and event_id in {e.event for e in held.read(json.loads(raw)).values()}


@pytest.fixture
def pool_b(arm_fake: FakeArm) -> dict[str, str]:
    lb_api = arm_fake.add_load_balancer(SUB, RG, "lb-api", ["pool-b"], rules={"api": "pool-b"})
    pool = f"{lb_api}/backendAddressPools/pool-b"
    return {"pool-b": pool, "web-4": web_vm(arm_fake, "web-4", [pool])}


def test_an_event_held_again_elsewhere_is_held_only_there(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    pool_b: dict[str, str],
) -> None:
    """Found by test_workflow_events_stateful: C is held in pool-b (web-4 is its only member),
    then moved to web-3, the last healthy member of pool-a: held there. The index of held events
    kept only the last pool, so the entry in pool-b was never dropped."""
    app = make_app(LB_MIN_HEALTHY="1")
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    app.deliver("lb_pools", scheduled(EVENT_B, ["web-2"]))
    app.deliver("lb_pools", scheduled(EVENT_C, ["web-4"]))
    assert held_in(app, pool_b["pool-b"], EVENT_C)
    app.deliver("lb_pools", updated(EVENT_C, ["web-4"], ["web-3"]))
    assert held_in(app, world["pool-a"], EVENT_C)
    assert not held_in(app, pool_b["pool-b"], EVENT_C), "still held where it names nothing"


def hold_c_behind_web_5(app: App, arm_fake: FakeArm, pool_b: dict[str, str]) -> str:
    """web-5 joins pool-b; A drains web-4, so C, on web-5, is held (web-5 is pool-b's last
    healthy member); then web-4 is probed Down, to come back Down when A ends. web-5's id."""
    web_5 = web_vm(arm_fake, "web-5", [pool_b["pool-b"]])
    arm_fake.set_probe(pool_b["web-4"], up=True)
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-4"]))  # web-4 out: web-5 serves
    app.deliver("lb_pools", scheduled(EVENT_C, ["web-5"]))  # held: web-5 is the last member
    assert held_in(app, pool_b["pool-b"], EVENT_C)
    arm_fake.set_probe(pool_b["web-4"], up=False)
    return web_5


def test_a_held_event_that_ends_is_forgotten_where_it_was_held(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    pool_b: dict[str, str],
    arm_fake: FakeArm,
) -> None:
    """Found by test_workflow_events_stateful: C is held in pool-b; then web-4 leaves pool-b for
    another event (probed Down: it leaves without counting); C is cancelled. Its end looked for
    its entry only in the pools web-4 is in now (none), and left it held for good."""
    # web-4 comes back Down and stays so: lb-pools waits for it to be probed Up, here 0.5 s
    # (60 s in the app), then leaves C held.
    app = make_app(LB_MIN_HEALTHY="1", overrides=SHORT_SETTLE)
    arm_fake.set_probe(world["web-1"], up=True)
    web_5 = hold_c_behind_web_5(app, arm_fake, pool_b)
    done = {"EventStatus": "Started", "NotBefore": ""}
    # A ends: web-4 goes back (Down); D takes web-5 out while web-4 cannot serve either way...
    app.deliver("lb_pools", envelope("Completed", EventId=EVENT_A, Resources=["web-4"], **done))
    arm_fake.set_probe(pool_b["web-4"], up=False)
    arm_fake.set_probe(web_5, up=False)
    app.deliver("lb_pools", scheduled(EVENT_B, ["web-5"]))  # web-5 Down: leaves without counting
    assert arm_fake.vm_pools(web_5) == []
    app.deliver("lb_pools", envelope("Cancelled", EventId=EVENT_C, Resources=["web-5"]))
    assert not held_in(app, pool_b["pool-b"], EVENT_C), "a cancelled event still held"


def test_a_restored_member_probed_up_during_the_wait_lets_a_held_event_drain_at_once(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    pool_b: dict[str, str],
    arm_fake: FakeArm,
) -> None:
    """The wait after a restore: web-4 comes back Down, C is held because web-5 is pool-b's
    last healthy member; web-4 is probed Up 0.3 s into the wait, and the same Completed drains
    web-5 for C then, without waiting out the rest of its 10 s."""
    app = make_app(
        LB_MIN_HEALTHY="1",
        overrides={"restore_settle_seconds": 10.0, "restore_settle_poll_seconds": 0.05},
    )
    web_5 = hold_c_behind_web_5(app, arm_fake, pool_b)  # web-4 will come back Down...
    comes_up = threading.Timer(0.3, arm_fake.set_probe, (pool_b["web-4"],), {"up": True})
    comes_up.start()  # ...and is probed Up 0.3 s later
    started = time.monotonic()
    try:
        done = {"EventStatus": "Started", "NotBefore": ""}
        app.deliver("lb_pools", envelope("Completed", EventId=EVENT_A, Resources=["web-4"], **done))
    finally:
        comes_up.cancel()
    took = time.monotonic() - started
    assert not held_in(app, pool_b["pool-b"], EVENT_C), "C still held after web-4 came Up"
    assert arm_fake.vm_pools(web_5) == [], "C resumed but web-5 was not drained"
    assert pool_b["pool-b"].lower() in [p.lower() for p in arm_fake.vm_pools(pool_b["web-4"])]
    assert 0.3 <= took < 5.0, f"the Completed took {took:.2f} s: it did not wait, or waited on"
