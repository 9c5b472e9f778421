"""The demo world: VMs web-1, web-2... in resource group rg-web behind lb-web, the demo's own
scenarios, and the app settings every local run of function_app.py starts from."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = "redeploy"
SUBSCRIPTION = "00000000-0000-4000-8000-0000000000de"
GROUP = "rg-web"
MIN_HEALTHY = 1  # LB_MIN_HEALTHY in the demo (the app's default)
HISTORY_TABLE = "sebridgehistory"


# -- scenarios of the demo's own (not IMDS simulator fixtures) ----------------------------
CAPACITY_HOLD = "capacity-hold"
LONG_NOTICE = "long-notice"
LONG_NOTICE_LEAD = 20  # seconds before the window opens that lb-pools drains


@dataclass(frozen=True)
class DemoWorld:
    spares: int = 1  # pool members no event names (keep the guard from holding)
    expect_held: bool = False  # the run must show a Held transition
    # More app settings, made when the run starts (a window in wall-clock time), with a line
    # for the timeline; None: none.
    settings: Callable[[datetime], tuple[dict[str, str], str]] | None = None


def window_settings(now: datetime) -> tuple[dict[str, str], str]:
    """long-notice: a policy whose only window opens at the next whole minute at least 40 s
    after ``now`` (30 minutes long), Reboot's lead, and the drain-moments queue."""
    opens = (now + timedelta(seconds=100)).replace(second=0, microsecond=0)
    closes = opens + timedelta(minutes=30)
    window = f"{opens:%a} {opens:%H:%M}-{closes:%H:%M} UTC"
    policy = {
        "rules": [
            {
                "name": "maintenance-window",
                "match": {},
                "action": "approve-when-prepared",
                "windows": [window],
            }
        ],
        "leadSeconds": {"Reboot": LONG_NOTICE_LEAD},
    }
    settings = {"APPROVAL_POLICY": json.dumps(policy), "DrainMomentsQueueName": "drain-moments"}
    return settings, (
        f"policy: approve only in the window {window}; lb-pools drains {LONG_NOTICE_LEAD} s "
        f"before it opens ({opens - timedelta(seconds=LONG_NOTICE_LEAD):%H:%M:%S} UTC)"
    )


def _long_notice() -> dict[str, Any]:
    """One Reboot with ten minutes' notice (Azure gives 15 for a Reboot, up to 7 days for
    degraded hardware: the same story, shorter)."""
    event_id = "c3c3c3c3-0003-4000-8000-00000000c0de"
    return {
        "name": LONG_NOTICE,
        "description": "A Reboot with ten minutes' notice and a maintenance window a minute or "
        "so away: in the pool until the window's start minus the lead, then drained, approved "
        "in the window, rebooted and restored.",
        "provenance": "Composed for the demo of drain moments and maintenance windows.",
        "events": [
            {
                "EventId": event_id,
                "EventType": "Reboot",
                "ResourceType": "VirtualMachine",
                "Resources": ["vm-a"],
                "Description": "Virtual machine is going to be restarted (host maintenance).",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
                "timeline": [
                    {"at": 0, "status": "Scheduled", "notBeforeIn": 600},
                    {"at": 600, "status": "Started"},
                    {"at": 616, "status": "gone"},
                ],
            }
        ],
        "expect": [
            {"transition": "Scheduled", "eventId": event_id},
            {"transition": "Started", "eventId": event_id},
            {"transition": "Completed", "eventId": event_id},
        ],
    }


def _capacity_hold() -> dict[str, Any]:
    """Two Reboots on the two members of one pool, the second while the first is drained."""

    def reboot(event_id: str, vm: str, at: int, not_before_in: int) -> dict[str, Any]:
        return {
            "EventId": event_id,
            "EventType": "Reboot",
            "ResourceType": "VirtualMachine",
            "Resources": [vm],
            "Description": "Virtual machine is going to be restarted (host maintenance).",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
            "timeline": [
                {"at": at, "status": "Scheduled", "notBeforeIn": not_before_in},
                {"at": at + not_before_in, "status": "Started"},
                {"at": at + not_before_in + 16, "status": "gone"},
            ],
        }

    first, second = "a1a1a1a1-0001-4000-8000-00000000c0de", "b2b2b2b2-0002-4000-8000-00000000c0de"
    return {
        "name": CAPACITY_HOLD,
        "description": "Two overlapping Reboots on a pool of two: the second drain is held "
        "until the first completes (LB_MIN_HEALTHY=1).",
        "provenance": "Composed for the demo of the capacity guard: one Reboot per member of "
        "a two-member backend pool, the second scheduled while the first is drained.",
        "events": [reboot(first, "vm-a", 0, 60), reboot(second, "vm-b", 6, 84)],
        "expect": [
            {"transition": "Scheduled", "eventId": first},
            {"transition": "Scheduled", "eventId": second},
            {"transition": "Started", "eventId": first},
            {"transition": "Completed", "eventId": first},
            {"transition": "Started", "eventId": second},
            {"transition": "Completed", "eventId": second},
        ],
    }


