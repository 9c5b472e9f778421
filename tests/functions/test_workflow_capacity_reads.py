"""How every capacity decision reads the pools' health (hostile review of issue 23, breaks 7
and 10): one freshness rule for probe verdicts, and one answer to a load balancer ARM refuses
to show.

- Probe verdicts are asked for before a decision waits for its pools' leases. A wait can be
  long (another instance holds the pool), and a member probed Down meanwhile must not still
  count as healthy: lb-pools asked again for verdicts older than 10 s, the guard of early
  approvals never did and approved with a pool left without a healthy member.
- A 403 on the load balancer or on its rule health (the app has no role on the group the load
  balancer lives in) is what the README promises for every 403: logged at ERROR naming the
  permission, the VMs left as they are, the message completed. Before, lb-pools and the gate
  raised, the message went round ten times into the dead-letter queue, and the Approve link
  answered 500.

Real function objects and adapters against the loopback ARM and blob storage.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from functions.adapters.arm import ArmRestClient
from functions.adapters.arm_cache import CachedVmReads
from functions.adapters.pool_state import BlobPoolStore
from functions.lb_pools.capacity import PROBE_MAX_AGE_SECONDS
from functions.lb_pools.core import LbPools
from functions.lb_pools.guard import CapacityGuard
from functions.shared.impact import DEFAULT_RULES
from functions.shared.vms import ResolvedVm
from sebridge.contract.events import parse_message
from tests.functions.support import (
    NOW,
    POOL_CONTAINER,
    RG,
    SUB,
    App,
    RecordingPublisher,
    envelope,
)
from tests.functions.test_workflow_capacity_paths import (
    EVENT_A,
    EVENT_B,
    MANUAL,
    approved,
    card_token,
    http,
    scheduled,
    vm_side_prepared,
    world,  # noqa: F401 - a fixture, found by name
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

APPROVE_ALL = json.dumps({"rules": [], "default": "approve"})
LB_READ = "Microsoft.Network/loadBalancers/read"
RULE_HEALTH = "Microsoft.Network/loadBalancers/loadBalancingRules/health/action"


# ---- freshness: one rule for lb-pools and the guard ---------------------------------------------


class Clock:
    """Monotonic seconds that the test moves forward (and real time otherwise)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture
def held_by_another(
    storage_fake: FakeBlobStorage, identity_fake: FakeIdentity
) -> Iterator[Callable[[str], threading.Event]]:
    """Another instance holds a pool's lease until the test sets the event it returns."""
    threads: list[tuple[threading.Thread, threading.Event]] = []

    def hold(pool: str) -> threading.Event:
        other = BlobPoolStore(
            storage_fake.container_url(POOL_CONTAINER), ManagedIdentityCredential()
        )
        taken, done = threading.Event(), threading.Event()

        def run() -> None:
            with other.hold([pool]):
                taken.set()
                done.wait(30)

        thread = threading.Thread(target=run)
        thread.start()
        threads.append((thread, done))
        assert taken.wait(10), "the other instance did not get the lease"
        return done

    yield hold
    for thread, done in threads:
        done.set()
        thread.join(30)


