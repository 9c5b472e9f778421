"""The demo checks what it claims: every scenario names the transitions it exists to show, and
its verdict fails when one of them is missing, whatever else happened.

For each scenario the demo offers, the verdict is first given a run that showed everything
(each named transition on the topic, approvals where the plan approves, every VM back), which
must pass; then the same run with one named transition removed, which must fail and name it.
"""

from __future__ import annotations

from typing import Any

import pytest

from emulators.demo.verdict import GONE_FOR_GOOD, MANUAL_POLICY, judge, plan_for
from emulators.demo.world import demo_world, load_packaged, rehome, scenario_names
from sebridge.imds import Document, ScheduledEvent

POOL = (
    "/subscriptions/s/resourceGroups/rg-web/providers/Microsoft.Network/loadBalancers/lb-web"
    "/backendAddressPools/pool-a"
)


def as_event(fields: dict[str, Any]) -> ScheduledEvent:
    raw = {k: v for k, v in fields.items() if k[:1].isupper()}
    raw.setdefault("EventStatus", "Scheduled")
    return Document.from_imds({"DocumentIncarnation": 1, "Events": [raw]}).events[0]


def a_full_run(name: str) -> tuple[Any, dict[str, Any], list[dict[str, Any]], set[str]]:
    world, _ = rehome(load_packaged(name))
    plan = plan_for(world, held=demo_world(name).expect_held)
    events = {e["EventId"].lower(): e for e in world["events"]}
    seen = [{"transition": t, "event": as_event(events[key])} for t, key in plan.shows]
    if plan.held:
        first = next(iter(events))
        seen.append({"transition": "Held", "event": as_event(events[first])})
    approved = {key for t, key in plan.shows if t == "Scheduled"} if plan.approve else set()
    return plan, events, seen, approved


def pools(world_vms: dict[str, list[str]], gone: set[str]) -> Any:
    return lambda vm: [] if vm in gone else world_vms[vm]


@pytest.mark.parametrize("name", scenario_names())
def test_every_scenario_passes_when_it_shows_everything_and_fails_without_each(name: str) -> None:
    plan, events, seen, approved = a_full_run(name)
    assert plan.shows, f"{name} names no transition to show"
    vms = {vm: [POOL] for e in events.values() for vm in e.get("Resources", [])}
    gone = {
        vm
        for e in events.values()
        if e["EventType"] in GONE_FOR_GOOD
        for vm in e.get("Resources", [])
    }
    ok = judge(plan, events, seen, approved, pools(vms, gone), vms)
    assert ok.missing == [], ok.missing
    for index, (transition, key) in enumerate(plan.shows):
        without = seen[:index] + seen[index + 1 :]
        if any(
            t == transition and s["event"].key == key
            for t, s in zip([s["transition"] for s in without], without, strict=True)
        ):
            continue  # the same transition twice for one event: removing one copy proves nothing
        verdict = judge(plan, events, without, approved, pools(vms, gone), vms)
        assert any(f"{transition} of event {key[:8]}" in m for m in verdict.missing), (
            name,
            transition,
            verdict.missing,
        )


@pytest.mark.parametrize("name", ["canceled-maintenance", "multiple-events"])
def test_scenarios_that_show_a_cancellation_or_an_update_approve_nothing(name: str) -> None:
    world, _ = rehome(load_packaged(name))
    plan = plan_for(world)
    assert not plan.approve and plan.policy == MANUAL_POLICY
    assert {"Cancelled"} <= {t for t, _ in plan.shows}


def test_a_gone_vm_is_reported_gone_not_as_back_in_its_pools() -> None:
    plan, events, seen, approved = a_full_run("preempt")
    (vm,) = next(iter(events.values()))["Resources"]
    verdict = judge(plan, events, seen, approved, lambda _: [], {vm: [POOL]})
    assert verdict.missing == []
    assert any(f"{vm}: gone after its event" in line for line in verdict.story)
    assert not any("back in" in line for line in verdict.story)


def test_an_approval_a_manual_scenario_did_not_ask_for_fails() -> None:
    plan, events, seen, _ = a_full_run("canceled-maintenance")
    verdict = judge(plan, events, seen, set(events), lambda _: [POOL], {})
    assert any("policy approves nothing" in m for m in verdict.missing)
