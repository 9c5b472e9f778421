"""The pool store: per-pool blob leases against the loopback Blob service over HTTP."""

from __future__ import annotations

import threading
import time

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from functions.adapters.pool_state import BlobPoolStore, LeaseLost
from functions.shared.ports import PoolBusy
from tests.functions.support import POOL_CONTAINER

pytestmark = pytest.mark.timeout(60)

LB = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/loadBalancers/lb"
POOL = f"{LB}/backendAddressPools/p"
OTHER = POOL.replace("/p", "/q")


@pytest.fixture
def store_factory(storage_fake: FakeBlobStorage, identity_fake: FakeIdentity):  # type: ignore[no-untyped-def]
    def make(**options: object) -> BlobPoolStore:
        return BlobPoolStore(
            storage_fake.container_url(POOL_CONTAINER),
            ManagedIdentityCredential(),
            **options,  # type: ignore[arg-type]
        )

    return make


def test_the_container_and_blob_are_created_on_first_use(
    store_factory,
    storage_fake: FakeBlobStorage,  # type: ignore[no-untyped-def]
) -> None:
    store = store_factory()
    assert store.peek(POOL) == {}
    with store.hold([POOL, OTHER]) as lease:
        lease.save(POOL, {"held": {"e": 1}})
    assert store.peek(POOL) == {"held": {"e": 1}, "pool": POOL}
    assert [(c.action, c.status) for c in storage_fake.lease_log] == [
        ("acquire", 201),
        ("acquire", 201),
        ("release", 200),
        ("release", 200),
    ]


def test_a_second_instance_waits_for_the_pool(
    store_factory,
    storage_fake: FakeBlobStorage,  # type: ignore[no-untyped-def]
) -> None:
    first, second = store_factory(), store_factory()
    order: list[str] = []
    holding = threading.Event()

    def hold_a_while() -> None:
        with first.hold([POOL]):
            holding.set()
            time.sleep(0.6)
            order.append("first done")

    thread = threading.Thread(target=hold_a_while)
    thread.start()
    assert holding.wait(10)
    with second.hold([POOL]):
        order.append("second in")
    thread.join(10)
    assert order == ["first done", "second in"]
    codes = [c.code for c in storage_fake.lease_log if c.action == "acquire"]
    assert codes[0] == "" and "LeaseAlreadyPresent" in codes and codes[-1] == ""


def test_a_pool_held_too_long_gives_the_message_back(store_factory) -> None:  # type: ignore[no-untyped-def]
    first, second = store_factory(), store_factory(acquire_timeout=0.5)
    with first.hold([POOL]):
        started = time.monotonic()
        with pytest.raises(PoolBusy, match="stayed locked"):
            with second.hold([POOL]):
                pass
        assert 0.4 < time.monotonic() - started < 5


def test_the_lease_is_renewed_while_held(
    store_factory,
    storage_fake: FakeBlobStorage,  # type: ignore[no-untyped-def]
) -> None:
    store = store_factory(renew_every=0.2)
    with store.hold([POOL]) as lease:
        time.sleep(0.7)
        lease.check()
        lease.save(POOL, {})
    renewals = [c for c in storage_fake.lease_log if c.action == "renew"]
    assert len(renewals) >= 2 and all(c.status == 200 for c in renewals)


def test_a_lost_lease_stops_the_holder_before_it_writes(
    store_factory,
    storage_fake: FakeBlobStorage,  # type: ignore[no-untyped-def]
) -> None:
    """The holder stalls past its lease (here: the Blob service's clock jumps past the 30 s
    lease), another instance takes the pool; the stalled one's renewal fails, and it changes
    nothing more."""
    now = [1000.0]
    storage_fake.clock = lambda: now[0]
    stalled, other = store_factory(renew_every=0.2), store_factory()
    with stalled.hold([POOL]) as lease:
        now[0] += 31
        with other.hold([POOL]) as theirs:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    lease.check()
                except LeaseLost:
                    break
                time.sleep(0.05)
            with pytest.raises(LeaseLost):
                lease.check()
            with pytest.raises(LeaseLost):
                lease.save(POOL, {"held": {"stale": 1}})
            theirs.save(POOL, {"held": {}})
    assert "stale" not in str(storage_fake.blobs[POOL_CONTAINER])


def test_a_lease_outlives_a_dead_holder_only_for_its_duration(
    store_factory,
    storage_fake: FakeBlobStorage,  # type: ignore[no-untyped-def]
) -> None:
    """An instance that dies never releases: the next one waits until the lease expires."""
    now = [1000.0]
    storage_fake.clock = lambda: now[0]
    dead = store_factory()
    lease_id = dead._acquire(POOL)  # acquired, then the process is gone
    assert lease_id
    waiting = store_factory(acquire_timeout=0.3)
    with pytest.raises(PoolBusy):
        with waiting.hold([POOL]):
            pass
    now[0] += 31  # past the 30 s lease
    with store_factory().hold([POOL]):
        pass
