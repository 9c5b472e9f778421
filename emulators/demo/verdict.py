"""What a demo scenario exists to show, the policy that lets it happen, and the verdict (pure).

Each scenario names the transitions it exists to show: its ``expect`` list (what a continuous
observer derives from its timeline, checked against the timeline when the simulator loads it).
A scenario that shows an ``Updated`` or a ``Cancelled`` runs with a policy that approves nothing
(``manual``): approved early, its event would start before NotBefore moved or before Azure
cancelled it, and the demo would prove nothing. The others run with the default policy and must
also be approved through IMDS.

The verdict fails when a named transition is missing, an event has not ended, an approval that
should have happened did not, or a VM is not where it should be; and it says what happened:
each event's transitions in order, how it was approved, and where each VM ended up (after a
Preempt or a Terminate the VM is gone: it stays out of its pools, and the verdict says so).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The events after which the VM does not come back: nothing to restore.
GONE_FOR_GOOD = frozenset({"Terminate", "Preempt"})
# Transitions that happen only while the event waits for its NotBefore.
NEED_TIME = frozenset({"Updated", "Cancelled"})
MANUAL_POLICY = json.dumps({"rules": [], "default": "manual"})


@dataclass(frozen=True)
class Plan:
    shows: tuple[tuple[str, str], ...]  # (transition, lower-case EventId), in expected order
    approve: bool  # the default policy; False: "manual", so the timeline plays as scripted
    held: bool = False  # the run must also show a Held (the capacity-hold scenario)

    @property
    def policy(self) -> str | None:
        """APPROVAL_POLICY for the run (None: the app's default)."""
        return None if self.approve else MANUAL_POLICY


def plan_for(scenario: Mapping[str, Any], *, held: bool = False) -> Plan:
    shows = tuple(
        (str(item["transition"]), str(item["eventId"]).lower())
        for item in scenario.get("expect", [])
    )
    return Plan(shows, approve=not any(t in NEED_TIME for t, _ in shows), held=held)


@dataclass
class Verdict:
    missing: list[str] = field(default_factory=list)  # empty: the demo proved its point
    story: list[str] = field(default_factory=list)  # what happened, one line per event or VM


def judge(
    plan: Plan,
    events: Mapping[str, Mapping[str, Any]],
    seen: Sequence[Mapping[str, Any]],
    approved: set[str],
    pools_now: Callable[[str], list[str]],
    initial: Mapping[str, list[str]],
) -> Verdict:
    """``events`` by lower-case EventId (the scenario's IMDS fields), ``seen`` the transitions
    on the topic in order (``{"transition", "event"}``), ``approved`` the EventIds IMDS took a
    StartRequests for, ``pools_now(vm)`` a VM's pools now, ``initial`` its pools before."""
    verdict = Verdict()
    by_event: dict[str, list[str]] = {}
    last_resources: dict[str, tuple[str, ...]] = {}  # as the topic last told them
    for item in list(seen):
        by_event.setdefault(item["event"].key, []).append(str(item["transition"]))
        last_resources[item["event"].key] = tuple(item["event"].resources)
    for transition, event_id in plan.shows:
        if transition not in by_event.get(event_id, []):
            verdict.missing.append(
                f"the scenario exists to show {transition} of event {event_id[:8]}, and the "
                "topic never carried it"
            )
    if plan.held:
        if "Held" in {t for ts in by_event.values() for t in ts}:
            verdict.story.append("  A drain was held until capacity allowed it.")
        else:
            verdict.missing.append("no drain was held (the capacity guard did not act)")
    gone: set[str] = set()
    for key, fields in events.items():
        transitions = by_event.get(key, [])
        kind = str(fields.get("EventType", "?"))
        vms = ",".join(last_resources.get(key, fields.get("Resources", []))) or "-"
        ended = {"Completed", "Cancelled"} & set(transitions)
        if not ended:
            verdict.missing.append(
                f"event {key[:8]} has not ended (seen: {', '.join(transitions) or 'nothing'})"
            )
        first_scheduled = transitions[:1] == ["Scheduled"]
        if plan.approve and first_scheduled and key not in approved:
            verdict.missing.append(f"event {key[:8]} was never approved through IMDS")
        if not plan.approve and key in approved:
            verdict.missing.append(
                f"event {key[:8]} was approved, but this scenario's policy approves nothing"
            )
        if key in approved:
            how = "approved early (IMDS started it on request, before NotBefore)"
        elif first_scheduled:
            how = "not approved (policy: a human decides), ran on Azure's schedule"
        else:
            how = "first seen Started (nothing to approve)"
        verdict.story.append(
            f"  {kind} {key[:8]} on {vms}: {' -> '.join(transitions) or 'nothing'}; {how}"
        )
        if kind in GONE_FOR_GOOD and "Completed" in transitions:
            gone.update(fields.get("Resources", []))
    for vm, before in initial.items():
        now = sorted(pools_now(vm))
        if vm in gone:
            verdict.story.append(f"  {vm}: gone after its event, left out of its pools")
        elif now != sorted(before):
            verdict.missing.append(f"{vm} is not back in its pools")
        elif before:
            verdict.story.append(f"  {vm}: back in {', '.join(_short(p) for p in before)}")
    return verdict


def _short(pool_id: str) -> str:
    """``lb/pool`` of a backend pool id."""
    parts = pool_id.rstrip("/").split("/")
    return "/".join(parts[-3::2]) if len(parts) >= 3 else pool_id


def approved_event_ids(posts: list[dict[str, Any]]) -> set[str]:
    """The EventIds IMDS took a StartRequests for (answered 200)."""
    approved: set[str] = set()
    for post in list(posts):
        if post.get("status") != 200:
            continue
        try:
            approved.add(json.loads(post["body"])["StartRequests"][0]["EventId"].lower())
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
    return approved
