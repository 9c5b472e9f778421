"""lb-pools: through the function object, against the loopback ARM over real HTTP."""

from __future__ import annotations

import logging
import time

import pytest

from emulators.fakes.arm import FakeArm, simulator_vm_id
from emulators.fakes.identity import FakeIdentity, jwt_claims
from functions.adapters.arm import ArmError
from functions.adapters.retry import TransientHttpError
from functions.lb_pools import nic_pools
from sebridge.contract.events import Observer, Transition, derived_message_id, parse_message
from tests.fixtures import golden
from tests.functions.support import EVENT_ID, RG, SUB, App, envelope, web_vm

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a", "pool-b"])
    shared = arm_fake.add_load_balancer(SUB, "rg-shared", "lb-int", ["pool-x"])
    pool_a, pool_b, pool_x = (
        f"{lb}/backendAddressPools/pool-a",
        f"{lb}/backendAddressPools/pool-b",
        f"{shared}/backendAddressPools/pool-x",
    )
    # web-3 (not affected) keeps every pool above the default LB_MIN_HEALTHY of 1, so these
    # tests see drains; the guard's own tests are in test_workflow_capacity.py.
    return {
        "web-1": web_vm(arm_fake, "web-1", [pool_a, pool_b, pool_x], ip_configs=2),
        "web-2": web_vm(arm_fake, "web-2", [pool_a]),
        "web-3": web_vm(arm_fake, "web-3", [pool_a, pool_b, pool_x]),
        "pool-a": pool_a,
    }


def nic_id(world: dict[str, str], vm: str) -> str:
    return (
        world[vm].replace(
            "Microsoft.Compute/virtualMachines", "Microsoft.Network/networkInterfaces"
        )
        + "-nic"
    )


def test_scheduled_drains_every_affected_vm_and_publishes_prepared(
    app: App, world: dict[str, str], identity_fake: FakeIdentity
) -> None:
    before = {vm: app.arm.vm_pools(world[vm]) for vm in ("web-1", "web-2")}
    app.deliver("lb_pools", golden.build()["scheduled"])
    assert app.arm.vm_pools(world["web-1"]) == [] and app.arm.vm_pools(world["web-2"]) == []
    tags = app.arm.nic(nic_id(world, "web-1"))["tags"]
    assert tags[nic_pools.TAG] == "ipconfig1=lb-web/pool-a,lb-web/pool-b,rg-shared/lb-int/pool-x"
    assert tags["owner"] == "web-team"
    (prepared,) = app.publisher.published
    scheduled = golden.build()["scheduled"]
    assert prepared.message_id == derived_message_id(
        parse_message(scheduled.body_bytes()).event,  # type: ignore[arg-type]
        Transition.PREPARED,
        scheduled.message_id,
    )
    assert prepared.message_id.startswith(f"{EVENT_ID}:Prepared:")
    assert prepared.session_id == EVENT_ID and prepared.subject == "Prepared"
    parsed = parse_message(prepared.body_bytes())
    assert parsed.source == "urn:sebridge:function:lb-pools"
    assert parsed.observer.vm_name == "web-1" and parsed.data["prepared"]["vms"] == [
        "web-1",
        "web-2",
    ]
    # ARM saw a bearer token that azure-identity fetched from the managed-identity endpoint
    tokens = {r.headers["authorization"].removeprefix("Bearer ") for r in app.arm.requests}
    assert tokens and tokens <= set(identity_fake.issued)
    assert all(
        jwt_claims(r.headers["authorization"].removeprefix("Bearer "))["aud"] == app.arm.url
        for r in app.arm.requests
    )
    assert app.arm.url in identity_fake.issued.values()  # the token's audience is ARM_ENDPOINT
    assert {r.query["api-version"] for r in app.arm.requests} == {"2024-07-01", "2024-05-01"}
    assert before["web-2"] == [world["pool-a"]]


def test_replays_change_nothing_more(app: App, world: dict[str, str]) -> None:
    app.deliver("lb_pools", golden.build()["scheduled"])
    writes = len(app.arm.writes())
    assert writes == 2
    app.deliver("lb_pools", golden.build()["scheduled"])  # duplicate delivery
    app.deliver("lb_pools", golden.build()["updated"])
    app.deliver("lb_pools", golden.build()["started"])
    assert len(app.arm.writes()) == writes
    # Prepared again for each replay of one message: the same message_id, collapsed by
    # duplicate detection; the Updated is another cause, so another Prepared
    published = [m.message_id for m in app.publisher.published]
    assert len(published) == 3 and published[0] == published[1] != published[2]


def test_completed_restores_exactly_what_was_removed(app: App, world: dict[str, str]) -> None:
    before = {vm: sorted(app.arm.vm_pools(world[vm])) for vm in ("web-1", "web-2")}
    nic_before = app.arm.nic(nic_id(world, "web-1"))
    app.deliver("lb_pools", golden.build()["scheduled"])
    app.deliver("lb_pools", golden.build()["completed"])
    assert {vm: sorted(app.arm.vm_pools(world[vm])) for vm in before} == before
    nic_after = app.arm.nic(nic_id(world, "web-1"))
    assert nic_after["tags"] == nic_before["tags"]
    assert (
        nic_after["properties"]["ipConfigurations"] == nic_before["properties"]["ipConfigurations"]
    )
    writes = len(app.arm.writes())
    app.deliver("lb_pools", golden.build()["completed"])
    app.deliver("lb_pools", golden.build()["cancelled"])
    assert len(app.arm.writes()) == writes
    assert [c.split()[0] for c in app.arm.changes].count("+") == 4


