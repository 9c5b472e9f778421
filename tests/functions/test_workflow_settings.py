"""Settings: defaults, and a clear error naming each bad setting (pure)."""

from __future__ import annotations

import re

import pytest

from functions.shared.settings import (
    APP_SETTING_NAMES,
    SettingsError,
    load_settings,
    workflows,
    workflows_line,
)

GOOD = {
    "ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net",
    "TopicName": "scheduled-events",
    "TeamsSubscriptionName": "teams",
    "LbPoolsSubscriptionName": "lb-pools",
    "ApprovalGateSubscriptionName": "approval-gate",
    "ApprovalsQueueName": "approvals",
    "TEAMS_WEBHOOK_URL": "https://prod.westeurope.logic.azure.com/workflows/x?sig=secret",
    "APPROVAL_SIGNING_KEY": "s" * 40,
    "WEBSITE_HOSTNAME": "func-sebridge.azurewebsites.net",
    "LB_POOL_STATE_URL": "https://stsebridge.blob.core.windows.net/sebridge-pools",
}


def test_defaults() -> None:
    settings = load_settings(GOOD)
    assert settings.approval_base_url == "https://func-sebridge.azurewebsites.net"
    assert settings.impactful_event_types == {"Reboot", "Redeploy", "Preempt", "Terminate"}
    assert settings.freeze_threshold_seconds == 9
    assert settings.arm_endpoint == "https://management.azure.com"
    assert settings.acknowledge_fallback_enabled is False
    assert settings.heartbeat_stale_seconds == 900
    assert settings.custom_subscriber_enabled is False
    assert [r.name for r in settings.policy.rules] == [
        "user-initiated",
        "short-freeze",
        "prepare-first",
    ]


