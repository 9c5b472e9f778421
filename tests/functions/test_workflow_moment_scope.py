"""A drain moment (and the gate's decision when a window opens) is the event's in its verified
scope (issue 24 after issue 23): what another scope says of the same EventId never moves, drops,
spends or replaces it, and a moment's due message acts only on its own scope's record.

The world of test_workflow_drain_moments (web-1..3 in as-web and pool-a; the golden event,
NotBefore 01:35, drained at 01:30), and db-1: a real VM of another availability set (as-db) in
its own pool (with db-2, so it can drain), verified with its own vmId, standing for a
compromised VM of another set that knows as-web's EventIds (test_workflow_event_scope).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from functions.lb_pools import moments
from functions.shared import composition
from functions.shared.event_record import scoped_event_key
from sebridge.contract.events import Observer
from tests.fixtures import golden
from tests.functions.support import (
    AVAILABILITY_SET_ID,
    EVENT_ID,
    RG,
    SUB,
    App,
    Scheduled,
    due_message,
    envelope,
)
from tests.functions.test_workflow_drain_moments import (
    LONG_NOTICE,
    MOMENT,
    POLICY,
    WINDOW_OPENS,
    _in_pools,
    _prepared_envelopes,
    _window_policy,
    world,  # noqa: F401 - the fixture
)
from tests.functions.test_workflow_event_scope import db_1

pytestmark = pytest.mark.timeout(90)

LATER = "Sun, 22 Nov 2026 02:35:00 GMT"  # an hour after the golden NotBefore


@pytest.fixture
def db(arm_fake: FakeArm) -> Observer:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-db", ["pool-db"])
    pool = f"{lb}/backendAddressPools/pool-db"
    observer = db_1(arm_fake, [pool])
    as_db = arm_fake.add_availability_set(SUB, RG, "as-db")
    arm_fake.add_vm(SUB, RG, "db-2", [pool], availability_set=as_db)
    return observer


def _forged(transition: str, by: Observer) -> Any:
    fields: dict[str, Any] = {"Resources": ["db-1"]}
    if transition == "Updated":
        fields["NotBefore"] = LATER
    if transition == "Started":
        fields.update(EventStatus="Started", NotBefore="")
    if transition == "Cancelled":
        fields["NotBefore"] = ""
    return envelope(transition, by, **fields)


@pytest.mark.parametrize(
    "transition", [None, "Scheduled", "Updated", "Cancelled", "Started"], ids=str
)
def test_another_scope_never_moves_drops_or_replaces_this_scopes_drain_moment(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
    db: Observer,
    transition: str | None,
) -> None:
    """db-1 (as-db) says Scheduled (same NotBefore: the same moment), Updated (an hour later),
    Cancelled or Started of as-web's EventId, naming itself: as-web's moment still fires at
    01:30 and drains web-1 and web-2 (what as-web's Scheduled named), never db-1 for it."""
    app = make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)
    app.deliver("lb_pools", golden.build()["scheduled"])
    if transition is not None:
        app.deliver("lb_pools", _forged(transition, db))
    db_drained_before = not arm_fake.vm_pools(db.resource_id or "")
    app.clock.now = MOMENT
    app.fire_due()
    assert _in_pools(app, world) == {"web-1": False, "web-2": False}
    # db-1 drains only for its own scope's word: at once for its Started, else at its moment.
    if transition != "Started":
        assert not db_drained_before
    if transition in (None, "Cancelled"):
        assert arm_fake.vm_pools(db.resource_id or "") != []


def test_a_due_message_acts_only_in_its_own_scope(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
    db: Observer,
) -> None:
    """Both scopes have a moment for the EventId at 01:30: each due message names its scope,
    and drains only what that scope's record says (db-1's never drains web-1)."""
    app = make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)
    assert app.scheduler is not None
    app.deliver("lb_pools", golden.build()["scheduled"])
    app.deliver("lb_pools", _forged("Scheduled", db))
    due = {moments.parse_due(e.body).key: e for e in app.scheduler.pending.values()}
    web_key = scoped_event_key(EVENT_ID, AVAILABILITY_SET_ID)
    assert web_key in due and len(due) == 2, sorted(due)
    (db_key,) = set(due) - {web_key}
    app.clock.now = MOMENT
    app.scheduler.pending.clear()
    app.call("drain_moment", due_message(due[db_key]))
    assert _in_pools(app, world) == {"web-1": True, "web-2": True}
    assert arm_fake.vm_pools(db.resource_id or "") == []
    app.call("drain_moment", due_message(due[web_key]))
    assert _in_pools(app, world) == {"web-1": False, "web-2": False}