@pytest.mark.parametrize("path", ["drain", "early-approval"])
def test_verdicts_from_before_a_long_wait_for_the_lease_are_asked_for_again(
    arm_fake: FakeArm,
    storage_fake: FakeBlobStorage,
    identity_fake: FakeIdentity,
    world: dict[str, str],  # noqa: F811 - the fixture
    held_by_another: Callable[[str], threading.Event],
    path: str,
) -> None:
    """web-1 is out for A. B asks to take web-2 out (a drain, or an early approval of web-2
    that stays in the pool) while another instance holds pool-a; the verdicts are asked for,
    then web-3 is probed Down and more than PROBE_MAX_AGE_SECONDS pass before the lease comes
    free. Deciding with the old verdicts would leave pool-a without a healthy member."""
    clock = Clock()
    credential = ManagedIdentityCredential()
    arm = CachedVmReads(ArmRestClient(arm_fake.url, credential))
    store = BlobPoolStore(storage_fake.container_url(POOL_CONTAINER), credential)
    lb_pools = LbPools(
        arm, RecordingPublisher(), DEFAULT_RULES, pools=store, min_healthy=1, monotonic=clock
    )
    guard = CapacityGuard(arm, store, 1, monotonic=clock)
    lb_pools.handle(parse_message(scheduled(EVENT_A, ["web-1"]).body_bytes()), NOW)
    assert arm_fake.vm_pools(world["web-1"]) == []
    release = held_by_another(world["pool-a"])
    asked = sum("/health" in r.path for r in arm_fake.requests)
    approvals: list[str] = []

    def decide() -> None:
        if path == "drain":
            message = scheduled(EVENT_B, ["web-2"])
            lb_pools.handle(parse_message(message.body_bytes()), NOW)
        else:
            record = arm.get_vm(SUB, RG, "web-2")
            assert record is not None
            vms = [ResolvedVm.of("web-2", record)]
            guard.clear(EVENT_B, vms, NOW, NOW.replace(year=2030), lambda: approvals.append("B"))

    decider = threading.Thread(target=decide)
    decider.start()
    wait_until(
        lambda: sum("/health" in r.path for r in arm_fake.requests) > asked,
        10,
        "the verdicts asked for before the lease",
    )
    arm_fake.set_probe(world["web-3"], up=False)
    clock.offset += PROBE_MAX_AGE_SECONDS + 1
    release.set()
    decider.join(30)
    assert not decider.is_alive()
    assert arm_fake.vm_pools(world["web-2"]), "web-2 drained: pool-a has no healthy member"
    assert not approvals, "approved early: web-2 goes down, web-3 is Down"


# ---- a load balancer ARM refuses to show ---------------------------------------------------------


def errors_naming(caplog: pytest.LogCaptureFixture, permission: str) -> list[str]:
    """ERROR lines that name ``permission`` (in any case: the ids lb-pools reads are lower
    case, and the fake names the action as the path spells it)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and permission.lower() in r.getMessage().lower()
    ]


@pytest.mark.parametrize(
    ("refused", "permission"),
    [("/loadBalancers/lb-web", LB_READ), ("/health", RULE_HEALTH)],
    ids=["load-balancer", "rule-health"],
)
def test_lb_pools_leaves_the_vms_when_the_pools_health_is_refused(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
    refused: str,
    permission: str,
) -> None:
    app = make_app(LB_MIN_HEALTHY="1")
    app.arm.fail(403, times=1000, path_contains=refused)
    caplog.set_level(logging.INFO)
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))  # completes: nothing raised
    assert app.arm.vm_pools(world["web-1"]) == [world["pool-a"]]
    assert not [m for m in app.publisher.published if m.subject in ("Prepared", "Held")]
    assert errors_naming(caplog, permission)


@pytest.mark.parametrize(
    ("refused", "permission"),
    [("/loadBalancers/lb-web", LB_READ), ("/health", RULE_HEALTH)],
    ids=["load-balancer", "rule-health"],
)
def test_the_gate_approves_nothing_early_when_the_pools_health_is_refused(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
    refused: str,
    permission: str,
) -> None:
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=APPROVE_ALL)
    app.arm.fail(403, times=1000, path_contains=refused)
    caplog.set_level(logging.INFO)
    app.deliver("approval_gate", vm_side_prepared(world, EVENT_B, "web-2"))  # completes
    assert not approved(app, EVENT_B)
    assert errors_naming(caplog, permission)


def test_the_link_answers_409_when_the_pools_health_is_refused(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    app = make_app(LB_MIN_HEALTHY="1", APPROVAL_POLICY=MANUAL)
    token = card_token(app, scheduled(EVENT_B, ["web-2"]))
    app.arm.fail(403, times=1000, path_contains="/health")
    response = app.call("approve", http("POST", token, EVENT_B))
    assert response.status_code == 409
    assert RULE_HEALTH.lower() in response.get_body().decode().lower()
    assert not approved(app, EVENT_B)


def test_a_drain_still_works_once_the_role_is_granted(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    """The refusal changes nothing durable: the next message drains as usual."""
    app = make_app(LB_MIN_HEALTHY="1")
    app.arm.fail(403, times=1, path_contains="/health")
    app.deliver("lb_pools", scheduled(EVENT_A, ["web-1"]))
    assert app.arm.vm_pools(world["web-1"]) == [world["pool-a"]]
    app.deliver("lb_pools", envelope("Updated", EventId=EVENT_A, Resources=["web-1"]))
    assert app.arm.vm_pools(world["web-1"]) == []