DEMO_SCENARIOS: dict[str, tuple[dict[str, Any], DemoWorld]] = {
    CAPACITY_HOLD: (_capacity_hold(), DemoWorld(spares=0, expect_held=True)),
    LONG_NOTICE: (_long_notice(), DemoWorld(settings=window_settings)),
}


# -- the demo world ---------------------------------------------------------------------
def scenario_names() -> list[str]:
    from emulators.imds.testing import scenario_names as names

    return sorted([*names(), *DEMO_SCENARIOS])


def load_packaged(name: str) -> dict[str, Any]:
    if name in DEMO_SCENARIOS:
        copied: dict[str, Any] = json.loads(json.dumps(DEMO_SCENARIOS[name][0]))
        return copied
    text = resources.files("emulators.imds").joinpath("scenarios", f"{name}.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def demo_world(name: str) -> DemoWorld:
    return DEMO_SCENARIOS[name][1] if name in DEMO_SCENARIOS else DemoWorld()


def rehome(scenario: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The scenario with its VM and Resources mapped onto web-1, web-2, ... in rg-web."""
    names: dict[str, str] = {}

    def step_resources(event: dict[str, Any]) -> list[str]:
        return [
            r
            for step in event.get("timeline", [])
            for r in (step.get("set") or {}).get("Resources") or []
        ]

    for event in scenario["events"]:
        for resource in [*event.get("Resources", []), *step_resources(event)]:
            names.setdefault(resource.lower(), f"web-{len(names) + 1}")
    if not names:
        names["vm"] = "web-1"
    world = dict(scenario)
    world["vm"] = {
        "name": "web-1",
        "subscriptionId": SUBSCRIPTION,
        "resourceGroupName": GROUP,
        "vmScaleSetName": "",
        "location": "westeurope",
        "zone": "1",
    }

    def renamed(resources: list[str]) -> list[str]:
        return [names[r.lower()] for r in resources]

    def step(s: dict[str, Any]) -> dict[str, Any]:
        fields = s.get("set")
        if isinstance(fields, dict) and isinstance(fields.get("Resources"), list):
            return {**s, "set": {**fields, "Resources": renamed(fields["Resources"])}}
        return s

    world["events"] = [
        {
            **e,
            "Resources": renamed(e.get("Resources", [])),
            "timeline": [step(s) for s in e.get("timeline", [])],
        }
        for e in scenario["events"]
    ]
    return world, sorted(set(names.values()))


def app_settings_for_stand_ins(
    connection_string: str,
    *,
    teams_url: str,
    arm_url: str,
    approval_base_url: str,
    identity: Mapping[str, str],
) -> dict[str, str]:
    """The app settings every local run of function_app.py starts from: the project's entities
    (infra/servicebus-emulator/Config.json) on ``connection_string``, a fresh signing key, the
    Teams and ARM stand-ins, where the Approve links point, and the identity fake's settings."""
    return {
        "ServiceBusConnection": connection_string,
        "TopicName": "scheduled-events",
        "TeamsSubscriptionName": "teams",
        "LbPoolsSubscriptionName": "lb-pools",
        "ApprovalGateSubscriptionName": "approval-gate",
        "ApprovalsQueueName": "approvals",
        "TEAMS_WEBHOOK_URL": teams_url,
        "APPROVAL_SIGNING_KEY": secrets.token_urlsafe(32),
        "ARM_ENDPOINT": arm_url,
        "APPROVAL_BASE_URL": approval_base_url,
        **identity,
    }
