"""A lease renewal that hangs longer than the lease (issue 23, suspected): writes go on only
while the pool's lease is provably held.

The Blob service (the loopback fake) stalls every renewal, and the clock the lease is measured
by (the fake's and the store's, one controllable clock) passes the lease's end: another instance
may take the pool. Before, nothing had failed yet, so ``check`` passed and lb-pools went on
writing NICs under a lease it no longer held.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from functions.adapters.arm import ArmRestClient
from functions.adapters.arm_cache import CachedVmReads
from functions.adapters.pool_state import BlobPoolStore, LeaseLost
from functions.lb_pools.core import LbPools
from functions.shared.impact import DEFAULT_RULES
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
