"""webhooks: through the function object, each preset posting to a recording loopback receiver
over real HTTP (emulators/fakes/webhooks.py) with the production adapter and requests."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from emulators.fakes.webhooks import GENERIC, PAGERDUTY, SLACK, FakeWebhooks, pagerduty_errors
from functions.adapters.retry import TransientHttpError
from functions.shared.invocations import INVOCATION_PREFIX, LOGGER_NAME
from functions.webhooks.core import DeliveryFailed
from functions.webhooks.templates import FIELDS
from tests.fixtures import golden
from tests.functions.support import EVENT_ID, App, envelope, pagerduty_dedup_key, web_vm
from tests.functions.test_workflow_app_guard import EXPECTED, _bindings, _sb

ROUTING_KEY = "R0uting0Key0For0The0Fake0Service"  # 32 letters and digits, like PagerDuty's
SLACK_TOKEN = "slack-secret-token-0001"
GENERIC_PATH = "hook-secret-path-42"
DEDUP_KEY = pagerduty_dedup_key(EVENT_ID)
OTHER_EVENT_ID = "3c1d8e0a-5b2f-4e8a-9a7c-0d6f4b2e1a90"


def test_the_dedup_key_is_the_worked_example() -> None:
    """Literal: the event of the golden fixtures in the availability set as-web of rg-web, by
    the rule of docs/workflows.md (pagerduty_dedup_key, the other tests' expectation, follows
    it too)."""
    assert DEDUP_KEY == "sebridge:8b95c271-2b77-4243-ad1a-585faa9cd908:194f275a009c2026"
    assert pagerduty_dedup_key("8B95C271-2B77-4243-AD1A-585FAA9CD908") == DEDUP_KEY


SLACK_ENDPOINT = {"name": "ops-slack", "preset": "slack", "urlSetting": "WEBHOOK_SLACK_URL"}
PD_ENDPOINT = {
    "name": "oncall",
    "preset": "pagerduty",
    "urlSetting": "WEBHOOK_PD_URL",
    "routingKeySetting": "WEBHOOK_PD_ROUTING_KEY",
}
GENERIC_ENDPOINT = {"name": "cmdb", "preset": "generic", "urlSetting": "WEBHOOK_GENERIC_URL"}

MakeHooks = Callable[..., App]


@pytest.fixture(autouse=True)
def world(arm_fake: FakeArm) -> None:
    """The golden observer web-1 and web-2 exist in ARM: the golden messages pass the scope
    check (tests/functions/test_workflow_webhooks_trust.py sends the ones that do not)."""
    web_vm(arm_fake, "web-1", [])
    web_vm(arm_fake, "web-2", [])


@pytest.fixture
def hooks() -> Iterator[FakeWebhooks]:
    server = FakeWebhooks(slack_tokens=(SLACK_TOKEN,))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_hooks_app(make_app: Callable[..., App], hooks: FakeWebhooks) -> MakeHooks:
    """The app with these endpoints in WEBHOOKS and their secrets pointing at the fake."""

    def make(*endpoints: dict[str, Any], **extra: str) -> App:
        secrets = {
            "WEBHOOK_SLACK_URL": hooks.slack_url(SLACK_TOKEN),
            "WEBHOOK_PD_URL": hooks.pagerduty_url,
            "WEBHOOK_PD_ROUTING_KEY": ROUTING_KEY,
            "WEBHOOK_GENERIC_URL": hooks.generic_url(GENERIC_PATH),
        }
        return make_app(
            WebhooksSubscriptionName="webhooks",
            WEBHOOKS=json.dumps(list(endpoints)),
            **{**secrets, **extra},
        )

    return make


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        json.loads(r.getMessage().removeprefix(INVOCATION_PREFIX))
        for r in caplog.records
        if r.name == LOGGER_NAME
    ]


def test_registered_only_with_its_subscription(make_hooks_app: MakeHooks) -> None:
    app = make_hooks_app()
    assert _bindings(app) == {**EXPECTED, "webhooks": _sb("%WebhooksSubscriptionName%")}


@pytest.mark.timeout(20)
def test_slack_gets_one_message_with_imds_text_escaped(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks
) -> None:
    app = make_hooks_app(SLACK_ENDPOINT)
    hostile = "<!channel> see <https://evil.example/login|the portal> & <@U0123> now"
    app.deliver("webhooks", envelope("Scheduled", Description=hostile))
    (body,) = hooks.bodies(SLACK)
    text = body["text"]
    assert text.startswith("*Reboot Scheduled*: web-1, web-2\n")
    assert "Not before (UTC): 2026-11-22T01:35:00Z | duration: unknown | source: Platform" in text
    # Nothing from IMDS can mention anyone or make a link: Slack shows it as typed.
    assert (
        "&lt;!channel&gt; see &lt;https://evil.example/login|the portal&gt; &amp; &lt;@U0123&gt;"
        in text
    )
    assert "<" not in text and ">" not in text
    request = next(r for r in hooks.requests if r.path.endswith(SLACK_TOKEN))
    assert request.headers["content-type"].startswith("application/json")


@pytest.mark.timeout(20)
def test_pagerduty_triggers_and_resolves_one_alert_per_event(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks
) -> None:
    app = make_hooks_app(PD_ENDPOINT)
    messages = golden.build()
    for name in ("scheduled", "updated", "started", "completed"):
        app.deliver("webhooks", messages[name])
    bodies = hooks.bodies(PAGERDUTY)
    assert [b["event_action"] for b in bodies] == ["trigger", "trigger", "trigger", "resolve"]
    assert {b["dedup_key"] for b in bodies} == {DEDUP_KEY}
    assert all(b["routing_key"] == ROUTING_KEY for b in bodies)
    assert all(pagerduty_errors(b) == [] for b in bodies)
    assert bodies[-1] == {
        "routing_key": ROUTING_KEY,
        "event_action": "resolve",
        "dedup_key": DEDUP_KEY,
    }
    trigger = bodies[0]["payload"]
    assert trigger["summary"] == "Reboot scheduled: web-1, web-2, not before 2026-11-22T01:35:00Z"
    assert trigger["source"] == "web-1, web-2" and trigger["severity"] == "warning"
    assert trigger["custom_details"]["eventId"] == EVENT_ID
    assert hooks.alerts == {DEDUP_KEY: "resolved"}


@pytest.mark.timeout(20)
def test_pagerduty_resolves_a_cancelled_event_and_redelivery_keeps_one_alert(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks
) -> None:
    app = make_hooks_app(PD_ENDPOINT)
    messages = golden.build()
    app.deliver("webhooks", messages["scheduled"])
    app.deliver("webhooks", messages["scheduled"])  # Service Bus redelivers
    assert hooks.alerts == {DEDUP_KEY: "triggered"}
    app.deliver("webhooks", messages["cancelled"])
    assert hooks.alerts == {DEDUP_KEY: "resolved"}
    assert [b["event_action"] for b in hooks.bodies(PAGERDUTY)] == ["trigger", "trigger", "resolve"]


@pytest.mark.timeout(20)
def test_pagerduty_pages_only_for_impactful_events(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = make_hooks_app(PD_ENDPOINT)
    short = {"EventId": OTHER_EVENT_ID, "EventType": "Freeze", "DurationInSeconds": 5}
    app.deliver("webhooks", envelope("Scheduled", **short))
    assert hooks.bodies(PAGERDUTY) == []
    assert _lines(caplog)[-1]["skipped"] == 1 and _lines(caplog)[-1]["outcome"] == "ok"
    # Terminate loses the VM: critical.
    app.deliver("webhooks", envelope("Started", EventType="Terminate", EventStatus="Started"))
    (body,) = hooks.bodies(PAGERDUTY)
    assert body["event_action"] == "trigger" and body["payload"]["severity"] == "critical"
    # A resolve goes out whatever the impact (an Updated may have changed it); PagerDuty
    # ignores one for an alert that never opened.
    app.deliver("webhooks", envelope("Completed", **short))
    assert hooks.bodies(PAGERDUTY)[-1] == {
        "routing_key": ROUTING_KEY,
        "event_action": "resolve",
        "dedup_key": pagerduty_dedup_key(OTHER_EVENT_ID),
    }
    assert hooks.alerts == {DEDUP_KEY: "triggered"}


@pytest.mark.timeout(20)
def test_generic_json_carries_every_contract_field_typed(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks
) -> None:
    app = make_hooks_app(GENERIC_ENDPOINT)
    message = golden.build()["scheduled"]
    app.deliver("webhooks", message)
    (body,) = hooks.bodies(GENERIC)
    assert set(body) == set(FIELDS)
    assert body["messageId"] == message.message_id
    assert body["eventId"] == EVENT_ID and body["transition"] == "Scheduled"
    assert body["resources"] == ["web-1", "web-2"] and body["durationInSeconds"] == -1
    assert body["impactful"] is True and body["notBefore"] == "2026-11-22T01:35:00Z"
    assert body["vmName"] == "web-1" and body["documentIncarnation"] == 11


@pytest.mark.timeout(20)
def test_a_template_places_values_without_changing_the_json(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks
) -> None:
    template = {"text": "${eventType} on ${affected}: ${description}", "id": "${eventId}"}
    app = make_hooks_app({**GENERIC_ENDPOINT, "template": template})
    hostile = 'x", "admin": true, "y": "\\ \n ${eventId} $$'
    app.deliver("webhooks", envelope("Scheduled", Description=hostile))
    (body,) = hooks.bodies(GENERIC)
    assert body == {"text": f"Reboot on web-1, web-2: {hostile}", "id": EVENT_ID}


@pytest.mark.timeout(20)
def test_filters_by_transition_event_type_and_impact(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks
) -> None:
    app = make_hooks_app(
        {**SLACK_ENDPOINT, "transitions": ["Started"], "eventTypes": ["freeze", "Reboot"]},
        {**GENERIC_ENDPOINT, "impactfulOnly": True},
    )
    app.deliver("webhooks", envelope("Scheduled"))  # Reboot, impactful: generic only
    app.deliver("webhooks", envelope("Started", EventStatus="Started"))  # both
    app.deliver("webhooks", envelope("Started", EventType="Redeploy", EventStatus="Started"))
    app.deliver("webhooks", envelope("Started", EventType="Freeze", DurationInSeconds=2))
    slack, generic = hooks.bodies(SLACK), hooks.bodies(GENERIC)
    assert [b["text"].split(":")[0] for b in slack] == ["*Reboot Started*", "*Freeze Started*"]
    assert [(b["eventType"], b["transition"]) for b in generic] == [
        ("Reboot", "Scheduled"),
        ("Reboot", "Started"),
        ("Redeploy", "Started"),
    ]


@pytest.mark.timeout(20)
def test_heartbeats_post_nothing(make_hooks_app: MakeHooks, hooks: FakeWebhooks) -> None:
    app = make_hooks_app(SLACK_ENDPOINT, GENERIC_ENDPOINT)
    app.deliver("webhooks", golden.build()["heartbeat"])
    assert hooks.requests == []


@pytest.mark.timeout(20)
def test_measured_reports_post_nothing(make_hooks_app: MakeHooks, hooks: FakeWebhooks) -> None:
    """A VM's Measured (issue 26) is no transition: no post, and PagerDuty resolves once."""
    app = make_hooks_app(SLACK_ENDPOINT, GENERIC_ENDPOINT, PD_ENDPOINT)
    app.deliver("webhooks", golden.build()["measured"])
    assert hooks.requests == []
    app.deliver("webhooks", golden.build()["completed"])
    app.deliver("webhooks", golden.build()["measured"])
    assert [b["event_action"] for b in hooks.bodies(PAGERDUTY)] == ["resolve"]


