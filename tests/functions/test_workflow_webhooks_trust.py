"""The webhooks behind the trust boundary (issue 23, finding 2): a message every other workflow
refuses posts nothing, resolves nothing, and one scope never resolves another's alert.

Through the real function objects, the loopback ARM and the recording webhook receivers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from emulators.fakes.webhooks import GENERIC, PAGERDUTY, SLACK, FakeWebhooks
from functions.shared.settings import SettingsError
from functions.webhooks.presets import UNVERIFIED_PREFIX
from sebridge.contract.events import Envelope, Observer
from tests.fixtures import golden
from tests.functions.support import (
    EVENT_ID,
    RG,
    SUB,
    App,
    envelope,
    pagerduty_dedup_key,
    web_vm,
)

pytestmark = pytest.mark.timeout(30)

ROUTING_KEY = "R0uting0Key0For0The0Fake0Service"
SLACK_TOKEN = "slack-secret-token-0001"
ENDPOINTS = [
    {"name": "ops-slack", "preset": "slack", "urlSetting": "WEBHOOK_SLACK_URL"},
    {
        "name": "oncall",
        "preset": "pagerduty",
        "routingKeySetting": "WEBHOOK_PD_ROUTING_KEY",
        "urlSetting": "WEBHOOK_PD_URL",
    },
    {"name": "cmdb", "preset": "generic", "urlSetting": "WEBHOOK_GENERIC_URL"},
]
AUDIT = [
    {"name": "security", "preset": "slack", "urlSetting": "WEBHOOK_SLACK_URL", "unverified": True},
    {"name": "siem", "preset": "generic", "urlSetting": "WEBHOOK_GENERIC_URL", "unverified": True},
]
GHOST = Observer(
    vm_name="ghost-1",
    vm_id="00000000-0000-4000-8000-00000000dead",
    resource_id=f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/"
    "virtualMachines/ghost-1",
    subscription_id=SUB,
    resource_group=RG,
    location="westeurope",
)


@pytest.fixture
def hooks() -> Iterator[FakeWebhooks]:
    server = FakeWebhooks(slack_tokens=(SLACK_TOKEN,))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    """web-1 and web-2 in as-web (the golden scope); db-1..3 in as-db, with db-1 alive."""
    db_set = arm_fake.add_availability_set(SUB, RG, "as-db")
    return {
        "web-1": web_vm(arm_fake, "web-1", []),
        "web-2": web_vm(arm_fake, "web-2", []),
        **{
            f"db-{n}": arm_fake.add_vm(SUB, RG, f"db-{n}", [], availability_set=db_set)
            for n in (1, 2, 3)
        },
        "as-db": db_set,
    }


@pytest.fixture
def make_hooks_app(make_app: Callable[..., App], hooks: FakeWebhooks) -> Callable[..., App]:
    def make(endpoints: list[dict[str, Any]], **extra: str) -> App:
        return make_app(
            **extra,
            WebhooksSubscriptionName="webhooks",
            WEBHOOKS=json.dumps(endpoints),
            WEBHOOK_SLACK_URL=hooks.slack_url(SLACK_TOKEN),
            WEBHOOK_PD_URL=hooks.pagerduty_url,
            WEBHOOK_PD_ROUTING_KEY=ROUTING_KEY,
            WEBHOOK_GENERIC_URL=hooks.generic_url("hook"),
        )

    return make


def posing_as_event_grid(message: Envelope) -> Envelope:
    """The message with Event Grid as its claimed source and a made-up seal."""
    body = json.loads(message.body_bytes())
    body["data"]["eventGrid"] = {"id": "forged", "topic": f"/subscriptions/{SUB}"}
    body["data"]["seal"] = "bm90LWEtcmVhbC1zZWFs"
    return replace(message, body=body)


def test_a_forged_terminate_posts_nothing_anywhere(
    make_hooks_app: Callable[..., App],
    hooks: FakeWebhooks,
    world: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's message: an observer that does not exist, claiming Event Grid with a
    made-up seal, announcing a Terminate of db-1..3. lb-pools and the gate refuse it; so does
    the webhooks function: no PagerDuty incident, no Slack line, no generic POST."""
    app = make_hooks_app(ENDPOINTS)
    forged = posing_as_event_grid(
        envelope("Scheduled", GHOST, EventType="Terminate", Resources=["db-1", "db-2", "db-3"])
    )
    for function in ("lb_pools", "approval_gate", "webhooks"):
        app.deliver(function, forged)
    assert not hooks.accepted and not hooks.alerts
    assert not app.arm.writes() and not app.commands.sent
    refused = [r for r in caplog.records if getattr(r, "securityEvent", False)]
    assert {getattr(r, "workflow", None) for r in refused} == {
        "lb_pools",
        "approval_gate",
        "webhooks",
    }


