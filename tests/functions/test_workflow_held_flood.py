"""A VM that floods a pool with invented events never pushes out another VM's held event
(issue 23, suspected: a pool keeps a bounded list of held events, and the oldest went first).

web-1 is drained for its own event A, so web-2 is pool-a's last healthy member and web-2's own
event B is held. A compromised web-1 then invents more events naming web-2 than the pool keeps:
each is held. When A completes, B must still be there to be drained and prepared. Through the
real lb-pools function, the loopback ARM and blob storage; the bounds are made small so that the
flood stays short (the rule, not the number, is under test).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from emulators.fakes.arm import FakeArm, simulator_vm_id
from emulators.fakes.storage import FakeBlobStorage
from functions.adapters.pool_state import blob_name
from functions.lb_pools import held
from sebridge.contract.events import Observer
from tests.functions.support import POOL_CONTAINER, RG, SUB, App, envelope, web_vm

pytestmark = pytest.mark.timeout(120)

EVENT_A = "a0a0a0a0-0000-4000-8000-00000000000a"
EVENT_B = "b0b0b0b0-0000-4000-8000-00000000000b"


def flood_id(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-00000000f100"


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    return {
        "web-1": web_vm(arm_fake, "web-1", [pool]),
        "web-2": web_vm(arm_fake, "web-2", [pool]),
        "pool-a": pool,
    }


def held_now(storage: FakeBlobStorage, pool: str) -> dict[str, held.HeldEvent]:
    """The pool's held events by EventId (the state keys them by event and scope)."""
    raw = storage.blobs.get(POOL_CONTAINER, {}).get(blob_name(pool))
    return {e.event: e for e in held.read(json.loads(raw)).values()} if raw else {}


def test_a_flood_of_invented_events_never_evicts_an_honest_held_event(
    app: App,
    world: dict[str, str],
    storage_fake: FakeBlobStorage,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(held, "MAX_ENTRIES", 6)
    monkeypatch.setattr(held, "MAX_PER_OBSERVER", 3, raising=False)
    web_2 = Observer(
        vm_name="web-2",
        vm_id=simulator_vm_id("web-2"),
        resource_id=world["web-2"],
        subscription_id=SUB,
        resource_group=RG,
    )
    app.deliver("lb_pools", envelope("Scheduled", EventId=EVENT_A, Resources=["web-1"]))
    app.deliver("lb_pools", envelope("Scheduled", web_2, EventId=EVENT_B, Resources=["web-2"]))
    assert EVENT_B in held_now(storage_fake, world["pool-a"])

    for n in range(8):  # more than the pool keeps
        app.deliver("lb_pools", envelope("Scheduled", EventId=flood_id(n), Resources=["web-2"]))
    entries = held_now(storage_fake, world["pool-a"])
    assert EVENT_B in entries, "an honest held event was pushed out by the flood"
    assert len(entries) <= 6

    ended = envelope(
        "Completed", EventId=EVENT_A, Resources=["web-1"], EventStatus="Started", NotBefore=""
    )
    app.deliver("lb_pools", ended)
    prepared = [m.session_id for m in app.publisher.published if m.subject == "Prepared"]
    assert EVENT_B in prepared
    assert app.arm.vm_pools(world["web-2"]) == []


def test_the_bounds_take_from_the_observer_that_holds_the_most() -> None:
    """At the real bounds: a flooder keeps its newest MAX_PER_OBSERVER; when the pool is full,
    entries go from whoever holds the most, never from an observer with fewer."""
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 1, 1, tzinfo=UTC)

    def entry(observer: str, n: int) -> held.HeldEvent:
        return held.HeldEvent(
            f"{observer}-{n}", "m", {}, start + timedelta(seconds=n), None, observer
        )

    flood = [entry("rg/web-1", n) for n in range(100, 200)]
    honest = [entry(f"rg/vm-{k}", k) for k in range(held.MAX_ENTRIES)]  # older than the flood
    kept = held.bounded([*honest, *flood])
    assert len(kept) <= held.MAX_ENTRIES
    mine = sorted(e.event_id for e in kept if e.observer == "rg/web-1")
    assert len(mine) < held.MAX_PER_OBSERVER
    assert (
        len([e for e in kept if e.observer != "rg/web-1"])
        >= held.MAX_ENTRIES - held.MAX_PER_OBSERVER
    )
    alone = held.bounded([*honest[:3], *flood])
    assert {e.event_id for e in honest[:3]} <= {e.event_id for e in alone}
    assert sorted(e.event_id for e in alone if e.observer == "rg/web-1") == [
        f"rg/web-1-{n}" for n in range(200 - held.MAX_PER_OBSERVER, 200)
    ]


def test_a_wave_reported_by_one_observer_keeps_every_honest_held_event(
    make_app: Callable[..., App],
    arm_fake: FakeArm,
    storage_fake: FakeBlobStorage,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hostile review of issue 23, round two, break 8: a maintenance wave over one availability
    set of 22 VMs, one event each, every one reported first by web-1 (IMDS shows each member the
    set's events). The pool can spare one VM: one is drained, 21 held, and none is dropped for
    "holding more than its share"; when the first ends, the oldest held one drains."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    names = [f"web-{n}" for n in range(1, 23)]
    vms = {name: web_vm(arm_fake, name, [pool]) for name in names}
    app = make_app(LB_MIN_HEALTHY="21")
    ids = [str(uuid.UUID(int=n + 1, version=4)) for n in range(len(names))]
    for event_id, name in zip(ids, names, strict=True):
        app.deliver("lb_pools", envelope("Scheduled", EventId=event_id, Resources=[name]))
    assert set(held_now(storage_fake, pool)) == set(ids[1:])
    assert not [r for r in caplog.records if "dropped from the pool's list" in r.getMessage()]
    ended = envelope(
        "Completed", EventId=ids[0], Resources=[names[0]], EventStatus="Started", NotBefore=""
    )
    app.deliver("lb_pools", ended)
    assert [name for name in names if not arm_fake.vm_pools(vms[name])] == [names[1]]


def test_what_goes_first_is_the_latest_notbefore() -> None:
    """When an observer holds more than it can honestly report, the entries with the latest
    NotBefore go first (an invented event may name any; a wave's honest ones are due soon)."""
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def entry(n: int, due_in: timedelta) -> held.HeldEvent:
        body = {"data": {"Resources": ["web-2"]}}
        return held.HeldEvent(f"e-{n}", "m", body, start, start + due_in, "rg/web-1")

    soon = [entry(n, timedelta(minutes=10 + n)) for n in range(held.MAX_PER_OBSERVER)]
    far = [entry(100 + n, timedelta(days=6)) for n in range(5)]
    kept = held.bounded([*far, *soon])
    assert {e.event_id for e in kept} == {e.event_id for e in soon}
