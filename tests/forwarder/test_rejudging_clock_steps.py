"""Hostile review h54: a late identity after a step of the wall clock. The moment kept for the
re-judging of a first-sight revision is its first sight, on this VM's clock: it moves with a
step as the observation times do (before, it stayed, and the revision's prepare hook was lost).
Two VMs see the same documents: ``known`` by the identity, ``late`` by the host name until it
resolves; both follow the wall clock (the drain probe configured)."""

from __future__ import annotations

from datetime import timedelta

from sebridge.contract.events import Observer
from sebridge.imds import ScheduledEvent
from tests.forwarder.local_support import OBSERVER, document
from tests.forwarder.test_drain_moments import A, Forwarder, Outside, reboot

HOST = Observer(vm_name="host-1")


def run(step: int) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    known, late = Outside(), Outside()
    vk, vl = Forwarder(known), Forwarder(late)

    def poll(*events: ScheduledEvent, resolved: bool = False) -> None:
        late_observer = OBSERVER if resolved else HOST
        for outside, vm, observer in ((known, vk, OBSERVER), (late, vl, late_observer)):
            outside.clock.advance(1)
            vm.actions.document_observed(document(*events), observer, outside.clock.now())
            vm.tick()

    first = reboot(A, not_before_in=120)  # shorter than the 300 s lead: moment at first sight
    poll(first)
    for _ in range(9):
        poll(first)
    for outside in (known, late):
        outside.clock.wall += timedelta(seconds=step)  # NTP steps the wall clock
    updated = reboot(A, not_before_in=3000)  # an Updated NotBefore
    poll(updated)
    poll(updated, resolved=True)
    poll(updated, resolved=True)
    return {(m, h) for m, h, _ in known.ran}, {(m, h) for m, h, _ in late.ran}


def test_no_step_same_runs() -> None:
    known, late = run(0)
    assert late == known


def test_a_step_back_before_the_identity_resolves_same_runs() -> None:
    known, late = run(-600)
    assert late == known, f"known ran {sorted(known - late)} that the late VM never runs"


def test_a_step_back_while_the_late_vm_is_down_same_runs() -> None:
    """The same through the start path: the late VM is stopped (graceful), the wall clock steps
    back 600 s while it is down, it starts (the view is moved by the stamp), then the Updated
    and the identity."""
    known, late = Outside(), Outside()
    vk, vl = Forwarder(known), Forwarder(late)
    first = reboot(A, not_before_in=120)
    for _ in range(10):
        for outside, vm, observer in ((known, vk, OBSERVER), (late, vl, HOST)):
            outside.clock.advance(1)
            vm.actions.document_observed(document(first), observer, outside.clock.now())
            vm.tick()
    vl.actions.save()
    for outside in (known, late):
        outside.clock.advance(2)
        outside.clock.wall -= timedelta(seconds=600)
    vl = Forwarder(late)
    updated = reboot(A, not_before_in=3000)
    for observer in (HOST, OBSERVER, OBSERVER):
        for outside, vm, who in ((known, vk, OBSERVER), (late, vl, observer)):
            outside.clock.advance(1)
            vm.actions.document_observed(document(updated), who, outside.clock.now())
            vm.tick()
    ran_known = {(m, h) for m, h, _ in known.ran}
    ran_late = {(m, h) for m, h, _ in late.ran}
    assert ran_late == ran_known, f"known ran {sorted(ran_known - ran_late)}, the late VM never"
