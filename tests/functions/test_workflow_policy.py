"""The approval policy: parsing and first-match decisions (pure, table-driven)."""

from __future__ import annotations

import json
import re

import pytest

from functions.approval_gate.policy import (
    Action,
    PolicyError,
    default_policy,
    parse_policy,
)
from functions.shared.impact import DEFAULT_IMPACTFUL, ImpactRules
from sebridge.contract.events import Observer
from tests.fixtures import golden
from tests.functions.support import event
from tests.support import docs

DEFAULT_POLICY = default_policy()  # at the default settings, as documented
DEFAULT = parse_policy(DEFAULT_POLICY)


@pytest.mark.parametrize(
    ("fields", "action", "rule"),
    [
        ({"EventSource": "User", "EventType": "Reboot"}, Action.APPROVE, "user-initiated"),
        ({"EventSource": "user", "EventType": "Redeploy"}, Action.APPROVE, "user-initiated"),
        ({"EventType": "Freeze", "DurationInSeconds": 5}, Action.APPROVE, "short-freeze"),
        ({"EventType": "Freeze", "DurationInSeconds": 8}, Action.APPROVE, "short-freeze"),
        (
            {"EventType": "Freeze", "DurationInSeconds": 9},
            Action.APPROVE_WHEN_PREPARED,
            "prepare-first",
        ),
        (
            {"EventType": "Freeze", "DurationInSeconds": -1},
            Action.APPROVE_WHEN_PREPARED,
            "prepare-first",
        ),
        ({"EventType": "Reboot"}, Action.APPROVE_WHEN_PREPARED, "prepare-first"),
        ({"EventType": "Terminate"}, Action.APPROVE_WHEN_PREPARED, "prepare-first"),
    ],
)
def test_default_policy(fields: dict[str, object], action: Action, rule: str) -> None:
    decision = DEFAULT.decide(event(**fields), golden.OBSERVER)
    assert (decision.action, decision.rule) == (action, rule)


CUSTOM = parse_policy(
    {
        "rules": [
            {"name": "no-db", "match": {"vmName": ["db-*"]}, "action": "never"},
            {"name": "batch-rg", "match": {"resourceGroup": ["RG-Batch"]}, "action": "approve"},
            {
                "name": "long",
                "match": {"eventType": "Freeze", "durationSeconds": {"min": 30}},
                "action": "manual",
            },
            {"name": "platform", "match": {"eventSource": ["Platform"]}, "action": "approve"},
        ],
        "default": "never",
    }
)
WEB = golden.OBSERVER
BATCH = Observer(vm_name="b-1", resource_group="rg-batch", subscription_id="s")


@pytest.mark.parametrize(
    ("fields", "observer", "action", "rule"),
    [
        ({"Resources": ["db-1", "db-2"]}, WEB, Action.NEVER, "no-db"),
        # every affected VM must match a pattern: a mixed event is not "db only"
        ({"Resources": ["db-1", "web-2"]}, WEB, Action.APPROVE, "platform"),
        ({"Resources": [], "EventSource": "User"}, BATCH, Action.APPROVE, "batch-rg"),
        (
            {"EventType": "Freeze", "DurationInSeconds": 30, "EventSource": "Platform"},
            WEB,
            Action.MANUAL,
            "long",
        ),
        (
            {"EventType": "Freeze", "DurationInSeconds": 29, "EventSource": "Platform"},
            WEB,
            Action.APPROVE,
            "platform",
        ),
        ({"EventSource": "User"}, WEB, Action.NEVER, "default"),
    ],
)
def test_first_match_wins(
    fields: dict[str, object], observer: Observer, action: Action, rule: str
) -> None:
    decision = CUSTOM.decide(event(**fields), observer)
    assert (decision.action, decision.rule) == (action, rule)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"rules": {}}', "'rules' must be a list"),
        ('{"rules": [{"match": {}}]}', "action is missing"),
        ('{"rules": [{"action": "yes"}]}', "is not one of"),
        (
            '{"rules": [{"action": "approve", "match": {"eventTyp": ["Reboot"]}}]}',
            "unknown match keys",
        ),
        (
            '{"rules": [{"action": "approve", "match": {"durationSeconds": {"min": 9, "max": 1}}}]}',  # noqa: E501
            "greater than max",
        ),
        (
            '{"rules": [{"action": "approve", "match": {"durationSeconds": {"min": -1}}}]}',
            "non-negative",
        ),
        ('{"rules": [{"action": "approve", "match": {"eventType": []}}]}', "non-empty list"),
        ('{"rules": [], "default": "maybe"}', "default"),
        ('{"rules": [], "extra": 1}', "unknown keys"),
    ],
)
def test_invalid_policies_say_why(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(text)


def test_the_default_is_valid_json_with_a_manual_fallback() -> None:
    assert json.loads(json.dumps(DEFAULT_POLICY))["default"] == "manual"
    assert [r.name for r in DEFAULT.rules] == ["user-initiated", "short-freeze", "prepare-first"]


def test_the_default_at_threshold_9_is_the_documented_one() -> None:
    assert default_policy(ImpactRules(frozenset(DEFAULT_IMPACTFUL.split(",")), 9)) == DEFAULT_POLICY
    assert DEFAULT_POLICY["rules"][1] == {
        "name": "short-freeze",
        "match": {"eventType": ["Freeze"], "durationSeconds": {"min": 0, "max": 8}},
        "action": "approve",
    }
    section = docs.page("configuration").split("## Approval policy", 1)[1]
    documented = re.search(r"```json\n(.*?)```", section, re.S)
    assert documented is not None and json.loads(documented.group(1)) == DEFAULT_POLICY


@pytest.mark.parametrize("threshold", [1, 2, 5, 9, 30])
def test_the_default_approves_at_once_exactly_the_freezes_lb_pools_does_not_drain(
    threshold: int,
) -> None:
    impact = ImpactRules(frozenset(DEFAULT_IMPACTFUL.split(",")), threshold)
    policy = parse_policy(default_policy(impact))
    for duration in [-1, *range(threshold + 3)]:
        freeze = event(EventType="Freeze", DurationInSeconds=duration)
        at_once = policy.decide(freeze, golden.OBSERVER).action is Action.APPROVE
        assert at_once is not impact.is_impactful(freeze), (threshold, duration)


@pytest.mark.parametrize(
    ("threshold", "always"), [(0, False), (9, True)], ids=["threshold-0", "freeze-impactful"]
)
def test_no_short_freeze_rule_when_every_freeze_drains(threshold: int, always: bool) -> None:
    impactful = {*DEFAULT_IMPACTFUL.split(","), *(["Freeze"] if always else [])}
    policy = parse_policy(default_policy(ImpactRules(frozenset(impactful), threshold)))
    assert [r.name for r in policy.rules] == ["user-initiated", "prepare-first"]
