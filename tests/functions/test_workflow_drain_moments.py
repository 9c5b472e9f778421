"""lb-pools drains at the event's drain moment (NotBefore minus the lead), through messages it
schedules to itself: through the function objects, against the loopback ARM and blob storage,
with a clock the test controls (no sleeping). The broker's scheduling itself is tested against
the Service Bus emulator (tests/contract/test_management.py, tests/e2e)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from emulators.fakes.webhooks import GENERIC, FakeWebhooks
from functions.lb_pools import moments
from functions.shared.event_record import scoped_event_key
from functions.teams.cards import FACT_PREFIX
from sebridge.contract.events import parse_message
from tests.fixtures import golden
from tests.functions.support import (
    AVAILABILITY_SET_ID,
    EVENT_ID,
    NOW,
    RG,
    SUB,
    App,
    Scheduled,
    due_message,
    envelope,
    web_vm,
)

pytestmark = pytest.mark.timeout(60)

# Reboot: 5 minutes before NotBefore; the golden event's NotBefore is 01:35, seen at 01:20.
POLICY = json.dumps(
    {
        "rules": [{"name": "prepare-first", "match": {}, "action": "approve-when-prepared"}],
        "leadSeconds": {"Reboot": 300, "Freeze": 120},
    }
)
NOT_BEFORE = NOW.replace(minute=35)
MOMENT = NOT_BEFORE - timedelta(seconds=300)


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    lb = arm_fake.add_load_balancer(SUB, RG, "lb-web", ["pool-a"])
    pool = f"{lb}/backendAddressPools/pool-a"
    return {
        "web-1": web_vm(arm_fake, "web-1", [pool]),
        "web-2": web_vm(arm_fake, "web-2", [pool]),
        "web-3": web_vm(arm_fake, "web-3", [pool]),  # keeps pool-a above LB_MIN_HEALTHY
        "pool": pool,
    }


@pytest.fixture
def timed(make_app: Callable[..., App]) -> App:
    return make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)


def _in_pools(app: App, world: dict[str, str]) -> dict[str, bool]:
    return {vm: bool(app.arm.vm_pools(world[vm])) for vm in ("web-1", "web-2")}


def _prepared(app: App) -> list[str]:
    return [m.message_id for m in app.publisher.published if m.subject == "Prepared"]


def test_a_long_notice_drains_at_not_before_minus_the_lead(
    timed: App, world: dict[str, str]
) -> None:
    assert timed.scheduler is not None
    timed.deliver("lb_pools", golden.build()["scheduled"])
    # Seen at 01:21 for 01:35: still in its pools, nothing for the gate, one moment at 01:30.
    assert _in_pools(timed, world) == {"web-1": True, "web-2": True}
    assert _prepared(timed) == [] and timed.arm.writes() == []
    (entry,) = timed.scheduler.scheduled
    assert entry.at == MOMENT
    due = moments.parse_due(entry.body)
    assert (due.command, due.event_id) == ("drain-due", EVENT_ID)
    assert due.key == scoped_event_key(EVENT_ID, AVAILABILITY_SET_ID)  # as-web's scope
    timed.clock.now = MOMENT - timedelta(seconds=1)
    assert timed.fire_due() == 0
    assert _in_pools(timed, world) == {"web-1": True, "web-2": True}
    timed.clock.now = MOMENT
    assert timed.fire_due() == 1
    assert _in_pools(timed, world) == {"web-1": False, "web-2": False}
    assert len(_prepared(timed)) == 1
    prepared = parse_message(
        next(m for m in timed.publisher.published if m.subject == "Prepared").body_bytes()
    )
    assert prepared.data["prepared"]["vms"] == ["web-1", "web-2"]


def test_a_moment_fires_once_and_a_replayed_scheduled_schedules_nothing_twice(
    timed: App, world: dict[str, str]
) -> None:
    assert timed.scheduler is not None
    timed.deliver("lb_pools", golden.build()["scheduled"])
    timed.deliver("lb_pools", golden.build()["scheduled"])  # redelivered
    assert len(timed.scheduler.scheduled) == 1
    (entry,) = timed.scheduler.scheduled
    timed.clock.now = MOMENT
    timed.fire_due()
    writes = len(timed.arm.writes())
    timed.call("drain_moment", due_message(entry))  # the broker delivers it again
    assert len(timed.arm.writes()) == writes and len(_prepared(timed)) == 1
    timed.deliver("lb_pools", golden.build()["scheduled"])  # and the Scheduled once more
    assert len(timed.scheduler.scheduled) == 1
    assert _in_pools(timed, world) == {"web-1": False, "web-2": False}


def test_an_updated_not_before_moves_the_moment_and_the_old_one_changes_nothing(
    timed: App, world: dict[str, str]
) -> None:
    assert timed.scheduler is not None
    timed.deliver("lb_pools", golden.build()["scheduled"])
    (old,) = timed.scheduler.scheduled
    timed.deliver("lb_pools", envelope("Updated", NotBefore="Sun, 22 Nov 2026 02:35:00 GMT"))
    assert old.sequence in timed.scheduler.cancelled
    (new,) = timed.scheduler.pending.values()
    assert new.at == MOMENT + timedelta(hours=1)
    # A cancel that lost the race: the old message arrives all the same and changes nothing.
    timed.clock.now = MOMENT
    timed.call("drain_moment", due_message(old))
    assert _in_pools(timed, world) == {"web-1": True, "web-2": True}
    timed.clock.now = new.at
    assert timed.fire_due() == 1
    assert _in_pools(timed, world) == {"web-1": False, "web-2": False}


def test_cancelled_removes_the_moment(timed: App, world: dict[str, str]) -> None:
    assert timed.scheduler is not None
    timed.deliver("lb_pools", golden.build()["scheduled"])
    (entry,) = timed.scheduler.scheduled
    timed.deliver("lb_pools", golden.build()["cancelled"])
    assert timed.scheduler.cancelled == [entry.sequence]
    timed.clock.now = MOMENT + timedelta(minutes=1)
    timed.call("drain_moment", due_message(entry))  # delivered anyway
    assert _in_pools(timed, world) == {"web-1": True, "web-2": True}
    assert timed.arm.writes() == [] and _prepared(timed) == []


def test_a_notice_shorter_than_the_lead_drains_at_first_sight(
    timed: App, world: dict[str, str]
) -> None:
    assert timed.scheduler is not None
    timed.deliver("lb_pools", envelope("Scheduled", NotBefore="Sun, 22 Nov 2026 01:24:00 GMT"))
    assert timed.scheduler.scheduled == []
    assert _in_pools(timed, world) == {"web-1": False, "web-2": False}
    assert len(_prepared(timed)) == 1
    # Drained: a later Updated never undoes it (drains again, idempotent; Prepared again).
    timed.deliver("lb_pools", envelope("Updated", NotBefore="Sun, 22 Nov 2026 03:00:00 GMT"))
    assert timed.scheduler.scheduled == []
    assert _in_pools(timed, world) == {"web-1": False, "web-2": False}


@pytest.mark.parametrize("event_type", ["Preempt", "Terminate"])
def test_preempt_and_terminate_drain_at_first_sight(
    timed: App, world: dict[str, str], event_type: str
) -> None:
    assert timed.scheduler is not None
    timed.deliver("lb_pools", envelope("Scheduled", EventType=event_type))
    assert timed.scheduler.scheduled == []
    assert _in_pools(timed, world) == {"web-1": False, "web-2": False}


def test_started_drains_now_and_spends_the_moment(timed: App, world: dict[str, str]) -> None:
    assert timed.scheduler is not None
    timed.deliver("lb_pools", golden.build()["scheduled"])
    (entry,) = timed.scheduler.scheduled
    timed.deliver("lb_pools", golden.build()["started"])
    assert _in_pools(timed, world) == {"web-1": False, "web-2": False}
    assert timed.scheduler.cancelled == [entry.sequence]
    writes = len(timed.arm.writes())
    timed.clock.now = MOMENT
    timed.call("drain_moment", due_message(entry))
    assert len(timed.arm.writes()) == writes


def test_a_restarted_app_keeps_the_pending_moment(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    first = make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)
    assert first.scheduler is not None
    first.deliver("lb_pools", golden.build()["scheduled"])
    (entry,) = first.scheduler.scheduled
    # A new process: nothing in memory; the record (blob) and Service Bus keep the moment.
    second = make_app(DrainMomentsQueueName="drain-moments", APPROVAL_POLICY=POLICY)
    assert second.scheduler is not None and second.scheduler is not first.scheduler
    second.deliver("lb_pools", golden.build()["scheduled"])  # redelivered after the restart
    assert second.scheduler.scheduled == []
    second.clock.now = MOMENT
    second.call("drain_moment", due_message(entry))
    assert _in_pools(second, world) == {"web-1": False, "web-2": False}


def test_without_the_queue_lb_pools_drains_at_first_sight(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    app = make_app(APPROVAL_POLICY=POLICY)
    assert app.scheduler is None and "drain_moment" not in app.functions
    app.deliver("lb_pools", golden.build()["scheduled"])
    assert _in_pools(app, world) == {"web-1": False, "web-2": False}


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"schemaVersion": 1, "command": "approve", "eventId": "x", "token": "y"}',
        b'{"schemaVersion": 1, "command": "drain-due", "eventId": 3, "token": "y"}',
        b"{" + b" " * 2000 + b"}",
    ],
)
def test_a_message_lb_pools_did_not_schedule_is_dropped(
    timed: App, world: dict[str, str], body: bytes
) -> None:
    timed.deliver("lb_pools", golden.build()["scheduled"])
    timed.clock.now = MOMENT
    timed.call("drain_moment", due_message(Scheduled(99, body, MOMENT, "forged")))
    assert _in_pools(timed, world) == {"web-1": True, "web-2": True}


def test_a_forged_token_for_a_real_event_drains_nothing(timed: App, world: dict[str, str]) -> None:
    timed.deliver("lb_pools", golden.build()["scheduled"])
    key = scoped_event_key(EVENT_ID, AVAILABILITY_SET_ID)
    forged = moments.due_body(key, moments.token(key, NOW))
    timed.call("drain_moment", due_message(Scheduled(99, forged, NOW, "forged")))
    assert _in_pools(timed, world) == {"web-1": True, "web-2": True}


def _fact(card: dict[str, Any], title: str) -> str | None:
    wanted = FACT_PREFIX + title
    for item in card["body"]:
        if item.get("id") == wanted:
            return "".join(r["text"] for r in item["inlines"]).split(": ", 1)[1]
    return None


@pytest.mark.parametrize(
    ("settings", "scheduled", "expected"),
    [
        ({"DrainMomentsQueueName": "drain-moments"}, {}, "at 01:30 UTC"),
        (
            {"DrainMomentsQueueName": "drain-moments"},
            {"NotBefore": "Tue, 24 Nov 2026 09:00:00 GMT"},
            "at 08:55 UTC on Tue 24 Nov",
        ),
        ({"DrainMomentsQueueName": "drain-moments"}, {"EventType": "Preempt"}, "now"),
        ({}, {}, "now"),  # no drain-moments queue: lb-pools drains at first sight
    ],
)
def test_the_card_says_when_the_drain_happens(
    make_app: Callable[..., App],
    world: dict[str, str],
    settings: dict[str, str],
    scheduled: dict[str, str],
    expected: str,
) -> None:
    app = make_app(APPROVAL_POLICY=POLICY, **settings)
    app.deliver("teams", envelope("Scheduled", **scheduled))
    assert _fact(app.teams.cards[-1], "drain-from-pools") == expected
    app.deliver("teams", golden.build()["started"])
    assert _fact(app.teams.cards[-1], "drain-from-pools") is None  # said only before it


def test_a_card_of_an_event_lb_pools_does_not_drain_says_nothing_of_a_drain(timed: App) -> None:
    timed.deliver("teams", envelope("Scheduled", EventType="Freeze", DurationInSeconds=5))
    assert _fact(timed.teams.cards[-1], "drain-from-pools") is None


def test_a_webhook_says_when_the_drain_happens(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    hooks = FakeWebhooks()
    hooks.start()
    try:
        app = make_app(
            APPROVAL_POLICY=POLICY,
            DrainMomentsQueueName="drain-moments",
            WebhooksSubscriptionName="webhooks",
            WEBHOOKS=json.dumps(
                [{"name": "cmdb", "preset": "generic", "urlSetting": "WEBHOOK_GENERIC_URL"}]
            ),
            WEBHOOK_GENERIC_URL=hooks.generic_url("cmdb"),
        )
        app.deliver("webhooks", golden.build()["scheduled"])
        app.deliver("webhooks", golden.build()["completed"])
        first, second = hooks.bodies(GENERIC)
        assert first["drainText"] == "at 01:30 UTC"
        assert second["drainText"] is None
    finally:
        hooks.stop()


# ---- maintenance windows -----------------------------------------------------------------
# Seen on Sunday 22 Nov at 01:21 UTC; NotBefore Friday 27 Nov 12:00. The window opens on
# Tuesday 24 Nov at 02:00 Berlin time (01:00 UTC): drained at 00:55, approved at 01:00.
LONG_NOTICE = "Fri, 27 Nov 2026 12:00:00 GMT"
WINDOW_OPENS = datetime(2026, 11, 24, 1, 0, tzinfo=UTC)


def _window_policy(*windows: str) -> str:
    return json.dumps(
        {
            "rules": [
                {
                    "name": "web-window",
                    "match": {"vmName": ["web-*"]},
                    "action": "approve-when-prepared",
                    "windows": list(windows),
                }
            ],
            "leadSeconds": {"Reboot": 300},
        }
    )


def _prepared_envelopes(app: App) -> list[Any]:
    return [m for m in app.publisher.published if m.subject == "Prepared"]


def test_a_week_of_notice_is_drained_and_approved_in_the_window(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    app = make_app(
        DrainMomentsQueueName="drain-moments",
        APPROVAL_POLICY=_window_policy("Tue 02:00-05:00 Europe/Berlin"),
    )
    assert app.scheduler is not None
    scheduled = envelope("Scheduled", NotBefore=LONG_NOTICE)
    app.deliver("lb_pools", scheduled)
    app.deliver("approval_gate", scheduled)
    app.deliver("teams", scheduled)
    assert _fact(app.teams.cards[-1], "drain-from-pools") == "at 00:55 UTC on Tue 24 Nov"
    due = sorted((moments.parse_due(e.body).command, e.at) for e in app.scheduler.pending.values())
    assert due == [
        ("decide-due", WINDOW_OPENS),
        ("drain-due", WINDOW_OPENS - timedelta(minutes=5)),
    ]
    assert not app.commands.sent and _in_pools(app, world) == {"web-1": True, "web-2": True}

    # The lead before the window: drained, Prepared; the gate still waits for the window.
    app.clock.now = WINDOW_OPENS - timedelta(minutes=5)
    assert app.fire_due() == 1
    assert _in_pools(app, world) == {"web-1": False, "web-2": False}
    (prepared,) = _prepared_envelopes(app)
    app.deliver("approval_gate", prepared)
    assert not app.commands.sent

    # The window opens: the gate decides again and approves.
    app.clock.now = WINDOW_OPENS
    assert app.fire_due() == 1
    ((command, session),) = app.commands.sent
    assert session == "web-1" and "web-window" in json.loads(command.body_bytes())["reason"]
    assert app.fire_due() == 0


def test_a_not_before_inside_the_window_is_still_approved_at_its_start(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    app = make_app(
        DrainMomentsQueueName="drain-moments",
        APPROVAL_POLICY=_window_policy("Tue 02:00-05:00 Europe/Berlin"),
    )
    scheduled = envelope("Scheduled", NotBefore="Tue, 24 Nov 2026 02:30:00 GMT")
    app.deliver("lb_pools", scheduled)
    app.deliver("approval_gate", scheduled)
    app.clock.now = WINDOW_OPENS - timedelta(minutes=5)
    app.fire_due()
    for prepared in _prepared_envelopes(app):
        app.deliver("approval_gate", prepared)
    assert not app.commands.sent
    app.clock.now = WINDOW_OPENS
    app.fire_due()
    assert len(app.commands.sent) == 1


def test_outside_every_window_the_event_waits_for_its_not_before(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    # The only window opens after NotBefore (Saturday): no early approval, drain at NB - lead.
    app = make_app(
        DrainMomentsQueueName="drain-moments",
        APPROVAL_POLICY=_window_policy("Sat 02:00-05:00 Europe/Berlin"),
    )
    assert app.scheduler is not None
    scheduled = envelope("Scheduled", NotBefore=LONG_NOTICE)
    app.deliver("lb_pools", scheduled)
    app.deliver("approval_gate", scheduled)
    (drain,) = app.scheduler.pending.values()
    assert moments.parse_due(drain.body).command == "drain-due"
    assert drain.at == datetime(2026, 11, 27, 11, 55, tzinfo=UTC)
    app.clock.now = drain.at
    app.fire_due()
    for prepared in _prepared_envelopes(app):
        app.deliver("approval_gate", prepared)
    assert _in_pools(app, world) == {"web-1": False, "web-2": False}
    assert not app.commands.sent  # Azure starts it at NotBefore


def test_a_cancelled_event_is_not_decided_when_its_window_opens(
    make_app: Callable[..., App], world: dict[str, str]
) -> None:
    app = make_app(
        DrainMomentsQueueName="drain-moments",
        APPROVAL_POLICY=_window_policy("Tue 02:00-05:00 Europe/Berlin"),
    )
    assert app.scheduler is not None
    scheduled = envelope("Scheduled", NotBefore=LONG_NOTICE)
    app.deliver("lb_pools", scheduled)
    app.deliver("approval_gate", scheduled)
    app.deliver("lb_pools", envelope("Cancelled", NotBefore=LONG_NOTICE))
    assert app.scheduler.pending == {}  # both moments cancelled
    assert len(app.scheduler.cancelled) == 2