@pytest.mark.timeout(20)
def test_429_with_retry_after_is_honoured(make_hooks_app: MakeHooks, hooks: FakeWebhooks) -> None:
    app = make_hooks_app(SLACK_ENDPOINT)
    hooks.fail(SLACK, 429, times=2, retry_after="1")
    started = time.monotonic()
    app.deliver("webhooks", envelope("Scheduled"))
    assert len(hooks.bodies(SLACK)) == 1 and len(hooks.requests) == 3
    assert time.monotonic() - started >= 1.9  # two waits of Retry-After: 1


@pytest.mark.timeout(20)
def test_a_long_retry_after_gives_the_message_back_at_once(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks
) -> None:
    app = make_hooks_app(PD_ENDPOINT)
    hooks.fail(PAGERDUTY, 429, times=1, retry_after="120")
    started = time.monotonic()
    with pytest.raises(DeliveryFailed, match=r"oncall \(TransientHttpError\)"):
        app.deliver("webhooks", envelope("Scheduled"))
    assert time.monotonic() - started < 2 and len(hooks.requests) == 1


@pytest.mark.timeout(30)
def test_a_failing_endpoint_does_not_hold_back_the_others_and_the_message_comes_back(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = make_hooks_app(SLACK_ENDPOINT, GENERIC_ENDPOINT)
    hooks.fail(GENERIC, 503, times=5, retry_after="0")
    with pytest.raises(DeliveryFailed, match=r"1 of 2 endpoint\(s\) failed: cmdb"):
        app.deliver("webhooks", envelope("Scheduled"))
    assert len(hooks.bodies(SLACK)) == 1 and hooks.bodies(GENERIC) == []
    line = _lines(caplog)[-1]
    assert (line["outcome"], line["error"], line["posted"], line["failed"]) == (
        "error",
        "DeliveryFailed",
        1,
        1,
    )
    # The redelivery: generic gets through after its last two faults; Slack shows it twice.
    app.deliver("webhooks", envelope("Scheduled"))
    assert len(hooks.bodies(SLACK)) == 2 and len(hooks.bodies(GENERIC)) == 1


@pytest.mark.timeout(20)
def test_a_permanent_refusal_is_logged_and_the_message_completes(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = make_hooks_app(
        SLACK_ENDPOINT, GENERIC_ENDPOINT, WEBHOOK_SLACK_URL=hooks.slack_url("revoked-token-9")
    )
    app.deliver("webhooks", envelope("Scheduled"))  # no exception: no retry changes a 404
    assert hooks.bodies(SLACK) == [] and len(hooks.bodies(GENERIC)) == 1
    assert len([r for r in hooks.requests if "revoked" in r.path]) == 1  # not retried
    refused = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage().split(";")[0] for r in refused] == [
        f"webhook ops-slack refused Scheduled of {EVENT_ID} with HTTP 404"
    ]
    line = _lines(caplog)[-1]
    assert (line["outcome"], line["rejected"], line["posted"]) == ("rejected", 1, 1)


@pytest.mark.timeout(20)
def test_an_invalid_payload_is_refused_not_retried(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks
) -> None:
    # A template may leave Slack nothing to show: Slack answers 400 no_text.
    app = make_hooks_app({**SLACK_ENDPOINT, "template": {"text": "${description}"}})
    app.deliver("webhooks", envelope("Scheduled", Description=""))
    assert hooks.bodies(SLACK) == [] and len(hooks.requests) == 1


@pytest.mark.timeout(20)
def test_redirects_are_not_followed(make_hooks_app: MakeHooks, hooks: FakeWebhooks) -> None:
    app = make_hooks_app(PD_ENDPOINT)
    hooks.fail(PAGERDUTY, 307, location=hooks.generic_url("elsewhere"))
    app.deliver("webhooks", envelope("Scheduled"))  # refused: the routing key stays here
    assert [r.path for r in hooks.requests] == ["/v2/enqueue"]


@pytest.mark.timeout(30)
def test_urls_and_routing_keys_never_reach_the_logs(
    make_hooks_app: MakeHooks, hooks: FakeWebhooks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = make_hooks_app(SLACK_ENDPOINT, PD_ENDPOINT, GENERIC_ENDPOINT)
    for kind in (SLACK, PAGERDUTY, GENERIC):
        hooks.fail(kind, 500, times=1, retry_after="0")
    app.deliver("webhooks", envelope("Scheduled"))
    hooks.fail(GENERIC, 503, times=3, retry_after="0")
    with pytest.raises(DeliveryFailed):
        app.deliver("webhooks", envelope("Started", EventStatus="Started"))
    assert len(hooks.accepted) == 5
    assert "urllib3.connectionpool" in {r.name for r in caplog.records}  # DEBUG lines were seen
    for secret in (SLACK_TOKEN, ROUTING_KEY, GENERIC_PATH):
        assert secret not in caplog.text


@pytest.mark.timeout(20)
def test_an_unreachable_endpoint_fails_without_naming_its_url(
    make_hooks_app: MakeHooks, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # A closed loopback port: connection refused on every attempt.
    app = make_hooks_app(GENERIC_ENDPOINT, WEBHOOK_GENERIC_URL=f"http://127.0.0.1:9/{GENERIC_PATH}")
    with pytest.raises(DeliveryFailed) as raised:
        app.deliver("webhooks", envelope("Scheduled"))
    assert "TransientHttpError" in str(raised.value)
    assert GENERIC_PATH not in caplog.text and GENERIC_PATH not in str(raised.value)
    assert not isinstance(raised.value, TransientHttpError)
