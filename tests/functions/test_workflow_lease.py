"""A lease renewal that hangs longer than the lease (issue 23, suspected): writes go on only
while the pool's lease is provably held.

The Blob service (the loopback fake) stalls every renewal, and the clock the lease is measured
by (the fake's and the store's, one controllable clock) passes the lease's end: another instance
may take the pool. Before, nothing had failed yet, so ``check`` passed and lb-pools went on
writing NICs under a lease it no longer held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from functions.adapters.arm import ArmRestClient
from functions.adapters.arm_cache import CachedVmReads
from functions.adapters.pool_state import BlobPoolStore, LeaseLost
from functions.adapters.retry import TransientHttpError
from functions.lb_pools.core import LbPools
from functions.lb_pools.guard import CapacityGuard
from functions.shared import write_window
from functions.shared.impact import DEFAULT_RULES
from functions.shared.vms import ResolvedVm
from sebridge.contract.events import parse_message
from tests.functions.support import (
    NOW,
    POOL_CONTAINER,
    RG,
    SUB,
    RecordingPublisher,
    envelope,
    web_vm,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

LEASE = 15
EVENT_1 = "e1e1e1e1-0000-4000-8000-0000000000e1"
EVENT_2 = "e2e2e2e2-0000-4000-8000-0000000000e2"
LB = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/loadBalancers/lb"
POOL = f"{LB}/backendAddressPools/p"


class Clock:
    """Monotonic seconds that move when the test says so (and with real time otherwise)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock(storage_fake: FakeBlobStorage) -> Iterator[Clock]:
    clock = Clock()
    storage_fake.clock = clock
    yield clock
    storage_fake.release()


def store(storage_fake: FakeBlobStorage, clock: Clock) -> BlobPoolStore:
    return BlobPoolStore(
        storage_fake.container_url(POOL_CONTAINER),
        ManagedIdentityCredential(),
        lease_seconds=LEASE,
        renew_every=0.05,
        monotonic=clock,
    )


def test_a_lease_whose_renewal_hangs_past_its_end_is_not_held(
    storage_fake: FakeBlobStorage, identity_fake: FakeIdentity, clock: Clock
) -> None:
    first = store(storage_fake, clock)
    second = BlobPoolStore(
        storage_fake.container_url(POOL_CONTAINER), ManagedIdentityCredential(), acquire_timeout=5
    )
    with first.hold([POOL]) as lease:
        lease.check()
        storage_fake.hang("renew")
        wait_until(lambda: storage_fake.hanging >= 1, 10, "a renewal stalled in the service")
        clock.advance(LEASE + 1)  # the Blob service lets the lease expire
        with second.hold([POOL]):  # and another instance takes the pool
            with pytest.raises(LeaseLost, match="no longer"):
                lease.check()
        storage_fake.release()


