"""Guard: exactly these functions, with exactly these bindings (what the host will index)."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from emulators.functions_host.hostconfig import MAX_CONCURRENT_RECEIVERS, parse_timespan
from functions.shared import composition
from functions.shared.settings import SettingsError
from functions.shared.triggers import VERIFICATION_ATTRIBUTE
from tests.functions.support import App

ROOT = Path(__file__).resolve().parents[2]


def _sb(subscription: str) -> list[dict[str, object]]:
    return [
        {
            "direction": "IN",
            "type": "serviceBusTrigger",
            "name": "msg",
            "connection": "ServiceBusConnection",
            "topicName": "%TopicName%",
            "subscriptionName": subscription,
            "isSessionsEnabled": True,
        }
    ]


EXPECTED = {
    "teams": _sb("%TeamsSubscriptionName%"),
    "lb_pools": _sb("%LbPoolsSubscriptionName%"),
    "approval_gate": _sb("%ApprovalGateSubscriptionName%"),
    "approve": [
        {
            "direction": "IN",
            "type": "httpTrigger",
            "name": "req",
            "methods": ["GET", "POST"],
            "authLevel": "ANONYMOUS",
            "route": "approve",
        },
        {"direction": "OUT", "type": "http", "name": "$return"},
    ],
}


def _bindings(app: App) -> dict[str, list[dict[str, object]]]:
    return {
        name: [json.loads(b) for b in fn.get_raw_bindings()] for name, fn in app.functions.items()
    }


def test_registered_functions_and_bindings(app: App) -> None:
    assert _bindings(app) == EXPECTED


def test_the_custom_subscriber_registers_only_when_enabled(make_app: Callable[..., App]) -> None:
    app = make_app(CUSTOM_SUBSCRIBER_ENABLED="true", CustomSubscriptionName="vm-loss")
    assert _bindings(app) == {**EXPECTED, "custom_example": _sb("%CustomSubscriptionName%")}


def test_without_teams_the_app_runs_webhooks_and_says_why_teams_is_off(
    make_app: Callable[..., App], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sebridge.functions")
    app = make_app(
        TEAMS_WEBHOOK_URL="",
        TeamsSubscriptionName="",
        WebhooksSubscriptionName="webhooks",
        WEBHOOKS='[{"name": "oncall", "preset": "pagerduty", "routingKeySetting": "PD_KEY"}]',
        PD_KEY="0123456789abcdef0123456789abcdef",
    )
    bindings = _bindings(app)
    assert "teams" not in bindings
    assert set(bindings) == {"lb_pools", "approval_gate", "approve", "webhooks"}
    assert bindings["approve"] == EXPECTED["approve"]  # the Approve link keeps working
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("workflows:")]
    assert (
        "teams off (TEAMS_WEBHOOK_URL is not set: a Teams Workflows webhook URL turns it on)"
        in line
    )
    assert "webhooks on (endpoints: oncall (pagerduty))" in line
    assert "0123456789abcdef" not in line


def test_with_no_notifier_the_app_stops_naming_both(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    composition.use(None)
    monkeypatch.setenv("TEAMS_WEBHOOK_URL", "")
    with pytest.raises(SettingsError, match=r"no notifier: set TEAMS_WEBHOOK_URL .* WEBHOOKS"):
        importlib.reload(sys.modules["function_app"])


def test_every_service_bus_function_is_verified_at_the_trigger(
    make_app: Callable[..., App],
) -> None:
    """Every Service Bus function, built-in or the custom example, was declared with
    functions.shared.triggers.service_bus_function (decode, seal and scope check, then the
    function); only the ones that show everything (cards, audit webhooks) take unverified
    messages, and say so."""
    app = make_app(
        CUSTOM_SUBSCRIBER_ENABLED="true",
        CustomSubscriptionName="vm-loss",
        WebhooksSubscriptionName="webhooks",
    )
    marks = {
        name: getattr(fn.get_user_function(), VERIFICATION_ATTRIBUTE, None)
        for name, fn in app.functions.items()
        if any(b["type"] == "serviceBusTrigger" for b in _bindings(app)[name])
    }
    assert marks == {
        "teams": "unverified",
        "webhooks": "unverified",
        "lb_pools": "verified",
        "approval_gate": "verified",
        "custom_example": "verified",
    }


def test_a_bad_setting_stops_the_app_at_import(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    composition.use(None)  # settings are read again, from the environment
    monkeypatch.setenv("LB_FREEZE_THRESHOLD_SECONDS", "soon")
    with pytest.raises(SettingsError, match="LB_FREEZE_THRESHOLD_SECONDS: 'soon'"):
        importlib.reload(sys.modules["function_app"])


def test_host_json() -> None:
    host = json.loads((ROOT / "host.json").read_text())
    assert host["version"] == "2.0"
    assert host["extensionBundle"] == {
        "id": "Microsoft.Azure.Functions.ExtensionBundle",
        "version": "[4.*, 5.0.0)",
    }
    sb = host["extensions"]["serviceBus"]
    # an exception abandons (redelivery, then dead-letter at max delivery count); success completes
    assert sb["autoCompleteMessages"] is True
    assert sb["prefetchCount"] == 0
    # Every event is its own session: one instance starts at most maxConcurrentSessions events
    # at once per workflow, so a burst of 50 (benchmarks/burst.py) fits in one round; and the
    # local host opens that many receivers too (it caps them at MAX_CONCURRENT_RECEIVERS).
    assert 50 <= sb["maxConcurrentSessions"] <= MAX_CONCURRENT_RECEIVERS
    # An event's messages come minutes apart: a session held idle for long blocks a slot, and
    # the next events wait for it (benchmarks/e2e_latency.py, benchmarks/burst.py).
    idle = parse_timespan(sb["sessionIdleTimeout"], what="sessionIdleTimeout")
    assert timedelta(0) < idle <= timedelta(seconds=5)


def test_funcignore_keeps_tests_and_local_files_out() -> None:
    ignored = (ROOT / ".funcignore").read_text().split()
    for entry in ("tests/", "infra/", "emulators/", "local.settings.json", ".venv*"):
        assert entry in ignored
    assert "sebridge/" not in ignored and "functions/" not in ignored  # the app needs both


def test_the_drain_moments_trigger_registers_only_with_its_queue(
    make_app: Callable[..., App],
) -> None:
    app = make_app(DrainMomentsQueueName="drain-moments")
    assert _bindings(app) == {
        **EXPECTED,
        "drain_moment": [
            {
                "direction": "IN",
                "type": "serviceBusTrigger",
                "name": "msg",
                "connection": "ServiceBusConnection",
                "queueName": "%DrainMomentsQueueName%",
            }
        ],
    }
