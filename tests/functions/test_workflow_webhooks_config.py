"""webhooks settings: a bad endpoint stops the app at start, naming it and never its secret."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest

from functions.shared import composition
from functions.shared.settings import SettingsError, load_settings
from functions.webhooks.presets import PAGERDUTY_ENQUEUE_URL
from sebridge.contract.events import Transition
from tests.functions.support import App
from tests.functions.test_workflow_settings import GOOD

SLACK_URL = "https://hooks.slack.com/services/T000/B000/Xsecretpath0123456789"
ROUTING_KEY = "0123456789abcdef0123456789ABCDEF"
SECRETS = {
    "WEBHOOK_SLACK_URL": SLACK_URL,
    "WEBHOOK_PD_ROUTING_KEY": ROUTING_KEY,
    "WEBHOOK_GENERIC_URL": "https://cmdb.example/hooks/sebridge?code=secretcode0123",
}
SLACK = {"name": "ops-slack", "preset": "slack", "urlSetting": "WEBHOOK_SLACK_URL"}
PD = {"name": "oncall", "preset": "pagerduty", "routingKeySetting": "WEBHOOK_PD_ROUTING_KEY"}
GENERIC = {"name": "cmdb", "preset": "generic", "urlSetting": "WEBHOOK_GENERIC_URL"}


def env(*endpoints: Any, **extra: str) -> dict[str, str]:
    return {
        **GOOD,
        **SECRETS,
        "WebhooksSubscriptionName": "webhooks",
        "WEBHOOKS": json.dumps(list(endpoints)),
        **extra,
    }


def test_endpoints_with_their_defaults() -> None:
    settings = load_settings(env(SLACK, PD, GENERIC))
    slack, pd, generic = settings.webhooks
    assert settings.webhooks_subscription == "webhooks"
    assert (slack.name, slack.preset, slack.url) == ("ops-slack", "slack", SLACK_URL)
    assert Transition.HEARTBEAT not in slack.transitions and len(slack.transitions) == 8
    assert slack.event_types is None and slack.impactful_only is False
    assert (pd.url, pd.routing_key) == (PAGERDUTY_ENQUEUE_URL, ROUTING_KEY)
    assert {t.value for t in pd.transitions} == {
        "Scheduled",
        "Updated",
        "Started",
        "Completed",
        "Cancelled",
    }
    assert generic.url.endswith("?code=secretcode0123")
    assert settings.describe()["webhooks"] == [
        "ops-slack (slack)",
        "oncall (pagerduty)",
        "cmdb (generic)",
    ]


def test_no_webhooks_by_default() -> None:
    settings = load_settings(GOOD)
    assert settings.webhooks == () and settings.webhooks_subscription == ""
    assert settings.describe()["webhooks"] == "off"
    assert (
        load_settings({**GOOD, "WebhooksSubscriptionName": "webhooks", "WEBHOOKS": "[]"}).webhooks
        == ()
    )


def test_filters_are_read() -> None:
    endpoint = {**SLACK, "transitions": ["Started"], "eventTypes": ["reboot", "Freeze"]}
    (slack,) = load_settings(env({**endpoint, "impactfulOnly": True})).webhooks
    assert slack.transitions == {Transition.STARTED}
    assert slack.event_types == {"reboot", "freeze"} and slack.impactful_only is True
    assert slack.accepts(Transition.STARTED, "Reboot", impactful=True)
    assert not slack.accepts(Transition.STARTED, "Reboot", impactful=False)
    assert not slack.accepts(Transition.STARTED, "Terminate", impactful=True)
    assert not slack.accepts(Transition.SCHEDULED, "Reboot", impactful=True)


BAD: list[tuple[dict[str, str], str]] = [
    ({"WEBHOOKS": "[{"}, "WEBHOOKS: not JSON"),
    ({"WEBHOOKS": '{"name": "x"}'}, "WEBHOOKS: must be a JSON list of endpoints"),
    ({"WEBHOOKS": json.dumps([SLACK] * 21)}, "WEBHOOKS: at most 20 endpoints"),
    ({"WEBHOOKS": "[5]"}, "WEBHOOKS[0]: not a JSON object"),
    (
        env({**SLACK, "preset": "teams"}),
        "endpoint 'ops-slack': preset must be one of slack, pagerduty, generic",
    ),
    (env({**SLACK, "name": "Ops Slack"}), "WEBHOOKS[0]: name must be 1-40 lower-case"),
    (env(SLACK, SLACK), "endpoint names used twice: ['ops-slack']"),
    (
        env({**SLACK, "transition": ["Started"]}),
        "endpoint 'ops-slack': unknown keys ['transition']",
    ),
    (
        env({**SLACK, "transitions": ["Rebooted"]}),
        "transitions ['Rebooted'] are not for the slack preset",
    ),
    (
        env({**SLACK, "transitions": ["Heartbeat"]}),
        "transitions ['Heartbeat'] are not for the slack",
    ),
    (
        env({**PD, "transitions": ["Approved"]}),
        "transitions ['Approved'] are not for the pagerduty",
    ),
    (env({**SLACK, "transitions": []}), "transitions must be a non-empty list of strings"),
    (env({**SLACK, "eventTypes": ["Rebooot"]}), "unknown eventTypes ['Rebooot'] (known: Freeze"),
    (env({**SLACK, "impactfulOnly": "yes"}), "impactfulOnly must be true or false"),
    (
        env({**SLACK, "template": {"text": "${eventID} for ${vm}"}}),
        "endpoint 'ops-slack': template references fields the contract does not have: "
        "['eventID', 'vm'] (known: messageId, transition, eventId,",
    ),
    (
        env({**GENERIC, "template": {"a": [{"b": "costs $5"}]}}),
        "endpoint 'cmdb': template invalid placeholder in 'costs $5' (write ${field}, and $$",
    ),
    (env({**GENERIC, "template": {"a": "${"}}), "template invalid placeholder in '${'"),
    (
        env({**PD, "template": {"summary": "x"}}),
        "template must be a string (the alert summary) for the pagerduty preset",
    ),
    (env({**SLACK, "template": "text"}), "template must be a JSON object for the slack preset"),
    (
        env({k: v for k, v in SLACK.items() if k != "urlSetting"}),
        "'ops-slack': urlSetting is required",
    ),
    (env({**SLACK, "urlSetting": "WEBHOOK-SLACK"}), "urlSetting must name an app setting"),
    (
        env({**SLACK, "urlSetting": "WEBHOOK_NOPE"}),
        "urlSetting names WEBHOOK_NOPE, which is not set",
    ),
    (
        env(SLACK, WEBHOOK_SLACK_URL="http://hooks.slack.com/services/T/B/Xsecret"),
        "WEBHOOK_SLACK_URL must use https",
    ),
    (
        env(SLACK, WEBHOOK_SLACK_URL="@Microsoft.KeyVault(SecretUri=https://kv/secrets/x)"),
        "WEBHOOK_SLACK_URL does not hold an http(s) URL (an unresolved Key Vault reference?)",
    ),
    (env(SLACK, WEBHOOK_SLACK_URL="https://user:pw@hooks.example/x"), "must not carry credentials"),
    (
        env({k: v for k, v in PD.items() if k != "routingKeySetting"}),
        "'oncall': routingKeySetting is required",
    ),
    (
        env(PD, WEBHOOK_PD_ROUTING_KEY="short-key"),
        "WEBHOOK_PD_ROUTING_KEY does not hold a PagerDuty routing key",
    ),
    (
        env({**SLACK, "routingKeySetting": "WEBHOOK_PD_ROUTING_KEY"}),
        "routingKeySetting is only for the pagerduty",
    ),
    (
        {**env(SLACK), "WebhooksSubscriptionName": ""},
        "WebhooksSubscriptionName: required when WEBHOOKS lists endpoints",
    ),
]


@pytest.mark.parametrize(("settings", "named"), BAD, ids=[m[:40] for _, m in BAD])
def test_a_bad_endpoint_is_named(settings: dict[str, str], named: str) -> None:
    config = {**GOOD, "WebhooksSubscriptionName": "webhooks", **settings}
    with pytest.raises(SettingsError) as raised:
        load_settings(config)
    assert named in str(raised.value)
    for secret in (ROUTING_KEY, "Xsecret", "secretcode", "short-key", ":pw@"):
        assert secret not in str(raised.value)


def test_every_problem_is_reported_at_once() -> None:
    config = env({**SLACK, "preset": "teams"}, {**PD, "template": 5}, {**GENERIC, "name": "X"})
    with pytest.raises(SettingsError) as raised:
        load_settings({**config, "TopicName": ""})
    text = str(raised.value)
    for named in (
        "TopicName: required",
        "'ops-slack': preset",
        "'oncall': template",
        "WEBHOOKS[2]: name",
    ):
        assert named in text


def test_secrets_stay_out_of_repr_and_describe() -> None:
    settings = load_settings(env(SLACK, PD, GENERIC))
    for text in (repr(settings), str(settings.describe()), repr(settings.webhooks)):
        assert SLACK_URL not in text and ROUTING_KEY not in text and "secretcode" not in text


def test_a_bad_template_stops_the_app_at_import(
    make_app: Callable[..., App], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_app()
    composition.use(None)  # settings are read again, from the environment
    for name, value in env({**SLACK, "template": {"text": "${notAField}"}}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=r"'ops-slack': template references .*'notAField'"):
        importlib.reload(sys.modules["function_app"])
