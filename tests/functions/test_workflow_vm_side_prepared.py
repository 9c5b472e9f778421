"""approval-gate and a Prepared from the VM itself (its forwarder's hooks or drain probe).

A VM that prepared itself stays in its backend pools in ARM (a Uniform scale-set instance, an
Application Gateway member, a VM drained through its health probe): the gate counts the VM's own
Prepared for that VM, and for nobody else.
"""

from __future__ import annotations

import pytest

from emulators.fakes.arm import FakeArm
from sebridge.contract.events import Envelope, Observer, prepared_message
from tests.fixtures import golden
from tests.functions.support import SUB, App, envelope, event, web_vm

pytestmark = pytest.mark.timeout(30)


def vm_side_prepared(
    resources: list[str], *, vms: list[str] | None = None, observer: Observer | None = None
) -> Envelope:
    observer = observer or golden.OBSERVER
    return prepared_message(
        event(Resources=resources),
        observer,
        11,
        golden.OBSERVED_AT,
        source=observer.source,
        prepared_vms=vms if vms is not None else [observer.vm_name],
        cause="scheduled-id|hooks+drain-probe|web-1",
        prepared_by="hooks+drain-probe",
    )


@pytest.fixture
def pool(arm_fake: FakeArm) -> str:
    lb = arm_fake.add_load_balancer(SUB, "rg-web", "lb-web", ["pool-a"])
    return f"{lb}/backendAddressPools/pool-a"


def test_the_only_affected_vm_prepared_itself_so_it_is_approved(
    app: App, arm_fake: FakeArm, pool: str
) -> None:
    web_vm(arm_fake, "web-1", [pool])
    web_vm(arm_fake, "web-3", [pool])
    app.deliver("approval_gate", envelope("Scheduled", Resources=["web-1"]))
    assert not app.commands.sent  # in its pool, and nothing said it is prepared
    app.deliver("approval_gate", vm_side_prepared(["web-1"]))
    ((_, session),) = app.commands.sent
    assert session == "web-1"
    assert not app.arm.writes()


def test_a_vm_cannot_speak_for_another_vm(app: App, arm_fake: FakeArm, pool: str) -> None:
    web_vm(arm_fake, "web-1", [pool])
    web_vm(arm_fake, "web-2", [pool])
    app.deliver("approval_gate", vm_side_prepared(["web-1", "web-2"]))
    assert not app.commands.sent  # web-2 is still in its pool and did not prepare itself
    app.deliver("approval_gate", vm_side_prepared(["web-1", "web-2"], vms=["web-1", "web-2"]))
    assert not app.commands.sent  # a forwarder naming other VMs is not believed for any


def test_its_own_preparation_plus_arm_for_the_others(
    app: App, arm_fake: FakeArm, pool: str
) -> None:
    web_vm(arm_fake, "web-1", [pool])
    web_vm(arm_fake, "web-2", [])  # already out of every pool
    web_vm(arm_fake, "web-3", [pool])  # a spare: web-1 may go down in its pool
    app.deliver("approval_gate", vm_side_prepared(["web-1", "web-2"]))
    ((_, session),) = app.commands.sent
    assert session == "web-1"


def test_a_vm_that_prepared_itself_is_still_a_member_the_pool_may_need(
    app: App, arm_fake: FakeArm
) -> None:
    """The capacity decision (issue 23): web-1 says it prepared itself, but the load balancer
    still probes it Up and it is the pool's only healthy member: nothing is approved early. Once
    its drain probe has taken it out of rotation (probed Down), it may go."""
    lb = arm_fake.add_load_balancer(SUB, "rg-web", "lb-web", ["pool-a"], rules={"http": "pool-a"})
    pool = f"{lb}/backendAddressPools/pool-a"
    web_1 = web_vm(arm_fake, "web-1", [pool])
    app.deliver("approval_gate", vm_side_prepared(["web-1"]))
    assert not app.commands.sent
    arm_fake.set_probe(web_1, up=False)
    app.deliver("approval_gate", vm_side_prepared(["web-1"]))
    ((_, session),) = app.commands.sent
    assert session == "web-1"


def test_a_vm_side_prepared_for_a_vm_outside_the_event_is_refused(
    app: App, arm_fake: FakeArm, pool: str
) -> None:
    web_vm(arm_fake, "web-1", [pool])
    web_vm(arm_fake, "web-2", [pool])
    app.deliver("approval_gate", vm_side_prepared(["web-2"]))  # web-1 is not in Resources
    assert not app.commands.sent