def test_nic_writes_stop_when_the_lease_cannot_be_proven_held(
    arm_fake: FakeArm,
    storage_fake: FakeBlobStorage,
    identity_fake: FakeIdentity,
    clock: Clock,
) -> None:
    """One event, two VMs, one lease: while the first NIC is written the renewals stall and the
    lease runs out. The second NIC must not be written under it (the message is redelivered)."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    vms = {vm: web_vm(arm_fake, vm, [pool]) for vm in ("web-1", "web-2", "web-3")}
    credential = ManagedIdentityCredential()
    lb_pools = LbPools(
        CachedVmReads(ArmRestClient(arm_fake.url, credential)),
        RecordingPublisher(),
        DEFAULT_RULES,
        pools=store(storage_fake, clock),
        min_healthy=1,
    )

    def lease_runs_out(_: str) -> None:
        arm_fake.on_change = None
        storage_fake.hang("renew")
        clock.advance(LEASE + 1)

    arm_fake.on_change = lease_runs_out
    message = envelope("Scheduled", Resources=["web-1", "web-2"])
    with pytest.raises(LeaseLost):
        lb_pools.handle(parse_message(message.body_bytes()), NOW)
    left = [vm for vm, vm_id in vms.items() if not arm_fake.vm_pools(vm_id)]
    assert left == ["web-1"], f"NICs written after the lease ran out: {left}"


def lb_pools_instance(
    arm_fake: FakeArm, storage_fake: FakeBlobStorage, clock: Clock, sleep: Any = time.sleep
) -> LbPools:
    credential = ManagedIdentityCredential()
    return LbPools(
        CachedVmReads(ArmRestClient(arm_fake.url, credential, sleep=sleep)),
        RecordingPublisher(),
        DEFAULT_RULES,
        pools=store(storage_fake, clock),
        min_healthy=1,
    )


def test_a_throttled_nic_write_is_not_retried_after_the_lease_lapsed(
    arm_fake: FakeArm,
    storage_fake: FakeBlobStorage,
    identity_fake: FakeIdentity,
    clock: Clock,
) -> None:
    """Hostile review of issue 23, break 6. A drains web-1: ARM answers its NIC PUT with 429
    and Retry-After 3, and while A waits, the renewals stall and the lease runs out. B takes
    the pool and drains web-2 (web-1 still serves). A's retry must not go out: both together
    would empty the pool. Before, the lease was checked once per VM, not per attempt."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    vms = {vm: web_vm(arm_fake, vm, [pool]) for vm in ("web-1", "web-2")}
    waiting, go_on = threading.Event(), threading.Event()

    def retry_sleep(seconds: float) -> None:  # A waits out Retry-After until B is done
        waiting.set()
        assert go_on.wait(20)

    first = lb_pools_instance(arm_fake, storage_fake, clock, sleep=retry_sleep)
    second = lb_pools_instance(arm_fake, storage_fake, clock)
    arm_fake.fail(429, times=1, retry_after="3", method="PUT", path_contains="web-1-nic")
    errors: list[BaseException] = []

    def drain_web_1() -> None:
        message = envelope("Scheduled", EventId=EVENT_1, Resources=["web-1"])
        try:
            first.handle(parse_message(message.body_bytes()), NOW)
        except Exception as exc:  # what A raised, asserted below
            errors.append(exc)

    a = threading.Thread(target=drain_web_1)
    a.start()
    assert waiting.wait(20), "A's NIC PUT was not throttled"
    storage_fake.hang("renew")
    wait_until(lambda: storage_fake.hanging >= 1, 10, "a renewal stalled in the service")
    clock.advance(LEASE + 1)
    message = envelope("Scheduled", EventId=EVENT_2, Resources=["web-2"])
    decided = second.handle(parse_message(message.body_bytes()), NOW)
    # B cannot know whether A's write still lands: A wrote web-1 into the pool's leaving
    # members before writing (round three, break 4), so B counts it as gone and is held.
    assert decided.held is not None and arm_fake.vm_pools(vms["web-2"]) == [pool]
    go_on.set()
    a.join(30)
    storage_fake.release()
    assert arm_fake.pool_members(pool), "both drained: pool-a is empty with LB_MIN_HEALTHY=1"
    assert [type(e) for e in errors] == [LeaseLost], errors


def test_a_retry_that_would_outlast_the_lease_is_not_waited_for(
    arm_fake: FakeArm,
    storage_fake: FakeBlobStorage,
    identity_fake: FakeIdentity,
    clock: Clock,
) -> None:
    """No long sleep under a lease: a Retry-After longer than the lease can still be proven
    held fails the write at once (the message comes back later), rather than sleeping it out
    and finding the lease lost, or worse, not finding it."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    vms = {vm: web_vm(arm_fake, vm, [pool]) for vm in ("web-1", "web-2")}
    slept: list[float] = []
    lb_pools = lb_pools_instance(arm_fake, storage_fake, clock, sleep=slept.append)

    def renewals_stall(request: Any) -> None:  # as the NIC PUT comes in, under the lease
        if request.method == "PUT":
            arm_fake.on_request = None
            storage_fake.hang("renew")
            clock.advance(LEASE / 2)  # 7.5 s of the lease gone: 5 s left with the margin

    arm_fake.fail(429, times=1, retry_after="8", method="PUT", path_contains="web-1-nic")
    arm_fake.on_request = renewals_stall
    message = envelope("Scheduled", EventId=EVENT_1, Resources=["web-1"])
    with pytest.raises(TransientHttpError, match="would outlast the pool's lease"):
        lb_pools.handle(parse_message(message.body_bytes()), NOW)
    storage_fake.release()
    assert 8.0 not in slept
    assert arm_fake.vm_pools(vms["web-1"]) == [pool]


def test_an_early_approval_is_not_retried_past_the_lease_either(
    arm_fake: FakeArm,
    storage_fake: FakeBlobStorage,
    identity_fake: FakeIdentity,
    clock: Clock,
) -> None:
    """The guard of early approvals writes under the pools' leases too: the ARM acknowledge
    (and its retries) goes out only while they are provably held."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    vms = {vm: web_vm(arm_fake, vm, [pool]) for vm in ("web-1", "web-2", "web-3")}
    slept: list[float] = []
    arm = CachedVmReads(
        ArmRestClient(arm_fake.url, ManagedIdentityCredential(), sleep=slept.append)
    )
    guard = CapacityGuard(arm, store(storage_fake, clock), 1)

    def renewals_stall(request: Any) -> None:
        if request.path.endswith("/acknowledge"):
            arm_fake.on_request = None
            storage_fake.hang("renew")
            clock.advance(LEASE / 2)

    arm_fake.fail(429, times=1, retry_after="8", method="POST", path_contains="/acknowledge")
    arm_fake.on_request = renewals_stall
    record = arm.get_vm(SUB, RG, "web-2")
    assert record is not None
    with pytest.raises(TransientHttpError, match="would outlast the pool's lease"):
        guard.clear(
            EVENT_2,
            [ResolvedVm.of("web-2", record)],
            NOW,
            NOW + timedelta(hours=1),
            lambda: arm.acknowledge_event(vms["web-2"], EVENT_2),
        )
    storage_fake.release()
    assert 8.0 not in slept and not arm_fake.acknowledged