@pytest.mark.parametrize("event_type", ["Terminate", "Preempt"])
def test_no_restore_after_the_vm_is_gone(app: App, world: dict[str, str], event_type: str) -> None:
    app.deliver("lb_pools", envelope("Scheduled", EventType=event_type))
    assert app.arm.vm_pools(world["web-2"]) == []
    app.deliver("lb_pools", envelope("Completed", EventType=event_type, EventStatus="Started"))
    assert app.arm.vm_pools(world["web-2"]) == []
    assert len(app.arm.writes()) == 2


@pytest.mark.parametrize(
    ("fields", "drained"),
    [
        ({"EventType": "Freeze", "DurationInSeconds": 5}, False),
        ({"EventType": "Freeze", "DurationInSeconds": 9}, True),
        ({"EventType": "Freeze", "DurationInSeconds": -1}, True),
        ({"EventType": "Redeploy"}, True),
    ],
)
def test_only_impactful_events_drain(
    app: App, world: dict[str, str], fields: dict[str, object], drained: bool
) -> None:
    app.deliver("lb_pools", envelope("Scheduled", **fields))
    assert (app.arm.vm_pools(world["web-2"]) == []) is drained
    assert bool(app.publisher.published) is drained


def test_configured_impactful_types(make_app, world: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    app = make_app(LB_IMPACTFUL_EVENT_TYPES="Terminate", LB_FREEZE_THRESHOLD_SECONDS="60")
    app.deliver("lb_pools", envelope("Scheduled", EventType="Reboot"))
    app.deliver("lb_pools", envelope("Scheduled", EventType="Freeze", DurationInSeconds=30))
    assert not app.arm.writes()
    app.deliver("lb_pools", envelope("Scheduled", EventType="Terminate"))
    assert len(app.arm.writes()) == 2


def test_409_and_429_are_retried_honouring_retry_after(app: App, world: dict[str, str]) -> None:
    app.arm.fail(409, times=1, method="PUT", retry_after="0")
    app.arm.fail(429, times=1, method="GET", path_contains="virtualMachines/web-2", retry_after="1")
    started = time.monotonic()
    app.deliver("lb_pools", golden.build()["scheduled"])
    elapsed = time.monotonic() - started
    assert app.arm.vm_pools(world["web-1"]) == [] and app.arm.vm_pools(world["web-2"]) == []
    statuses = [r.method for r in app.arm.requests]
    assert statuses.count("PUT") == 3  # one answered 409, then both NICs
    web_2 = [r for r in app.arm.requests if r.path.endswith("virtualMachines/web-2")]
    assert len(web_2) == 2  # answered 429, then read again
    assert 0.95 <= elapsed < 5  # waited the Retry-After of 1 s (the 409 said 0), no more
    assert app.publisher.published


def test_persistent_5xx_raises_for_redelivery(app: App, world: dict[str, str]) -> None:
    app.arm.fail(503, times=10, method="PUT", retry_after="0")
    with pytest.raises(TransientHttpError, match="ARM put NIC: HTTP 503 after 4"):
        app.deliver("lb_pools", golden.build()["scheduled"])
    assert not app.publisher.published
    assert app.arm.vm_pools(world["web-1"])  # nothing changed


def test_a_stale_etag_is_re_read(app: App, world: dict[str, str]) -> None:
    app.arm.fail(412, times=1, method="PUT")
    app.deliver("lb_pools", golden.build()["scheduled"])
    assert app.arm.vm_pools(world["web-1"]) == []
    assert [r.method for r in app.arm.requests].count("PUT") == 3


def test_a_vm_that_no_longer_exists_is_logged_and_completed(
    app: App, world: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    app.arm.remove(world["web-2"])
    app.deliver("lb_pools", golden.build()["scheduled"])
    assert app.arm.vm_pools(world["web-1"]) == []
    assert "VM not found in ARM" in caplog.text
    assert app.publisher.published  # a VM that is gone is in no pool


def test_a_nic_that_no_longer_exists_is_logged(
    app: App, world: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    app.arm.remove(nic_id(world, "web-2"))
    app.deliver("lb_pools", golden.build()["completed"])
    assert "NIC not found" in caplog.text


@pytest.mark.parametrize("mode", ["azure-async", "location"])
def test_long_running_puts_are_followed(app: App, world: dict[str, str], mode: str) -> None:
    app.arm.async_mode, app.arm.async_polls = mode, 2
    app.deliver("lb_pools", golden.build()["scheduled"])
    polls = [r for r in app.arm.requests if r.path.startswith("/fake/")]
    assert len(polls) == 2 * 3  # two NICs, each "in progress" twice, then done
    assert app.publisher.published


def test_uniform_scale_set_instances_are_left_alone(
    app: App, arm_fake: FakeArm, caplog: pytest.LogCaptureFixture
) -> None:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-ss", ["pool"])
    instance = arm_fake.add_vmss_instance(SUB, RG, "ss", "3", [f"{lb}/backendAddressPools/pool"])
    observer = Observer(
        vm_name="ss_3",
        vm_id=simulator_vm_id("ss_3"),
        subscription_id=SUB,
        resource_group=RG,
        vm_scale_set_name="ss",
    )
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["ss_3"]))
    assert not app.arm.writes() and not app.publisher.published
    assert any(r.path.lower() == instance.lower() for r in app.arm.requests)
    assert "Uniform scale-set instance" in caplog.text


def test_a_message_without_scope_is_logged(app: App, caplog: pytest.LogCaptureFixture) -> None:
    observer = Observer(vm_name="web-1")
    app.deliver("lb_pools", envelope("Scheduled", observer))
    assert not app.arm.requests
    assert "observer.subscriptionId '' is empty or not a string" in caplog.text


def test_a_vm_dropped_by_an_update_is_restored(app: App, world: dict[str, str]) -> None:
    from sebridge.contract.events import Transition, event_message
    from tests.functions.support import event

    app.deliver("lb_pools", golden.build()["scheduled"])
    assert app.arm.vm_pools(world["web-2"]) == []
    updated = event_message(
        Transition.UPDATED,
        event(Resources=["web-1"]),
        golden.OBSERVER,
        12,
        golden.OBSERVED_AT,
        changes={"Resources": {"from": ["web-1", "web-2"], "to": ["web-1"]}},
    )
    app.deliver("lb_pools", updated)
    assert app.arm.vm_pools(world["web-2"]) == [world["pool-a"]]
    assert app.arm.vm_pools(world["web-1"]) == []


# ---- permissions: ARM 403 is an answer, not a fault --------------------------------------

DENIED = [
    pytest.param("GET", "virtualMachines/web-2", "Microsoft.Compute/virtualMachines/read", id="vm"),
    pytest.param(
        "GET", "networkInterfaces/web-2-nic", "Microsoft.Network/networkInterfaces/read", id="nic"
    ),
    pytest.param(
        "PUT",
        "networkInterfaces/web-2-nic",
        "Microsoft.Network/networkInterfaces/write",
        id="nic-write",
    ),
]


@pytest.mark.parametrize(("method", "path", "action"), DENIED)
def test_a_missing_permission_leaves_the_vm_in_its_pools_and_completes(
    app: App,
    world: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    action: str,
) -> None:
    web_1_before = sorted(app.arm.vm_pools(world["web-1"]))
    app.arm.fail(403, times=100, method=method, path_contains=path)  # no role assignment
    app.deliver("lb_pools", golden.build()["scheduled"])  # returns: the message completes
    assert app.arm.vm_pools(world["web-2"]) == [world["pool-a"]]  # left exactly as it was
    assert app.arm.vm_pools(world["web-1"]) == []  # the VM the app may change is drained
    assert not app.publisher.published  # web-2 is not ready: no Prepared, no early approval
    refused = [r for r in app.arm.requests if r.method == method and path in r.path]
    assert len(refused) == 1  # not retried
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert f"missing permission {action} on " in error.getMessage()
    assert path in error.getMessage()  # the scope
    # Completed restores what was drained and logs what it may not touch; it still completes.
    app.deliver("lb_pools", golden.build()["completed"])
    assert sorted(app.arm.vm_pools(world["web-1"])) == web_1_before
    assert app.arm.vm_pools(world["web-2"]) == [world["pool-a"]]


def test_a_uniform_instance_the_app_may_not_read_is_left_alone(
    app: App, arm_fake: FakeArm, caplog: pytest.LogCaptureFixture
) -> None:
    """The app's roles do not include virtualMachineScaleSets/virtualMachines/read."""
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-ss", ["pool"])
    arm_fake.add_vmss_instance(SUB, RG, "ss", "3", [f"{lb}/backendAddressPools/pool"])
    arm_fake.fail(403, times=100, method="GET", path_contains="virtualMachineScaleSets/")
    observer = Observer(
        vm_name="ss_3",
        vm_id=simulator_vm_id("ss_3"),
        subscription_id=SUB,
        resource_group=RG,
        vm_scale_set_name="ss",
    )
    app.deliver("lb_pools", envelope("Scheduled", observer, Resources=["ss_3"]))
    assert not app.arm.writes() and not app.publisher.published
    assert len([r for r in app.arm.requests if "virtualMachineScaleSets/" in r.path]) == 1
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert (
        "missing permission Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read on "
        f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/"
        "virtualMachineScaleSets/ss/virtualMachines/3" in error.getMessage()
    )


def test_a_401_is_redelivered_with_a_clear_message(app: App, world: dict[str, str]) -> None:
    app.arm.fail(401, times=1, method="GET")
    with pytest.raises(ArmError, match="HTTP 401, ARM refused the token"):
        app.deliver("lb_pools", golden.build()["scheduled"])
    assert not app.arm.writes()