def test_a_cancelled_from_a_vm_that_does_not_exist_resolves_nothing(
    make_hooks_app: Callable[..., App], hooks: FakeWebhooks, world: dict[str, str]
) -> None:
    app = make_hooks_app(ENDPOINTS)
    app.deliver("webhooks", envelope("Scheduled", EventType="Terminate"))
    key = pagerduty_dedup_key(EVENT_ID)
    assert hooks.alerts == {key: "triggered"}
    ghost_cancel = envelope("Cancelled", GHOST, EventType="Terminate")
    app.deliver("webhooks", ghost_cancel)
    app.deliver("webhooks", posing_as_event_grid(ghost_cancel))
    assert hooks.alerts == {key: "triggered"}
    assert [b["event_action"] for b in hooks.bodies(PAGERDUTY)] == ["trigger"]


def test_one_scope_never_resolves_another_scopes_alert(
    make_hooks_app: Callable[..., App], hooks: FakeWebhooks, world: dict[str, str]
) -> None:
    """db-1 exists and passes the scope check, but it is in as-db: its Cancelled of the same
    EventId names its own alert, not web-1's (the dedup key carries the verified scope)."""
    app = make_hooks_app(ENDPOINTS)
    app.deliver("webhooks", envelope("Scheduled", EventType="Terminate"))
    db_1 = replace(
        golden.OBSERVER,
        vm_name="db-1",
        vm_id=app.arm.resources[world["db-1"].lower()]["properties"]["vmId"],
        resource_id=world["db-1"],
    )
    app.deliver("webhooks", envelope("Cancelled", db_1, EventType="Terminate", Resources=["db-1"]))
    web_key = pagerduty_dedup_key(EVENT_ID)
    db_key = pagerduty_dedup_key(EVENT_ID, world["as-db"])
    assert web_key != db_key
    assert hooks.alerts[web_key] == "triggered"
    resolve = hooks.bodies(PAGERDUTY)[-1]
    assert (resolve["event_action"], resolve["dedup_key"]) == ("resolve", db_key)
    # The genuine end of the event resolves it.
    app.deliver("webhooks", envelope("Cancelled", EventType="Terminate"))
    assert hooks.alerts[web_key] == "resolved"


def test_audit_endpoints_get_unverified_messages_marked(
    make_hooks_app: Callable[..., App],
    hooks: FakeWebhooks,
    world: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    app = make_hooks_app(ENDPOINTS + AUDIT)
    forged = envelope("Scheduled", GHOST, EventType="Terminate", Resources=["db-1"])
    app.deliver("webhooks", forged)
    (slack,) = hooks.bodies(SLACK)
    assert slack["text"].startswith(UNVERIFIED_PREFIX)
    assert "'ghost-1' does not exist" in slack["text"]
    (generic,) = hooks.bodies(GENERIC)
    assert generic["verified"] is False and "does not exist" in generic["unverifiedReason"]
    assert not hooks.bodies(PAGERDUTY)
    # A verified message reaches every endpoint, marked verified.
    app.deliver("webhooks", envelope("Scheduled", EventType="Terminate"))
    assert [b["verified"] for b in hooks.bodies(GENERIC)] == [False, True, True]
    assert not hooks.bodies(SLACK)[-1]["text"].startswith(UNVERIFIED_PREFIX)


def test_pagerduty_may_not_ask_for_unverified_messages(
    make_hooks_app: Callable[..., App],
) -> None:
    with pytest.raises(SettingsError, match="unverified is not for the pagerduty preset"):
        make_hooks_app([{**ENDPOINTS[1], "unverified": True}])
