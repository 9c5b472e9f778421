"""Provisioning a real namespace from Config.json (provisioning.py), checked without Azure:
the pure mapping to ServiceBusAdministrationClient calls, Azure's limits, and ``provision``
against a recording fake of the admin client."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.servicebus.management import CorrelationRuleFilter, SqlRuleFilter, TrueRuleFilter

from emulators.servicebus.config import ConfigError
from tests.contract.provisioning import (
    AdminCall,
    ProvisioningError,
    admin_calls,
    azure_limit_violations,
    describe_filter,
    provision,
)

CONFIG = Path(__file__).with_name("Config.json")


def _document(queues: list[Any] | None = None, topics: list[Any] | None = None) -> dict[str, Any]:
    namespace = {"Name": "sbemulatorns", "Queues": queues or [], "Topics": topics or []}
    return {"UserConfig": {"Namespaces": [namespace], "Logging": {"Type": "Console"}}}


SMALL = _document(
    queues=[
        {
            "Name": "approvals",
            "Properties": {
                "DeadLetteringOnMessageExpiration": True,
                "DefaultMessageTimeToLive": "PT1H",
                "DuplicateDetectionHistoryTimeWindow": "PT20S",
                "ForwardDeadLetteredMessagesTo": "",
                "ForwardTo": "",
                "LockDuration": "PT5S",
                "MaxDeliveryCount": 3,
                "RequiresDuplicateDetection": True,
                "RequiresSession": True,
            },
        }
    ],
    topics=[
        {
            "Name": "events",
            "Properties": {"DefaultMessageTimeToLive": "P1D", "RequiresDuplicateDetection": False},
            "Subscriptions": [
                {
                    "Name": "teams",
                    "Properties": {"LockDuration": "PT1M", "MaxDeliveryCount": 10},
                    "Rules": [
                        {
                            "Name": "lifecycle",
                            "Properties": {
                                "FilterType": "Sql",
                                "SqlFilter": {"SqlExpression": "durationInSeconds <= 30"},
                            },
                        },
                        {
                            "Name": "approved",
                            "Properties": {
                                "FilterType": "Correlation",
                                "CorrelationFilter": {
                                    "CorrelationId": "c-1",
                                    "Label": "Approved",
                                    "Properties": {"vmName": "vm-7"},
                                },
                            },
                        },
                    ],
                },
                {"Name": "audit", "Properties": {"RequiresSession": True}},
            ],
        }
    ],
)


def _plain(call: AdminCall) -> tuple[str, tuple[str, ...], dict[str, Any]]:
    kwargs = {k: describe_filter(v) if k == "filter" else v for k, v in call.kwargs.items()}
    return (call.method, call.args, kwargs)


def test_admin_calls_map_every_property_and_rule() -> None:
    assert [_plain(c) for c in admin_calls(SMALL)] == [
        (
            "create_queue",
            ("approvals",),
            {
                "dead_lettering_on_message_expiration": True,
                "default_message_time_to_live": dt.timedelta(hours=1),
                "duplicate_detection_history_time_window": dt.timedelta(seconds=20),
                "lock_duration": dt.timedelta(seconds=5),
                "max_delivery_count": 3,
                "requires_duplicate_detection": True,
                "requires_session": True,
            },
        ),
        (
            "create_topic",
            ("events",),
            {
                "default_message_time_to_live": dt.timedelta(days=1),
                "requires_duplicate_detection": False,
            },
        ),
        (
            "create_subscription",
            ("events", "teams"),
            {"lock_duration": dt.timedelta(minutes=1), "max_delivery_count": 10},
        ),
        (
            "create_rule",
            ("events", "teams", "lifecycle"),
            {"filter": describe_filter(SqlRuleFilter("durationInSeconds <= 30"))},
        ),
        (
            "create_rule",
            ("events", "teams", "approved"),
            {
                "filter": describe_filter(
                    CorrelationRuleFilter(
                        correlation_id="c-1", label="Approved", properties={"vmName": "vm-7"}
                    )
                )
            },
        ),
        ("create_subscription", ("events", "audit"), {"requires_session": True}),
    ]
    rule = admin_calls(SMALL)[3].kwargs["filter"]
    assert isinstance(rule, SqlRuleFilter) and rule.sql_expression == "durationInSeconds <= 30"


def test_admin_calls_cover_the_contract_config() -> None:
    document = json.loads(CONFIG.read_text())
    calls = {c.entity: c for c in admin_calls(document)}
    ns = document["UserConfig"]["Namespaces"][0]
    wanted = {q["Name"] for q in ns["Queues"]} | {t["Name"] for t in ns["Topics"]}
    for topic in ns["Topics"]:
        for sub in topic["Subscriptions"]:
            wanted.add(f"{topic['Name']}/{sub['Name']}")
            wanted |= {f"{topic['Name']}/{sub['Name']}/{r['Name']}" for r in sub["Rules"]}
    assert set(calls) == wanted
    assert calls["contract-short-lock"].kwargs["lock_duration"] == dt.timedelta(seconds=5)
    assert calls["contract-one-delivery"].kwargs["max_delivery_count"] == 1
    assert calls["contract-ttl-drop"].kwargs["dead_lettering_on_message_expiration"] is False
    assert "forward_to" not in calls["contract-queue"].kwargs  # "" means not forwarded
    correlation = calls["contract-topic/correlation/by-correlation"].kwargs["filter"]
    assert isinstance(correlation, CorrelationRuleFilter)
    assert (correlation.correlation_id, correlation.label) == ("corr-1", "Approved")
    assert correlation.properties == {"vmName": "vm-7"}


def test_admin_calls_refuse_what_the_emulator_refuses() -> None:
    bad = _document(queues=[{"Name": "q", "Properties": {"LockDuration": "soon"}}])
    with pytest.raises(ConfigError, match="LockDuration"):
        admin_calls(bad)


def test_contract_config_is_within_azure_limits() -> None:
    assert azure_limit_violations(json.loads(CONFIG.read_text())) == []


def test_azure_limit_violations_are_named() -> None:
    document = _document(
        queues=[{"Name": "q", "Properties": {"LockDuration": "PT2S", "MaxDeliveryCount": 0}}],
        topics=[
            {
                "Name": "t",
                "Properties": {"DuplicateDetectionHistoryTimeWindow": "PT10S"},
                "Subscriptions": [{"Name": "s" * 51, "Properties": {"LockDuration": "PT6M"}}],
            }
        ],
    )
    problems = azure_limit_violations(document)
    assert len(problems) == 5, problems
    assert any("queue 'q': LockDuration PT2S must be at least 5 s" in p for p in problems)
    assert any("MaxDeliveryCount must be at least 1" in p for p in problems)
    assert any("DuplicateDetectionHistoryTimeWindow PT10S" in p for p in problems)
    assert any("LockDuration PT6M must be at least 5 s and at most 300 s" in p for p in problems)
    assert any("name longer than 50" in p for p in problems)


class FakeAdmin:
    """Records ServiceBusAdministrationClient calls; keeps what they create."""

    def __init__(self, error: Exception | None = None) -> None:
        self.entities: dict[str, Any] = {}
        self.rules: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.error = error

    def _get(self, *names: str) -> Any:
        if self.error is not None:
            raise self.error
        try:
            return self.entities["/".join(names)]
        except KeyError:
            raise ResourceNotFoundError("not found") from None

    def get_queue(self, queue_name: str) -> Any:
        return self._get(queue_name)

    def get_topic(self, topic_name: str) -> Any:
        return self._get(topic_name)

    def get_subscription(self, topic_name: str, subscription_name: str) -> Any:
        return self._get(topic_name, subscription_name)

    def list_rules(self, topic_name: str, subscription_name: str) -> list[Any]:
        rules = self.rules[f"{topic_name}/{subscription_name}"]
        return [SimpleNamespace(name=name, filter=f) for name, f in rules.items()]

    def _create(self, method: str, *names: str, **kwargs: Any) -> None:
        self.calls.append((method, "/".join(names)))
        self.entities["/".join(names)] = SimpleNamespace(**kwargs)

    def create_queue(self, queue_name: str, **kwargs: Any) -> None:
        self._create("create_queue", queue_name, **kwargs)

    def create_topic(self, topic_name: str, **kwargs: Any) -> None:
        self._create("create_topic", topic_name, **kwargs)

    def create_subscription(self, topic_name: str, subscription_name: str, **kwargs: Any) -> None:
        self._create("create_subscription", topic_name, subscription_name, **kwargs)
        self.rules[f"{topic_name}/{subscription_name}"] = {"$Default": TrueRuleFilter()}

    def create_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> None:
        self.calls.append(("create_rule", f"{topic_name}/{subscription_name}/{rule_name}"))
        self.rules[f"{topic_name}/{subscription_name}"][rule_name] = kwargs["filter"]

    def delete_rule(self, topic_name: str, subscription_name: str, rule_name: str) -> None:
        self.calls.append(("delete_rule", f"{topic_name}/{subscription_name}/{rule_name}"))
        del self.rules[f"{topic_name}/{subscription_name}"][rule_name]


def test_provision_creates_what_is_missing_then_finds_everything_in_place() -> None:
    admin = FakeAdmin()
    admin.entities["approvals"] = SimpleNamespace(**admin_calls(SMALL)[0].kwargs)  # exists
    created = provision(admin, admin_calls(SMALL))
    assert created == [
        "events",
        "events/teams",
        "events/audit",
        "events/teams/lifecycle",
        "events/teams/approved",
    ]
    assert ("delete_rule", "events/teams/$Default") in admin.calls  # replaced by its rules
    assert admin.rules["events/audit"].keys() == {"$Default"}  # no rules: keeps TrueFilter
    admin.calls.clear()
    assert provision(admin, admin_calls(SMALL)) == []
    assert admin.calls == []


def test_provision_reports_existing_entities_that_differ_and_changes_nothing() -> None:
    admin = FakeAdmin()
    provision(admin, admin_calls(SMALL))
    admin.entities["approvals"].lock_duration = dt.timedelta(seconds=2)
    admin.rules["events/teams"]["extra"] = SqlRuleFilter("1=0")
    admin.calls.clear()
    with pytest.raises(ProvisioningError) as caught:
        provision(admin, admin_calls(SMALL), "ns.servicebus.windows.net")
    message = str(caught.value)
    assert "approvals: lock_duration is datetime.timedelta(seconds=2)" in message
    assert "events/teams: rules are" in message and "'extra'" in message
    assert "ns.servicebus.windows.net" in message and "delete them" in message
    assert admin.calls == []


@pytest.mark.parametrize(
    "error",
    [ClientAuthenticationError("Unauthorized"), HttpResponseError("Forbidden")],
    ids=["401", "403"],
)
def test_provision_says_when_the_credential_lacks_manage_rights(error: Exception) -> None:
    error.status_code = 401 if isinstance(error, ClientAuthenticationError) else 403  # type: ignore[attr-defined]
    with pytest.raises(ProvisioningError, match="lacks Manage rights") as caught:
        provision(FakeAdmin(error=error), admin_calls(SMALL), "ns.servicebus.windows.net")
    assert "SEBRIDGE_CONTRACT_PROVISION=0" in str(caught.value)


def test_provision_lets_other_errors_through() -> None:
    error = HttpResponseError("Service Unavailable")
    error.status_code = 503
    with pytest.raises(HttpResponseError):
        provision(FakeAdmin(error=error), admin_calls(SMALL))