def test_secrets_stay_out_of_repr_and_describe() -> None:
    settings = load_settings(GOOD)
    for text in (repr(settings), str(settings.describe())):
        assert "secret" not in text and "s" * 40 not in text


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"TopicName": ""}, "TopicName: required"),
        ({"TEAMS_WEBHOOK_URL": "http://teams.example/x"}, "TEAMS_WEBHOOK_URL: must use https"),
        ({"TEAMS_WEBHOOK_URL": "not a url"}, "TEAMS_WEBHOOK_URL: not an http(s) URL"),
        ({"APPROVAL_SIGNING_KEY": "short"}, "APPROVAL_SIGNING_KEY: shorter than 32"),
        ({"APPROVAL_POLICY": '{"rules": [{"action": "sometimes"}]}'}, "APPROVAL_POLICY: rules[0]"),
        ({"LB_IMPACTFUL_EVENT_TYPES": "Reboot,Rebooot"}, "LB_IMPACTFUL_EVENT_TYPES: unknown"),
        ({"LB_FREEZE_THRESHOLD_SECONDS": "nine"}, "LB_FREEZE_THRESHOLD_SECONDS: 'nine'"),
        ({"HEARTBEAT_STALE_SECONDS": "5"}, "HEARTBEAT_STALE_SECONDS: 5 is outside"),
        (
            {"ACKNOWLEDGE_FALLBACK_ENABLED": "maybe"},
            "ACKNOWLEDGE_FALLBACK_ENABLED: not a boolean: 'maybe'",
        ),
        ({"ACKNOWLEDGE_FALLBACK_ENABLED": "true"}, "HEARTBEAT_STORE_URL: required"),
        ({"CUSTOM_SUBSCRIBER_ENABLED": "true"}, "CustomSubscriptionName: required"),
        ({"ARM_ENDPOINT": "http://management.example"}, "ARM_ENDPOINT: must use https"),
        (
            {"ServiceBusConnection__fullyQualifiedNamespace": ""},
            "ServiceBusConnection__fullyQualifiedNamespace: required",
        ),
        ({"WEBSITE_HOSTNAME": ""}, "APPROVAL_BASE_URL: required"),
    ],
)
def test_a_bad_setting_is_named(change: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({**GOOD, **change})
    assert named in str(info.value)
    assert "secret" not in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({**GOOD, "TopicName": "", "APPROVAL_SIGNING_KEY": "x"})
    assert "TopicName" in str(info.value) and "APPROVAL_SIGNING_KEY" in str(info.value)


def test_loopback_http_and_a_local_connection_string_are_accepted() -> None:
    settings = load_settings(
        {
            **GOOD,
            "ServiceBusConnection__fullyQualifiedNamespace": "",
            "ServiceBusConnection": "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=v",
            "TEAMS_WEBHOOK_URL": "http://127.0.0.1:9999/hook",
            "ARM_ENDPOINT": "http://127.0.0.1:9998/",
            "ACKNOWLEDGE_FALLBACK_ENABLED": "true",
            "AzureWebJobsStorage__accountName": "stsebridge",
        }
    )
    assert settings.arm_endpoint == "http://127.0.0.1:9998"
    assert settings.heartbeat_store_url == (
        "https://stsebridge.blob.core.windows.net/sebridge-heartbeats"
    )
    assert "SharedAccessKey" not in repr(settings)


def test_the_setting_names_are_listed_once() -> None:
    assert len(set(APP_SETTING_NAMES)) == len(APP_SETTING_NAMES)
    assert "TEAMS_WEBHOOK_URL" in APP_SETTING_NAMES and "HEARTBEAT_STORE_URL" in APP_SETTING_NAMES


def short_freeze_max(env: dict[str, str]) -> int | None:
    rules = {r.name: r for r in load_settings({**GOOD, **env}).policy.rules}
    return rules["short-freeze"].max_duration if "short-freeze" in rules else None


@pytest.mark.parametrize(
    ("env", "maximum"),
    [
        ({}, 8),
        ({"LB_FREEZE_THRESHOLD_SECONDS": "9"}, 8),
        ({"LB_FREEZE_THRESHOLD_SECONDS": "5"}, 4),
        ({"LB_FREEZE_THRESHOLD_SECONDS": "60"}, 59),
        ({"LB_FREEZE_THRESHOLD_SECONDS": "0"}, None),
        ({"LB_IMPACTFUL_EVENT_TYPES": "Reboot,Freeze"}, None),
        ({"APPROVAL_POLICY": ""}, 8),  # empty is not set
    ],
)
def test_the_default_policy_follows_the_freeze_threshold(
    env: dict[str, str], maximum: int | None
) -> None:
    assert short_freeze_max(env) == maximum


def test_a_policy_that_is_set_is_used_as_written() -> None:
    own = (
        '{"rules": [{"name": "short-freeze", "match": {"eventType": ["Freeze"], '
        '"durationSeconds": {"max": 20}}, "action": "approve"}]}'
    )
    assert short_freeze_max({"APPROVAL_POLICY": own, "LB_FREEZE_THRESHOLD_SECONDS": "5"}) == 20


def test_the_capacity_guard_settings() -> None:
    settings = load_settings(GOOD)
    assert settings.min_healthy == 1
    assert settings.pool_state_url == "https://stsebridge.blob.core.windows.net/sebridge-pools"
    without = {k: v for k, v in GOOD.items() if k != "LB_POOL_STATE_URL"}
    derived = load_settings({**without, "AzureWebJobsStorage__accountName": "sthost"})
    assert derived.pool_state_url == "https://sthost.blob.core.windows.net/sebridge-pools"
    off = load_settings({**without, "LB_MIN_HEALTHY": "0"})
    assert off.min_healthy == 0 and off.pool_state_url == ""
    assert load_settings(
        {**GOOD, "LB_MANAGED_RESOURCE_GROUPS": " rg-a, ,rg-b "}
    ).managed_resource_groups == (
        "rg-a",
        "rg-b",
    )
    described = load_settings(GOOD).describe()
    assert described["minHealthy"] == 1 and described["managedResourceGroups"] == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"LB_MIN_HEALTHY": "-1"}, "LB_MIN_HEALTHY: -1 is outside 0..1000"),
        ({"LB_MIN_HEALTHY": "two"}, "LB_MIN_HEALTHY: 'two' is not an integer"),
        ({"LB_POOL_STATE_URL": ""}, "LB_POOL_STATE_URL: required while LB_MIN_HEALTHY"),
        ({"LB_POOL_STATE_URL": "http://storage.example/x"}, "LB_POOL_STATE_URL: must use https"),
        # An allow-list entry no resource group can have matches nothing: every message would
        # be refused as a security event (lead's review of issue 23, item c).
        (
            {"LB_MANAGED_RESOURCE_GROUPS": "rg-web, rg/../other"},
            "LB_MANAGED_RESOURCE_GROUPS: 'rg/../other' is not a resource group name",
        ),
        (
            {"LB_MANAGED_RESOURCE_GROUPS": "rg-web,rg-ends-with-dot."},
            "LB_MANAGED_RESOURCE_GROUPS: 'rg-ends-with-dot.' is not a resource group name",
        ),
        (
            {"AGENTLESS_RESOURCE_GROUPS": "rg web"},
            "AGENTLESS_RESOURCE_GROUPS: 'rg web' is not a resource group name",
        ),
    ],
)
def test_bad_capacity_guard_settings_are_named(change: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(named)):
        load_settings({**GOOD, **change})


# --- Teams is optional when another notifier is configured --------------------------------

SLACK_ONLY = {
    **{k: v for k, v in GOOD.items() if k not in {"TEAMS_WEBHOOK_URL", "TeamsSubscriptionName"}},
    "WebhooksSubscriptionName": "webhooks",
    "WEBHOOKS": '[{"name": "ops-slack", "preset": "slack", "urlSetting": "WEBHOOK_SLACK_URL"}]',
    "WEBHOOK_SLACK_URL": "https://hooks.slack.com/services/T0/B0/secret-path",
}


def test_a_slack_only_setup_needs_no_teams_webhook() -> None:
    settings = load_settings(SLACK_ONLY)
    assert settings.teams_enabled is False
    assert [e.name for e in settings.webhooks] == ["ops-slack"]
    assert "teams" not in settings.describe()["subscriptions"]