def test_a_due_message_for_a_scope_without_a_moment_does_nothing(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A due message naming as-web's EventId with another scope (or its token for another
    scope) finds no moment there: a no-op with a log line."""
    caplog.set_level(logging.INFO, logger="sebridge.functions.moments")
    app = make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)
    assert app.scheduler is not None
    app.deliver("lb_pools", golden.build()["scheduled"])
    (entry,) = app.scheduler.scheduled
    web = moments.parse_due(entry.body)
    other = scoped_event_key(EVENT_ID, "/subscriptions/x/availabilitysets/as-db")
    app.clock.now = MOMENT
    for key, tok in ((other, web.token), (other, moments.token(other, MOMENT))):
        body = moments.due_body(key, tok)
        app.call("drain_moment", due_message(Scheduled(99, body, MOMENT, "forged")))
    assert _in_pools(app, world) == {"web-1": True, "web-2": True}
    assert "no moment in its scope" in caplog.text


def test_another_scope_never_drops_this_scopes_decision_at_its_window(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    db: Observer,
) -> None:
    """db-1's Cancelled of as-web's EventId drops neither as-web's drain moment nor the gate's
    decision when the window opens: drained at 00:55, approved at 01:00."""
    app = make_app(
        DrainMomentsQueueName="drain-moments",
        APPROVAL_POLICY=_window_policy("Tue 02:00-05:00 Europe/Berlin"),
    )
    scheduled = envelope("Scheduled", NotBefore=LONG_NOTICE)
    app.deliver("lb_pools", scheduled)
    app.deliver("approval_gate", scheduled)
    app.deliver("lb_pools", _forged("Cancelled", db))
    app.clock.now = WINDOW_OPENS - timedelta(minutes=5)
    app.fire_due()
    assert _in_pools(app, world) == {"web-1": False, "web-2": False}
    for prepared in _prepared_envelopes(app):
        app.deliver("approval_gate", prepared)
    app.clock.now = WINDOW_OPENS
    app.fire_due()
    assert len(app.commands.sent) == 1


def _legacy_moment(app: App) -> bytes:
    """The record and queue as the schema-1 code left them: the flat ``drainMoment`` entry for
    the golden event at 01:30 (sequence 7) and its old-shape message, naming only the EventId."""
    message = golden.build()["scheduled"]
    tok = "0123456789abcdef01234567"
    legacy = {
        "at": MOMENT.isoformat(),
        "token": tok,
        "sequence": 7,
        "fired": False,
        "messageId": message.message_id,
        "message": json.loads(message.body_bytes()),
    }
    store = composition.dependencies().lb_pools.pools
    assert store is not None
    store.update_event(EVENT_ID, lambda r: r.update(eventId=EVENT_ID, drainMoment=legacy) is None)
    return json.dumps(
        {"schemaVersion": 1, "command": "drain-due", "eventId": EVENT_ID, "token": tok}
    ).encode()


def test_a_moment_scheduled_before_the_upgrade_still_drains_in_its_verified_scope(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    """A live deployment upgraded with a moment pending: when the old-shape message arrives it
    drains the stored message, verified again: in its own scope, once."""
    app = make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)
    old = _legacy_moment(app)
    app.clock.now = MOMENT
    app.call("drain_moment", due_message(Scheduled(7, old, MOMENT, "old")))
    assert _in_pools(app, world) == {"web-1": False, "web-2": False}
    writes = len(app.arm.writes())
    app.call("drain_moment", due_message(Scheduled(7, old, MOMENT, "old")))  # again: once
    assert len(app.arm.writes()) == writes


def test_a_scoped_moment_retires_the_one_scheduled_before_the_upgrade(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    """After the upgrade an Updated moves the moment an hour later: it is kept in as-web's scope
    and the old-shape message is cancelled; if it arrives all the same, it changes nothing."""
    app = make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)
    assert app.scheduler is not None
    old = _legacy_moment(app)
    app.deliver("lb_pools", envelope("Updated", NotBefore=LATER))
    assert 7 in app.scheduler.cancelled
    app.clock.now = MOMENT
    app.call("drain_moment", due_message(Scheduled(7, old, MOMENT, "old")))
    assert _in_pools(app, world) == {"web-1": True, "web-2": True}
    app.clock.now = MOMENT + timedelta(hours=1)
    assert app.fire_due() == 1
    assert _in_pools(app, world) == {"web-1": False, "web-2": False}


def test_a_moment_whose_stored_message_verifies_in_another_scope_drains_nothing(
    make_app: Callable[..., App],
    world: dict[str, str],  # noqa: F811 - the fixture
    arm_fake: FakeArm,
    db: Observer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """as-web's moment whose stored message is db-1's (a record written by anything but this
    code): the message verifies in as-db's scope, not the one the due message names, so
    nothing is drained (logged), and the moment is spent."""
    app = make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)
    key = scoped_event_key(EVENT_ID, AVAILABILITY_SET_ID)
    tok = moments.token(key, MOMENT)
    forged = _forged("Scheduled", db)
    entry = moments.Pending(
        MOMENT, tok, 5, False, forged.message_id, json.loads(forged.body_bytes())
    )
    store = composition.dependencies().lb_pools.pools
    assert store is not None
    store.update_event(EVENT_ID, lambda r: moments.with_pending(r, key, entry))
    app.clock.now = MOMENT
    app.call("drain_moment", due_message(Scheduled(5, moments.due_body(key, tok), MOMENT, "x")))
    assert arm_fake.vm_pools(db.resource_id or "") != []
    assert _in_pools(app, world) == {"web-1": True, "web-2": True}
    assert "verifies in another scope" in caplog.text
    assert moments.pending(store.read_event(EVENT_ID), key) == moments.Pending(
        MOMENT, tok, 5, True, forged.message_id, json.loads(forged.body_bytes())
    )
