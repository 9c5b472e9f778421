"""The order of what a scope says of an event is the event's own, never an observer's clock
(hostile review of issue 23, round two, break 3).

Every member of an availability set reports the set's events from its own forwarder, each with
its own clock. The event's record (functions.shared.event_record) used to keep the Resources of
the transition with the latest *observation time*: with two honest observers a minute apart,
the Updated that grew an event was ordered before its Scheduled, and the gate approved the event
early while the VMs the Updated added were still healthy members of their pools. Now a
transition's place in the event's life (appearance and rank, from its message id, which every
observer derives alike) orders it; two Updateds of one appearance go by the order the app
receives them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.shared import event_record
from sebridge.contract.events import Transition, event_message
from sebridge.lifecycle import Life, advance
from tests.fixtures import golden
from tests.functions.support import NOW, App, event
from tests.functions.test_workflow_capacity_paths import (
    VMS,
    approved,
    observer,
    world,  # noqa: F401 - the fixture
)
from tests.functions.test_workflow_event_now import E
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(90)

T = golden.OBSERVED_AT


def life_of_an_event() -> list[tuple[Transition, tuple[str, ...], str]]:
    """Scheduled [web-1], Updated to all three, Updated to [web-2, web-3], Started: with the
    message ids every observer gives them (sebridge.lifecycle.advance)."""
    steps = [
        (Transition.SCHEDULED, ("web-1",)),
        (Transition.UPDATED, VMS),
        (Transition.UPDATED, ("web-2", "web-3")),
        (Transition.STARTED, ("web-2", "web-3")),
    ]
    life: Life | None = None
    result = []
    for transition, names in steps:
        status = "Started" if transition is Transition.STARTED else "Scheduled"
        life, message_id = advance(
            life, transition.value, event(Resources=list(names), EventStatus=status)
        )
        result.append((transition, names, message_id))
    return result


LIFE = life_of_an_event()


def noted(deliveries: list[tuple[int, int]], skews: list[int]) -> dict[str, Any]:
    """The record after ``deliveries`` ((step of LIFE, observer)), each observer's clock
    ``skews[observer]`` seconds off."""
    record: dict[str, Any] = {}
    for step, who in deliveries:
        transition, names, message_id = LIFE[step]
        event_record.note(
            record,
            placement="as-web",
            resources=names,
            observed_at=T + timedelta(minutes=step, seconds=skews[who]),
            transition=transition,
            members=[],
            now=NOW,
            message_id=message_id,
        )
    return record


@settings(max_examples=examples(200), deadline=None)
@given(
    deliveries=st.lists(
        st.tuples(st.integers(0, len(LIFE) - 1), st.integers(0, 2)), min_size=1, max_size=12
    ),
    skews=st.lists(st.integers(-3600, 3600), min_size=3, max_size=3),
)
def test_no_clock_changes_what_the_record_says(
    deliveries: list[tuple[int, int]], skews: list[int]
) -> None:
    """Whatever the observers' clocks, the record names what it names with every clock right;
    and it never goes back to a transition earlier in the event's life than one it received."""
    view = event_record.scope_of(noted(deliveries, skews), "as-web")
    honest = event_record.scope_of(noted(deliveries, [0, 0, 0]), "as-web")
    assert view is not None and honest is not None
    assert view.resources == honest.resources
    latest = max(event_record.rank(LIFE[step][0].value) for step, _ in deliveries)
    assert event_record.rank(view.transition) == latest
    if latest == event_record.rank("Started"):
        assert view.resources == LIFE[3][1]


def test_a_redelivered_updated_is_old_news() -> None:
    """Updated to all three, then to [web-2, web-3], then the first one again (a redelivery):
    the record keeps the second."""
    record = noted([(0, 0), (1, 0), (2, 1), (1, 2)], [0, 0, 0])
    view = event_record.scope_of(record, "as-web")
    assert view is not None and view.resources == ("web-2", "web-3")


@pytest.mark.parametrize("skew", [-120, 60, 120, 3600], ids=lambda s: f"web-2 {s:+d} s")
def test_a_skewed_observer_does_not_hide_the_vms_an_updated_added(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    skew: int,
) -> None:
    """web-2 (its clock ``skew`` off web-1's) reports E's Scheduled [web-1]; web-1 reports the
    Updated that grows E to all three a minute later by its clock. lb-pools drains web-1; the
    gate gets the Updated before lb-pools does: web-2 and web-3 are healthy members, so E is
    not approved."""
    app = make_app(LB_MIN_HEALTHY="1")
    scheduled = event_message(
        Transition.SCHEDULED,
        event(EventId=E, Resources=["web-1"]),
        observer(world, "web-2"),
        11,
        T + timedelta(seconds=skew),
    )
    grown = event_message(
        Transition.UPDATED,
        event(EventId=E, Resources=list(VMS)),
        observer(world, "web-1"),
        12,
        T + timedelta(minutes=1),
        changes={"Resources": {"from": ["web-1"], "to": list(VMS)}},
    )
    app.deliver("approval_gate", scheduled)  # waits: web-1 is in its pool
    app.deliver("lb_pools", scheduled)  # drains web-1
    app.deliver("approval_gate", grown)
    assert not approved(app, E)
    assert all(app.arm.vm_pools(world[vm]) for vm in ("web-2", "web-3"))
