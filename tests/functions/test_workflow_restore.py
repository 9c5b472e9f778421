"""Restore that finishes what it can (issue 23, finding 4).

web-1 was drained from pool-a and pool-b; pool-b's load balancer was deleted meanwhile. Every
delivery of Completed used to fail (ARM: 400 InvalidResourceReference for the NIC PUT naming
pool-b) until the message was dead-lettered, and web-1 never went back into pool-a, which still
exists. And the restore stopped at the first failing VM, leaving every later VM of the event
out. Through the real function objects and the loopback ARM.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from emulators.fakes.arm import _error as arm_error
from functions.lb_pools.nic_pools import TAG_NAMES
from functions.shared import composition, deliveries
from functions.shared.invocations import INVOCATION_PREFIX, LOGGER_NAME
from sebridge.contract.events import Envelope
from tests.functions.history_support import MemoryHistoryStore
from tests.functions.support import RG, SUB, App, envelope, web_vm

pytestmark = pytest.mark.timeout(60)

EVENT = "d0d0d0d0-0000-4000-8000-00000000000d"
VMS = ("web-1", "web-2", "web-3")


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    lb_a = arm_fake.add_load_balancer(SUB, RG, "lb-a", ["pool-a"], rules={"http": "pool-a"})
    lb_b = arm_fake.add_load_balancer(SUB, RG, "lb-b", ["pool-b"])
    pool_a, pool_b = f"{lb_a}/backendAddressPools/pool-a", f"{lb_b}/backendAddressPools/pool-b"
    vms = {vm: web_vm(arm_fake, vm, [pool_a, pool_b]) for vm in VMS}
    return {**vms, "lb-b": lb_b, "pool-a": pool_a, "pool-b": pool_b}


def scheduled(vms: list[str]) -> Envelope:
    return envelope("Scheduled", EventId=EVENT, Resources=vms)


def completed(vms: list[str]) -> Envelope:
    return envelope("Completed", EventId=EVENT, Resources=vms, EventStatus="Started", NotBefore="")


def record_tags(arm: FakeArm, vm_id: str) -> dict[str, str]:
    nic = arm.nic(
        vm_id.replace("Microsoft.Compute/virtualMachines", "Microsoft.Network/networkInterfaces")
        + "-nic"
    )
    return {k: v for k, v in (nic.get("tags") or {}).items() if k in TAG_NAMES}


def invocation_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        json.loads(r.getMessage().removeprefix(INVOCATION_PREFIX))
        for r in caplog.records
        if r.name == LOGGER_NAME
    ]


@pytest.mark.parametrize("deleted", ["load balancer", "pool"])
def test_a_deleted_pool_is_skipped_and_reported_and_the_others_restored(
    app: App,
    arm_fake: FakeArm,
    world: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    deleted: str,
) -> None:
    caplog.set_level(logging.INFO)
    app.deliver("lb_pools", scheduled(["web-1"]))
    assert arm_fake.vm_pools(world["web-1"]) == []
    if deleted == "load balancer":
        arm_fake.remove(world["lb-b"])
    else:
        arm_fake.remove_pool(world["pool-b"])
    for _ in range(10):  # every delivery Service Bus would make before the dead-letter queue
        app.deliver("lb_pools", completed(["web-1"]))
    assert arm_fake.vm_pools(world["web-1"]) == [world["pool-a"]]
    assert record_tags(arm_fake, world["web-1"]) == {}  # nothing left that could be put back
    errors = [
        r for r in caplog.records if r.levelno == logging.ERROR and "pool-b" in r.getMessage()
    ]
    assert len(errors) == 1 and "no longer exists" in errors[0].getMessage()
    (card,) = app.teams.cards  # once: the redeliveries find nothing more to do
    text = json.dumps(card)
    assert "Not restored after Reboot completed: web-1" in text and "lb-b/pool-b" in text
    counts = [line.get("notRestored") for line in invocation_lines(caplog)]
    assert counts.count(1) == 1 and all(c in (None, 1) for c in counts)


def test_one_vm_that_fails_does_not_keep_the_others_out(
    make_app: Callable[..., App], arm_fake: FakeArm, world: dict[str, str]
) -> None:
    """ARM refuses web-1's NIC write once (a 400 of another kind): web-2 and web-3 go back all
    the same, the message is given back for a redelivery, and that puts web-1 back."""
    app = make_app(LB_MIN_HEALTHY="0")
    app.deliver("lb_pools", scheduled(list(VMS)))
    assert all(arm_fake.vm_pools(world[vm]) == [] for vm in VMS)
    arm_fake.fail(400, times=1, method="PUT", path_contains="/web-1-nic")
    with pytest.raises(Exception, match="put NIC: HTTP 400"):
        app.deliver("lb_pools", completed(list(VMS)))
    assert arm_fake.vm_pools(world["web-1"]) == []
    for vm in ("web-2", "web-3"):
        assert arm_fake.vm_pools(world[vm]) == [world["pool-a"], world["pool-b"]], vm
    app.deliver("lb_pools", completed(list(VMS)))  # the redelivery
    for vm in VMS:
        assert arm_fake.vm_pools(world[vm]) == [world["pool-a"], world["pool-b"]], vm


def test_a_pool_deleted_between_the_read_and_the_write_is_skipped_too(
    app: App, arm_fake: FakeArm, world: dict[str, str]
) -> None:
    """ARM's own answer decides: the NIC PUT names pool-b, ARM says it does not exist, lb-pools
    reads the load balancer, leaves pool-b out and writes again."""
    app.deliver("lb_pools", scheduled(["web-2"]))
    arm_fake.remove_pool(world["pool-b"])
    app.deliver("lb_pools", completed(["web-2"]))
    puts = [r for r in arm_fake.requests if r.method == "PUT" and "web-2-nic" in r.path]
    assert len(puts) == 3  # the drain, the refused restore, the restore without pool-b
    assert arm_fake.vm_pools(world["web-2"]) == [world["pool-a"]]


def test_a_replaced_ip_configuration_is_reported_not_dropped_silently(
    app: App, arm_fake: FakeArm, world: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """While web-1 is out, its NIC's ip configuration ipconfig1 (the one the record names) is
    replaced by ipconfig-v2. Nothing can say which configuration should go back, so nothing is
    guessed; but the Completed dropped the record and said nothing: no ERROR, no card, no
    notRestored (hostile review of issue 23, break 9). Now it is reported like a deleted pool."""
    caplog.set_level(logging.INFO)
    app.deliver("lb_pools", scheduled(["web-1"]))
    nic_id = (
        world["web-1"].replace(
            "Microsoft.Compute/virtualMachines", "Microsoft.Network/networkInterfaces"
        )
        + "-nic"
    )
    with arm_fake.lock:  # the operator's change, as ARM would keep it
        config = arm_fake.resources[nic_id.lower()]["properties"]["ipConfigurations"][0]
        config["name"], config["id"] = "ipconfig-v2", f"{nic_id}/ipConfigurations/ipconfig-v2"
    app.deliver("lb_pools", completed(["web-1"]))
    assert arm_fake.vm_pools(world["web-1"]) == []  # nothing guessed
    assert record_tags(arm_fake, world["web-1"]) == {}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("ipconfig1" in e and "lb-a/pool-a" in e for e in errors), errors
    assert any("ipconfig1" in e and "lb-b/pool-b" in e for e in errors), errors
    (card,) = app.teams.cards
    text = json.dumps(card)
    assert "Not restored after Reboot completed: web-1" in text
    assert "IP configurations that no longer exist" in text and "ipconfig1" in text
    assert [line.get("notRestored") for line in invocation_lines(caplog)][-1] == 2


def deliver_until_dead_letter(app: App, message: Envelope) -> int:
    """Deliver ``message`` as Service Bus would, up to MaxDeliveryCount: how many raised."""
    raised = 0
    for count in range(1, deliveries.MAX_DELIVERY_COUNT + 1):
        try:
            app.deliver("lb_pools", message, delivery_count=count)
        except Exception:
            raised += 1
        else:
            break
    return raised


@pytest.mark.parametrize("refusal", ["bad-request", "nat-rule-reference"])
def test_a_restore_arm_refuses_for_good_is_reported_not_dead_lettered_silently(
    make_app: Callable[..., App],
    arm_fake: FakeArm,
    world: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    refusal: str,
) -> None:
    """Hostile review of issue 23, round two, break 6: ARM answers every PUT of web-1's NIC
    with a lasting 4xx (a 400, or InvalidResourceReference naming an inbound NAT rule deleted
    meanwhile, not a pool). web-2 goes back at once; web-1 is tried on every redelivery, and on
    the last one given up out loud: an ERROR line naming the VM, the NIC and ARM's code, a
    Teams card, the invocation line's notRestored, the history's NotRestored action; the message
    completes and web-1's NIC keeps its record for the operator."""
    caplog.set_level(logging.INFO)
    app = make_app(LB_MIN_HEALTHY="0")
    history = MemoryHistoryStore()  # the history on: lb-pools records its actions there
    composition.use(replace(composition.dependencies(), history_store=history))
    app.deliver("lb_pools", scheduled(["web-1", "web-2"]))
    if refusal == "bad-request":
        arm_fake.fail(400, times=1000, method="PUT", path_contains="/web-1-nic")
        code = "InternalError"  # ARM's error code (the fake's for an injected 400)
    else:
        nat_rule = world["lb-b"].replace("lb-b", "lb-a") + "/inboundNatRules/ssh-web-1"
        original = arm_fake.handle

        def handle(request: Any) -> Any:  # ARM misses a NAT rule the NIC names, not a pool
            if request.method == "PUT" and "/web-1-nic" in request.path:
                return arm_error(
                    400,
                    "InvalidResourceReference",
                    f"Resource {nat_rule} referenced by resource {request.path} was not found.",
                )
            return original(request)

        monkeypatch.setattr(arm_fake, "handle", handle)
        code = "InvalidResourceReference"
    raised = deliver_until_dead_letter(app, completed(["web-1", "web-2"]))
    assert raised == deliveries.MAX_DELIVERY_COUNT - 1  # the last delivery completes
    assert arm_fake.vm_pools(world["web-2"]) == [world["pool-a"], world["pool-b"]]
    assert arm_fake.vm_pools(world["web-1"]) == []
    assert record_tags(arm_fake, world["web-1"])  # the record stays, for the operator
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("web-1" in e and "web-1-nic" in e and code in e for e in errors), errors
    (card,) = app.teams.cards
    text = json.dumps(card)
    assert "web-1" in text and "put them back by hand" in text and code in text
    assert [line.get("notRestored") for line in invocation_lines(caplog)][-1] == 1
    entries = [e for rows in history.rows.values() for e in rows.values()]
    (not_restored,) = [e for e in entries if e.name == "NotRestored"]
    assert not_restored.details["count"] == 1 and not_restored.details["vms"] == "web-1"
    assert not_restored.details["codes"] == code


def test_the_delivery_count_is_the_subscriptions() -> None:
    """The last delivery the workflows count on is the one the infrastructure configures."""
    config = json.loads(
        (Path(__file__).parents[2] / "infra/servicebus-emulator/Config.json").read_text()
    )
    counts: set[int] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "MaxDeliveryCount" in node:
                counts.add(node["MaxDeliveryCount"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    assert counts == {deliveries.MAX_DELIVERY_COUNT}