def test_a_nic_write_that_lands_after_the_lease_lapsed_takes_nothing_more(
    arm_fake: FakeArm,
    storage_fake: FakeBlobStorage,
    identity_fake: FakeIdentity,
    clock: Clock,
) -> None:
    """Hostile review of issue 23, round two, break 4. A drains web-1: ARM takes its NIC PUT
    and applies it late; meanwhile the renewals stall and the lease lapses, and B decides the
    pool under the next lease. B must count web-1 as gone (A wrote what it takes down into the
    pool's state before its write), so B is held; and A, whose lease lapsed before its write
    returned, publishes no Prepared: its message comes back. Before, B drained web-2 and the
    pool was left empty with LB_MIN_HEALTHY=1."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    for vm in ("web-1", "web-2"):
        web_vm(arm_fake, vm, [pool])
    first = lb_pools_instance(arm_fake, storage_fake, clock)
    second = lb_pools_instance(arm_fake, storage_fake, clock)
    applied = threading.Event()
    arm_fake.slow(8.0, method="PUT", path_contains="web-1-nic", times=1, until=applied)
    (gate,) = [slow for slow in arm_fake._slow if slow.until is applied]
    errors: list[BaseException] = []
    outcomes: list[Any] = []

    def drain_web_1() -> None:
        message = envelope("Scheduled", EventId=EVENT_1, Resources=["web-1"])
        try:
            outcomes.append(first.handle(parse_message(message.body_bytes()), NOW))
        except Exception as exc:
            errors.append(exc)

    a = threading.Thread(target=drain_web_1)
    a.start()
    wait_until(lambda: gate.times == 0, 20, "A's NIC write is under way in ARM")
    storage_fake.hang("renew")
    wait_until(lambda: storage_fake.hanging >= 1, 10, "a renewal stalled in the service")
    clock.advance(LEASE + 1)  # the Blob service lets A's lease expire
    message = envelope("Scheduled", EventId=EVENT_2, Resources=["web-2"])
    decided = second.handle(parse_message(message.body_bytes()), NOW)
    applied.set()  # ARM applies A's write now
    a.join(40)
    storage_fake.release()
    assert decided.held is not None and decided.changed == []
    assert arm_fake.pool_members(pool), "pool-a was left empty"
    assert not outcomes and len(errors) == 1 and isinstance(errors[0], LeaseLost)
    assert not [m for m in first.publisher.published if m.subject == "Prepared"]  # type: ignore[attr-defined]


def test_a_write_that_could_outlast_the_lease_is_not_started() -> None:
    """The write window refuses an attempt whose whole timeout is not left of the lease."""
    with write_window.lease_window(lambda: 9.0):
        assert write_window.before_attempt(5.0) == 9.0
        with pytest.raises(write_window.WindowClosing, match="would outlast"):
            write_window.before_attempt(10.0)
