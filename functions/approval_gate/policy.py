"""Approval policy: ordered rules, first match wins (pure).

``APPROVAL_POLICY`` is JSON::

    {"rules": [{"name": "...", "match": {...}, "action": "..."}, ...], "default": "manual"}

``match`` keys (all optional; every given key must match; string comparisons ignore case):
``eventType`` and ``eventSource`` (lists of names), ``durationSeconds`` (``{"min": a,
"max": b}``, inclusive; an event whose duration is unknown or -1 never matches a duration
range), ``vmName`` (fnmatch patterns; every affected VM must match one), ``resourceGroup``
(the observer's resource group, a list of names). Actions: ``approve`` (now),
``approve-when-prepared`` (once the affected VMs are out of all load balancer pools),
``manual`` (a human decides from the Teams card), ``never``. Without ``APPROVAL_POLICY`` the
default applies, built by :func:`default_policy` from lb-pools' freeze threshold.

``windows`` (optional, per rule with ``approve`` or ``approve-when-prepared``): weekly maintenance
windows in an IANA zone (``["Sun 02:00-05:00 Europe/Berlin"]``, functions.approval_gate.windows):
an event the rule matches is approved early only inside one; lb-pools drains it the lead before
the window opens (if it opens before NotBefore); outside every window it waits for NotBefore.

``leadSeconds`` (optional, top level): how long before NotBefore lb-pools drains each event type
(``{"Reboot": 300, "Preempt": "first-sight"}``; sebridge.timing: the rule the forwarder's
``--drain-lead`` follows too); the types not listed keep timing.DEFAULT_LEADS.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from functions.approval_gate.windows import Window, WindowError, parse_windows
from functions.shared.impact import DEFAULT_RULES, ImpactRules
from sebridge.contract.events import Observer
from sebridge.imds import ScheduledEvent
from sebridge.timing import DEFAULT_LEADS, Leads, TimingError, leads_from_json


class Action(StrEnum):
    APPROVE = "approve"
    APPROVE_WHEN_PREPARED = "approve-when-prepared"
    MANUAL = "manual"
    NEVER = "never"


class PolicyError(ValueError):
    """The policy text is not a valid rule list; the message says where."""


def default_policy(impact: ImpactRules = DEFAULT_RULES) -> dict[str, Any]:
    """The documented default: user-initiated events and short freezes go ahead at once;
    anything else waits until lb-pools has taken the VMs out of their pools.

    "Short" is whatever lb-pools (``impact``) does not drain: a Freeze under
    LB_FREEZE_THRESHOLD_SECONDS, so the rule's max is the threshold - 1 (8 at the default 9).
    Were the two set apart, the gate could approve at once a Freeze that lb-pools is still
    draining. When every Freeze drains, the rule is left out.
    """
    rules: list[dict[str, Any]] = [
        {"name": "user-initiated", "match": {"eventSource": ["User"]}, "action": "approve"}
    ]
    longest = impact.longest_undrained_freeze()
    if longest is not None:
        rules.append(
            {
                "name": "short-freeze",
                "match": {"eventType": ["Freeze"], "durationSeconds": {"min": 0, "max": longest}},
                "action": "approve",
            }
        )
    rules.append({"name": "prepare-first", "match": {}, "action": "approve-when-prepared"})
    return {"rules": rules, "default": "manual"}


MATCH_KEYS = ("eventType", "eventSource", "durationSeconds", "vmName", "resourceGroup")
MAX_RULES = 100


@dataclass(frozen=True)
class Rule:
    name: str
    action: Action
    event_types: frozenset[str] | None = None  # lower case
    event_sources: frozenset[str] | None = None
    min_duration: int | None = None
    max_duration: int | None = None
    vm_patterns: tuple[str, ...] | None = None
    resource_groups: frozenset[str] | None = None
    windows: tuple[Window, ...] = ()  # approve early only inside one (empty: any time)

    def matches(self, event: ScheduledEvent, observer: Observer) -> bool:
        if self.event_types is not None and event.event_type.lower() not in self.event_types:
            return False
        if self.event_sources is not None and (
            (event.event_source or "").lower() not in self.event_sources
        ):
            return False
        if self.min_duration is not None or self.max_duration is not None:
            duration = event.duration_in_seconds
            if duration is None or duration < 0:
                return False
            if self.min_duration is not None and duration < self.min_duration:
                return False
            if self.max_duration is not None and duration > self.max_duration:
                return False
        if self.vm_patterns is not None:
            vms = event.resources or (observer.vm_name,)
            if not all(
                any(fnmatch.fnmatchcase(vm.lower(), p) for p in self.vm_patterns) for vm in vms
            ):
                return False
        return self.resource_groups is None or (
            observer.resource_group.lower() in self.resource_groups
        )


@dataclass(frozen=True)
class Decision:
    action: Action
    rule: str  # the rule's name, or "default"
    windows: tuple[Window, ...] = ()  # the rule's maintenance windows (empty: any time)


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    default: Action = Action.MANUAL
    leads: Leads = DEFAULT_LEADS  # when lb-pools drains, per event type (sebridge.timing)

    def decide(self, event: ScheduledEvent, observer: Observer) -> Decision:
        for rule in self.rules:
            if rule.matches(event, observer):
                return Decision(rule.action, rule.name, rule.windows)
        return Decision(self.default, "default")


def _action(value: object, where: str) -> Action:
    try:
        return Action(str(value))
    except ValueError:
        allowed = ", ".join(a.value for a in Action)
        raise PolicyError(f"{where}: action {value!r} is not one of {allowed}") from None


def _names(value: object, where: str) -> frozenset[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not value or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{where}: expected a non-empty list of strings")
    return frozenset(v.strip().lower() for v in value)


def _bound(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PolicyError(f"{where}: expected a non-negative integer")
    return value


def _rule(obj: object, index: int) -> Rule:
    where = f"rules[{index}]"
    if not isinstance(obj, Mapping):
        raise PolicyError(f"{where}: expected an object")
    unknown = set(obj) - {"name", "match", "action", "windows"}
    if unknown:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}")
    name = obj.get("name", f"rule-{index}")
    if not isinstance(name, str) or not name.strip():
        raise PolicyError(f"{where}: name must be a non-empty string")
    where = f"rules[{index}] ({name})"
    if "action" not in obj:
        raise PolicyError(f"{where}: action is missing")
    action = _action(obj["action"], where)
    windows: tuple[Window, ...] = ()
    if "windows" in obj:
        if action not in (Action.APPROVE, Action.APPROVE_WHEN_PREPARED):
            raise PolicyError(f"{where}: windows apply only to approve and approve-when-prepared")
        try:
            windows = parse_windows(obj["windows"], f"{where}: windows")
        except WindowError as exc:
            raise PolicyError(str(exc)) from None
    match = obj.get("match", {})
    if not isinstance(match, Mapping):
        raise PolicyError(f"{where}: match must be an object")
    unknown = set(match) - set(MATCH_KEYS)
    if unknown:
        raise PolicyError(f"{where}: unknown match keys {sorted(unknown)} (known: {MATCH_KEYS})")
    min_d = max_d = None
    if "durationSeconds" in match:
        duration = match["durationSeconds"]
        if not isinstance(duration, Mapping) or not duration or set(duration) - {"min", "max"}:
            raise PolicyError(f"{where}: durationSeconds must be {{'min': n, 'max': n}}")
        min_d = _bound(duration.get("min"), f"{where}: durationSeconds.min")
        max_d = _bound(duration.get("max"), f"{where}: durationSeconds.max")
        if min_d is not None and max_d is not None and min_d > max_d:
            raise PolicyError(f"{where}: durationSeconds.min is greater than max")
    return Rule(
        name=name.strip(),
        action=action,
        event_types=_names(match["eventType"], f"{where}: eventType")
        if "eventType" in match
        else None,
        event_sources=_names(match["eventSource"], f"{where}: eventSource")
        if "eventSource" in match
        else None,
        min_duration=min_d,
        max_duration=max_d,
        vm_patterns=tuple(sorted(_names(match["vmName"], f"{where}: vmName")))
        if "vmName" in match
        else None,
        resource_groups=_names(match["resourceGroup"], f"{where}: resourceGroup")
        if "resourceGroup" in match
        else None,
        windows=windows,
    )


def parse_policy(text: str | Mapping[str, Any]) -> Policy:
    """JSON text (or the parsed object) to a :class:`Policy`; :class:`PolicyError` if invalid."""
    if isinstance(text, Mapping):
        obj: Any = text
    else:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"not JSON: {exc}") from exc
    if not isinstance(obj, Mapping):
        raise PolicyError("expected a JSON object with 'rules'")
    unknown = set(obj) - {"rules", "default", "leadSeconds"}
    if unknown:
        raise PolicyError(f"unknown keys {sorted(unknown)}")
    rules = obj.get("rules")
    if not isinstance(rules, list):
        raise PolicyError("'rules' must be a list")
    if len(rules) > MAX_RULES:
        raise PolicyError(f"more than {MAX_RULES} rules")
    default = _action(obj.get("default", Action.MANUAL.value), "default")
    try:
        leads = leads_from_json(obj.get("leadSeconds"))
    except TimingError as exc:
        raise PolicyError(str(exc)) from None
    return Policy(
        rules=tuple(_rule(r, i) for i, r in enumerate(rules)), default=default, leads=leads
    )