def test_with_no_notifier_at_all_the_app_names_both_ways_to_add_one() -> None:
    no_notifier = {k: v for k, v in GOOD.items() if k != "TEAMS_WEBHOOK_URL"}
    with pytest.raises(SettingsError) as info:
        load_settings(no_notifier)
    message = str(info.value)
    assert "no notifier: set TEAMS_WEBHOOK_URL" in message
    assert "or list an endpoint in WEBHOOKS" in message


def test_teams_needs_its_subscription_name_only_when_it_is_on() -> None:
    without = {k: v for k, v in GOOD.items() if k != "TeamsSubscriptionName"}
    with pytest.raises(SettingsError, match="TeamsSubscriptionName: required"):
        load_settings(without)
    assert load_settings(SLACK_ONLY).teams_subscription == ""


def test_the_start_up_line_says_which_workflows_are_on_and_why_any_is_off() -> None:
    line = workflows_line(load_settings(SLACK_ONLY))
    assert line.startswith("workflows: teams off (TEAMS_WEBHOOK_URL is not set: ")
    assert "lb_pools on" in line and "approval_gate on (with the approve link)" in line
    assert "webhooks on (endpoints: ops-slack (slack))" in line
    assert "custom_example off (CUSTOM_SUBSCRIBER_ENABLED is not true)" in line
    assert "eventgrid_ingest off (EVENTGRID_INGEST_ENABLED is not true)" in line
    assert "drain_moments off (DrainMomentsQueueName is not set: " in line
    assert "history off (HistorySubscriptionName is not set: " in line
    everything = load_settings(
        {
            **GOOD,
            "WebhooksSubscriptionName": "webhooks",
            "CUSTOM_SUBSCRIBER_ENABLED": "true",
            "CustomSubscriptionName": "vm-loss",
            "EVENTGRID_INGEST_ENABLED": "true",
            "EVENTGRID_STATE_URL": "https://st.blob.core.windows.net/sebridge-eventgrid-state",
            "DrainMomentsQueueName": "drain-moments",
            "HistorySubscriptionName": "history",
            "HISTORY_TABLE_URL": "https://st.table.core.windows.net/sebridgehistory",
        }
    )
    assert all(w.on for w in workflows(everything))
    assert " off" not in workflows_line(everything)
    # No secret in it: the webhook URLs and the Teams URL stay out.
    for settings in (everything, load_settings(SLACK_ONLY)):
        assert "secret" not in workflows_line(settings)


def test_drain_moments_need_the_pool_state_and_a_lead_must_be_readable() -> None:
    env = {k: v for k, v in GOOD.items() if k != "LB_POOL_STATE_URL"}
    with pytest.raises(SettingsError, match="required while DrainMomentsQueueName is set"):
        load_settings({**env, "LB_MIN_HEALTHY": "0", "DrainMomentsQueueName": "drain-moments"})
    policy = '{"rules": [], "leadSeconds": {"Reboot": "soon"}}'
    with pytest.raises(SettingsError, match=r"APPROVAL_POLICY: leadSeconds Reboot: 'soon'"):
        load_settings({**GOOD, "APPROVAL_POLICY": policy})
    policy = '{"rules": [], "leadSeconds": {"Reboot": 600, "Freeze": "first-sight"}}'
    leads = load_settings({**GOOD, "APPROVAL_POLICY": policy}).policy.leads
    assert leads.lead("Reboot") == 600 and leads.lead("Freeze") is None
    assert leads.lead("Redeploy") == 300  # not listed: the default


def test_the_history_settings() -> None:
    off = load_settings(GOOD)
    assert off.history_subscription == "" and off.history_table_url == ""
    assert off.history_retention_days == 90 and off.calendar_window_days == 30
    on = load_settings(
        {
            **GOOD,
            "HistorySubscriptionName": "history",
            "AzureWebJobsStorage__accountName": "stsebridge",
            "HISTORY_RETENTION_DAYS": "30",
            "CALENDAR_WINDOW_DAYS": "7",
        }
    )
    assert on.history_table_url == "https://stsebridge.table.core.windows.net/sebridgehistory"
    assert (on.history_retention_days, on.calendar_window_days) == (30, 7)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"HistorySubscriptionName": "history"}, "HISTORY_TABLE_URL: required"),
        (
            {"HistorySubscriptionName": "history", "HISTORY_TABLE_URL": "http://10.0.0.1/t"},
            "HISTORY_TABLE_URL: must use https",
        ),
        (
            {"HistorySubscriptionName": "history", "HISTORY_TABLE_URL": "https://a.example/"},
            "HISTORY_TABLE_URL: names no table",
        ),
        ({"HISTORY_RETENTION_DAYS": "0"}, "HISTORY_RETENTION_DAYS: 0 is outside"),
        ({"CALENDAR_WINDOW_DAYS": "many"}, "CALENDAR_WINDOW_DAYS: 'many' is not an integer"),
    ],
)
def test_bad_history_settings_are_named(change: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(named)):
        load_settings({**GOOD, **change})
