"""Issue 24 review, item 1: an odd time, or any failure of the local actions on a document,
never leaves the drain probe following an older document (before: a neighbour's NotBefore of
year 1 raised OverflowError in the timing before the probe followed, and the probe answered
200 with a Started event of this VM listed). In-process, on the harness of
tests/forwarder/test_drain_moments.py.
"""

from __future__ import annotations

import pytest

from sebridge.forwarder.local.preparation import Observed, Preparations
from tests.forwarder.local_support import OBSERVER, document, imds_event
from tests.forwarder.test_drain_moments import A, B, Forwarder, Outside


class FailingPreparations(Preparations):
    def observe(self, item: Observed) -> None:
        raise RuntimeError("injected: a preparation failed")


@pytest.mark.parametrize("odd", ["0001-01-01T00:00:00Z", "Mon, 01 Jan 0001 00:00:00 GMT"])
def test_an_odd_notbefore_of_a_neighbour_never_keeps_the_probe_from_a_started_event(
    odd: str,
) -> None:
    """Before: drain_moment raised OverflowError on the neighbour's year-1 NotBefore, before
    the probe followed the document: 200 with a Started Redeploy of this VM listed."""
    vm = Forwarder(Outside())
    hostile = imds_event(A, event_type="Freeze", resources=["web-9"], not_before=odd)
    started = imds_event(B, event_type="Redeploy", status="Started")
    vm.poll(hostile, started)
    assert vm.status == 503


def test_the_probe_follows_the_document_when_the_local_actions_fail_on_it() -> None:
    """Before: an exception anywhere in document_observed (here the preparations) left the
    probe following the previous document."""
    vm = Forwarder(Outside())
    vm.actions.preparations = FailingPreparations(vm.store, vm.outside.outbox)
    started = imds_event(B, event_type="Redeploy", status="Started")
    with pytest.raises(RuntimeError, match="injected"):
        vm.actions.document_observed(document(started), OBSERVER, vm.outside.clock.now())
    assert vm.status == 503
    vm.actions.document_observed(document(), OBSERVER, vm.outside.clock.now())
    assert vm.status == 200  # and follows it back
