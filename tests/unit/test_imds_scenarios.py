"""Unit tests for the IMDS simulator's pure parts: scenario loader, timeline model, faults."""

from __future__ import annotations

import copy
import email.utils
import json
from pathlib import Path
from typing import Any

import pytest

from emulators.imds.faults import FaultError, decide, parse_cli_rule, parse_rule, parse_rules
from emulators.imds.instance import instance_document, vm_settings
from emulators.imds.scenario import (
    MIN_STEP_GAP,
    ScenarioError,
    load_scenario,
    parse_scenario,
    scenario_names,
)
from emulators.imds.simulation import ControlError, Simulation, event_ids_of

EID = "661abb8d-8f6c-46e9-9f65-447173353f51"
EID2 = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
WALL = 1_800_000_000.0  # a fixed wall clock: the core never reads one


def minimal() -> dict[str, Any]:
    return {
        "name": "t",
        "description": "test scenario",
        "provenance": "unit test",
        "events": [
            {
                "EventId": EID,
                "EventType": "Freeze",
                "Resources": ["vm1"],
                "Description": "Host server is undergoing maintenance.",
                "EventSource": "Platform",
                "DurationInSeconds": 9,
                "timeline": [
                    {"at": 0, "status": "Scheduled", "notBeforeIn": 15},
                    {"at": 15, "status": "Started"},
                    {"at": 25, "status": "gone"},
                ],
            }
        ],
        "expect": [
            {"transition": "Scheduled", "eventId": EID},
            {"transition": "Started", "eventId": EID},
            {"transition": "Completed", "eventId": EID},
        ],
    }


def with_change(path: str, value: Any) -> dict[str, Any]:
    """minimal() with one value replaced; path like 'events.0.timeline.1.at'; None deletes."""
    obj = minimal()
    parts = path.split(".")
    target: Any = obj
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target[part]
    last = parts[-1]
    key: Any = int(last) if isinstance(target, list) else last
    if value is None:
        del target[key]
    else:
        target[key] = value
    return obj


# ---------------------------------------------------------------------------------------------
# Packaged scenarios


REQUIRED = {
    "live-migration",
    "user-reboot",
    "host-agent-maintenance",
    "redeploy",
    "user-redeploy",
    "canceled-maintenance",
    "preempt",
    "terminate",
    "multiple-events",
    "hardware-failure",
    "incarnation-reset",
}


def test_every_required_scenario_ships() -> None:
    assert set(scenario_names()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_packaged_scenario_is_valid_and_short(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name
    assert scenario.expect, "a scenario without expected transitions tests nothing"
    # At --speed 5 every scenario must finish within about ten seconds.
    assert scenario.duration / 5 <= 10
    for event in scenario.events:
        assert event.fields["ResourceType"] == "VirtualMachine"


def replay(name: str, speed: float = 5.0, tick: float = 1.0) -> list[tuple[str, str]]:
    """Run the runtime core (not the loader's checker) and diff what a 1 s poller sees."""
    scenario = load_scenario(name)
    sim = Simulation(scenario, speed=speed)
    seen: dict[str, dict[str, Any]] = {}
    out: list[tuple[str, str]] = []
    t = 0.0
    while t <= scenario.duration + 2 * tick:
        sim.advance_to(t, WALL + t / speed)
        now = {e["EventId"].lower(): e for e in sim.document()["Events"]}
        for key, event in now.items():
            old = seen.get(key)
            if old is None:
                out.append((event["EventStatus"], key))
            elif old["EventStatus"] == "Scheduled" and event["EventStatus"] == "Started":
                out.append(("Started", key))
            elif event["EventStatus"] == "Scheduled" and any(
                old.get(f) != event.get(f)
                for f in ("NotBefore", "Resources", "DurationInSeconds", "Description")
            ):
                out.append(("Updated", key))
        for key, old in seen.items():
            if key not in now:
                out.append(("Completed" if old["EventStatus"] == "Started" else "Cancelled", key))
        seen = now
        t += tick
    return out


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_runtime_replay_matches_expect(name: str) -> None:
    expected = [(e["transition"], e["eventId"]) for e in _expect_json(name)]
    assert replay(name) == expected


def _expect_json(name: str) -> list[dict[str, str]]:
    path = Path(__file__).parents[2] / "emulators" / "imds" / "scenarios" / f"{name}.json"
    result: list[dict[str, str]] = json.loads(path.read_text())["expect"]
    return result


def test_multiple_events_has_mixed_case_ids_and_an_update() -> None:
    scenario = load_scenario("multiple-events")
    ids = [e.event_id for e in scenario.events]
    assert any(i == i.upper() for i in ids) and any(i != i.upper() and i != i.lower() for i in ids)
    assert {e.transition for e in scenario.expect} >= {"Updated", "Cancelled", "Completed"}


def test_hardware_failure_omits_optional_fields() -> None:
    sim = Simulation(load_scenario("hardware-failure"))
    sim.advance_to(0, WALL)
    (event,) = sim.document()["Events"]
    assert event["EventStatus"] == "Started" and event["NotBefore"] == ""
    assert not {"Description", "EventSource", "DurationInSeconds"} & set(event)


def test_incarnation_reset_goes_back_without_changing_events() -> None:
    sim = Simulation(load_scenario("incarnation-reset"))
    sim.advance_to(0, WALL)
    before = sim.document()
    sim.advance_to(MIN_STEP_GAP, WALL + MIN_STEP_GAP)
    after = sim.document()
    assert before["DocumentIncarnation"] > 1
    assert after["DocumentIncarnation"] == 1
    assert after["Events"] == before["Events"]


# ---------------------------------------------------------------------------------------------
# Loader validation: each bad file fails with a message naming the problem


BAD_SCENARIOS = [
    ("not an object", [], "must be a JSON object"),
    ("missing expect", with_change("expect", None), "missing 'expect'"),
    ("unknown key", {**minimal(), "evnts": []}, "unknown key"),
    ("bad guid", with_change("events.0.EventId", "not-a-guid"), "not a GUID"),
    ("bad type", with_change("events.0.EventType", "Explode"), "EventType"),
    ("bad source", with_change("events.0.EventSource", "Robot"), "EventSource"),
    ("bad duration", with_change("events.0.DurationInSeconds", "9"), "integer"),
    ("resources not list", with_change("events.0.Resources", "vm1"), "list of non-empty"),
    ("missing resources", with_change("events.0.Resources", None), "missing Resources"),
    ("status typo", with_change("events.0.timeline.1.status", "started"), "status"),
    ("first step gone", with_change("events.0.timeline.0.status", "gone"), "first step"),
    (
        "scheduled without notBefore",
        with_change("events.0.timeline.0.notBeforeIn", None),
        "needs notBeforeIn",
    ),
    ("steps out of order", with_change("events.0.timeline.1.at", 30), "must increase"),
    ("steps too close", with_change("events.0.timeline.1.at", 3), "less than 6"),
    ("negative time", with_change("events.0.timeline.0.at", -1), ">= 0"),
    (
        "back to scheduled",
        with_change("events.0.timeline.2", {"at": 25, "status": "Scheduled", "notBeforeIn": 5}),
        "back from Started",
    ),
    (
        "notBeforeIn while started",
        with_change("events.0.timeline.2", {"at": 25, "notBeforeIn": 5}),
        "only applies while Scheduled",
    ),
    (
        "set EventStatus",
        with_change("events.0.timeline.1", {"at": 15, "set": {"EventStatus": "Started"}}),
        "cannot be set",
    ),
    ("empty step", with_change("events.0.timeline.1", {"at": 15}), "changes nothing"),
    (
        "wrong expect",
        with_change("expect.2", {"transition": "Cancelled", "eventId": EID}),
        "does not match the timeline",
    ),
    (
        "upper-case expect id",
        with_change("expect.0", {"transition": "Scheduled", "eventId": EID.upper()}),
        "lower case",
    ),
    (
        "unknown transition",
        with_change("expect.0", {"transition": "Approved", "eventId": EID}),
        "transition",
    ),
    ("multi-line description", with_change("description", "a\nb"), "one line"),
    ("vm not object", with_change("vm", "x"), "vm"),
]


@pytest.mark.parametrize(
    ("case", "obj", "message"), BAD_SCENARIOS, ids=[c[0] for c in BAD_SCENARIOS]
)
def test_bad_scenario_is_rejected_with_a_clear_error(case: str, obj: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(obj, source="bad.json")


def test_duplicate_event_id_ignoring_case_is_rejected() -> None:
    obj = minimal()
    twin = copy.deepcopy(obj["events"][0])
    twin["EventId"] = EID.upper()
    obj["events"].append(twin)
    with pytest.raises(ScenarioError, match="appears twice"):
        parse_scenario(obj)


def test_gap_rule_spans_events() -> None:
    obj = minimal()
    other = copy.deepcopy(obj["events"][0])
    other["EventId"] = EID2
    other["timeline"] = [{"at": 3, "status": "Started"}, {"at": 25, "status": "gone"}]
    obj["events"].append(other)
    with pytest.raises(ScenarioError, match="0 s and 3 s"):
        parse_scenario(obj)


DERIVED = [
    (
        "cancelled",
        [{"at": 0, "status": "Scheduled", "notBeforeIn": 15}, {"at": 8, "status": "gone"}],
        ["Scheduled", "Cancelled"],
    ),
    (
        "first seen started",
        [{"at": 0, "status": "Started"}, {"at": 10, "status": "gone"}],
        ["Started", "Completed"],
    ),
    (
        "notBefore moved",
        [
            {"at": 0, "status": "Scheduled", "notBeforeIn": 15},
            {"at": 6, "notBeforeIn": 15},
            {"at": 21, "status": "Started"},
        ],
        ["Scheduled", "Updated", "Started"],
    ),
    (
        "same notBefore again is no update",
        [
            {"at": 0, "status": "Scheduled", "notBeforeIn": 20},
            {"at": 6, "notBeforeIn": 14},
        ],
        ["Scheduled"],
    ),
    (
        # One list of watched fields (sebridge.lifecycle.WATCHED_FIELDS) for every part.
        "event source changed is an update",
        [
            {"at": 0, "status": "Scheduled", "notBeforeIn": 20},
            {"at": 6, "set": {"EventSource": "User"}},
        ],
        ["Scheduled", "Updated"],
    ),
    (
        "description removed",
        [
            {"at": 0, "status": "Scheduled", "notBeforeIn": 20},
            {"at": 6, "set": {"Description": None}},
        ],
        ["Scheduled", "Updated"],
    ),
    (
        "change while started is not an update",
        [
            {"at": 0, "status": "Started"},
            {"at": 6, "set": {"Resources": ["vm1", "vm2"]}},
            {"at": 12, "status": "gone"},
        ],
        ["Started", "Completed"],
    ),
]


@pytest.mark.parametrize(("case", "timeline", "transitions"), DERIVED, ids=[d[0] for d in DERIVED])
def test_expect_is_checked_against_the_design_rules(
    case: str, timeline: list[dict[str, Any]], transitions: list[str]
) -> None:
    obj = with_change("events.0.timeline", timeline)
    obj["expect"] = [{"transition": t, "eventId": EID} for t in transitions]
    assert [e.transition for e in parse_scenario(obj).expect] == transitions
    obj["expect"] = obj["expect"][:-1]  # one transition short must fail
    with pytest.raises(ScenarioError, match="does not match"):
        parse_scenario(obj)


def test_load_scenario_from_file_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "mine.json"
    good.write_text(json.dumps(minimal()))
    assert load_scenario(str(good)).name == "t"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_scenario(str(broken))
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(str(tmp_path / "missing.json"))
    with pytest.raises(ScenarioError, match="unknown scenario 'nope'"):
        load_scenario("nope")


# ---------------------------------------------------------------------------------------------
# Runtime core


def sim_of(obj: dict[str, Any] | None = None, speed: float = 1.0) -> Simulation:
    return Simulation(parse_scenario(obj or minimal()), speed=speed)


def test_document_over_time_keeps_one_event_id_and_bumps_incarnation() -> None:
    sim = sim_of()
    seen = []
    for t in (0, 1, 15, 16, 25, 40):
        sim.advance_to(t, WALL + t)
        doc = sim.document()
        seen.append(
            (doc["DocumentIncarnation"], [(e["EventId"], e["EventStatus"]) for e in doc["Events"]])
        )
    assert seen == [
        (2, [(EID, "Scheduled")]),
        (2, [(EID, "Scheduled")]),
        (3, [(EID, "Started")]),
        (3, [(EID, "Started")]),
        (4, []),
        (4, []),
    ]


def test_not_before_is_rfc1123_scaled_by_speed_and_stable() -> None:
    sim = sim_of(speed=5)
    sim.advance_to(0, WALL)
    first = sim.document()["Events"][0]["NotBefore"]
    assert first.endswith(" GMT")
    parsed = email.utils.parsedate_to_datetime(first).timestamp()
    assert parsed == pytest.approx(WALL + 15 / 5, abs=1)
    sim.advance_to(2, WALL + 2 / 5)  # re-reading later must not move it (no false Updated)
    assert sim.document()["Events"][0]["NotBefore"] == first


def test_lazy_advance_computes_not_before_from_the_step_time() -> None:
    sim = sim_of(speed=1)
    sim.advance_to(5, WALL + 5)  # nobody polled at t=0
    parsed = email.utils.parsedate_to_datetime(sim.document()["Events"][0]["NotBefore"])
    assert parsed.timestamp() == pytest.approx(WALL + 15, abs=1)


def test_approval_starts_now_and_keeps_the_started_duration() -> None:
    sim = sim_of()
    sim.advance_to(2, WALL + 2)
    assert sim.approve([EID.upper()], 3, WALL + 3) == [EID]
    doc = sim.document()
    assert doc["DocumentIncarnation"] == 3
    assert doc["Events"][0]["EventStatus"] == "Started" and doc["Events"][0]["NotBefore"] == ""
    sim.advance_to(12, WALL + 12)
    assert sim.document()["Events"], "gone 10 s after approval, not before"
    sim.advance_to(13, WALL + 13)
    assert sim.document() == {"DocumentIncarnation": 4, "Events": []}


@pytest.mark.parametrize("event_id", ["00000000-0000-0000-0000-000000000000", "garbage"])
def test_approving_unknown_event_changes_nothing(event_id: str) -> None:
    sim = sim_of()
    sim.advance_to(1, WALL)
    before = sim.document()
    assert sim.approve([event_id], 1, WALL) == []
    assert sim.document() == before


def test_approving_a_started_event_changes_nothing() -> None:
    sim = sim_of()
    sim.advance_to(16, WALL + 16)
    before = sim.document()
    assert sim.approve([EID], 16, WALL + 16) == []
    assert sim.document() == before


def test_approval_of_an_event_that_never_starts_uses_started_for() -> None:
    obj = with_change(
        "events.0.timeline",
        [{"at": 0, "status": "Scheduled", "notBeforeIn": 15}, {"at": 8, "status": "gone"}],
    )
    obj["events"][0]["approval"] = {"startedFor": 7}
    obj["expect"] = [{"transition": t, "eventId": EID} for t in ("Scheduled", "Cancelled")]
    sim = sim_of(obj)
    sim.advance_to(1, WALL)
    sim.approve([EID], 1, WALL)
    sim.advance_to(7.9, WALL)
    assert sim.document()["Events"][0]["EventStatus"] == "Started"
    sim.advance_to(8, WALL)
    assert sim.document()["Events"] == []


def test_control_add_update_start_remove() -> None:
    sim = sim_of()
    sim.advance_to(1, WALL)
    inc = sim.incarnation
    added = sim.control(
        {
            "op": "add",
            "event": {"EventId": EID2, "EventType": "Reboot", "Resources": ["vm9"]},
            "notBeforeIn": 60,
        },
        1,
        WALL,
    )
    assert added["EventStatus"] == "Scheduled" and added["NotBefore"].endswith("GMT")
    sim.control(
        {"op": "update", "eventId": EID2.lower(), "set": {"Resources": ["vm9", "vm8"]}}, 1, WALL
    )
    sim.control({"op": "start", "eventId": EID2}, 1, WALL)
    ids = {e["EventId"]: e for e in sim.document()["Events"]}
    assert ids[EID2]["EventStatus"] == "Started" and ids[EID2]["Resources"] == ["vm9", "vm8"]
    sim.control({"op": "remove", "eventId": EID2}, 1, WALL)
    assert EID2 not in {e["EventId"] for e in sim.document()["Events"]}
    assert sim.incarnation == inc + 4


BAD_CONTROL = [
    ({"op": "explode", "eventId": EID}, "op must be"),
    ({"op": "start"}, "eventId"),
    ({"op": "start", "eventId": EID2}, "no present event"),
    (
        {
            "op": "add",
            "event": {"EventId": EID, "EventType": "Freeze", "Resources": []},
            "notBeforeIn": 5,
        },
        "already present",
    ),
    ({"op": "add", "event": {"EventId": EID2, "EventType": "Freeze"}}, "Resources"),
    (
        {"op": "add", "event": {"EventId": EID2, "EventType": "Freeze", "Resources": []}},
        "notBeforeIn",
    ),
    ({"op": "update", "eventId": EID, "set": {"EventId": EID2}}, "cannot be set"),
]


@pytest.mark.parametrize(("command", "message"), BAD_CONTROL)
def test_bad_control_commands(command: dict[str, Any], message: str) -> None:
    sim = sim_of()
    sim.advance_to(1, WALL)
    before = sim.document()
    with pytest.raises(ControlError, match=message):
        sim.control(command, 1, WALL)
    assert sim.document() == before


START_REQUESTS = [
    ({"StartRequests": [{"EventId": EID}]}, [EID]),
    ({"StartRequests": []}, []),
    ({"StartRequests": [{"EventId": "a"}, {"EventId": "b"}]}, ["a", "b"]),
    ([], ValueError),
    ({}, ValueError),
    ({"StartRequests": {"EventId": EID}}, ValueError),
    ({"StartRequests": [EID]}, ValueError),
    ({"StartRequests": [{"EventId": 5}]}, ValueError),
    ({"StartRequests": [{"EventId": ""}]}, ValueError),
    ({"StartRequests": [{}]}, ValueError),
]


@pytest.mark.parametrize(("body", "expected"), START_REQUESTS)
def test_start_requests_shape(body: Any, expected: Any) -> None:
    if expected is ValueError:
        with pytest.raises(ValueError):
            event_ids_of(body)
    else:
        assert list(event_ids_of(body)) == expected


# ---------------------------------------------------------------------------------------------
# Faults and instance metadata


def test_count_rule_fires_exactly_count_times_on_its_target() -> None:
    rules = [parse_cli_rule("429:count=2,retryAfter=3")]
    assert decide(rules, "post").rule is None  # default target is GET only
    fired = [decide(rules, "get").rule for _ in range(4)]
    assert [r is not None for r in fired] == [True, True, False, False]
    assert fired[0] is not None and fired[0].retry_after == 3


def test_probability_rule_is_reproducible_with_a_seed() -> None:
    def pattern() -> list[bool]:
        rules = parse_rules([{"kind": "5xx", "probability": 0.5, "seed": 42, "status": 503}])
        return [decide(rules, "get").rule is not None for _ in range(40)]

    first = pattern()
    assert first == pattern()
    assert 5 < sum(first) < 35


def test_hang_then_next_rule() -> None:
    rules = parse_rules(
        {"rules": [{"kind": "hang", "seconds": 2}, {"kind": "reset", "target": "any"}]}
    )
    decision = decide(rules, "get")
    assert decision.hang == 2 and decision.rule is not None and decision.rule.kind == "reset"


def test_4xx_rule_defaults_to_400_and_takes_a_4xx_status() -> None:
    rule = parse_cli_rule("4xx:target=post")
    assert (rule.kind, rule.status, rule.target) == ("4xx", 400, "post")
    assert parse_rule({"kind": "4xx", "status": 404}).status == 404
    assert decide([rule], "get").rule is None and decide([rule], "post").rule is rule


BAD_FAULTS = [
    ({"kind": "404"}, "kind"),
    ({"kind": "4xx", "status": 500}, "status"),
    ({"kind": "429", "count": 0}, "count"),
    ({"kind": "5xx", "status": 404}, "status"),
    ({"kind": "hang", "seconds": 3600}, "seconds"),
    ({"kind": "5xx", "probability": 2}, "probability"),
    ({"kind": "malformed", "body": "html"}, "body"),
    ({"kind": "reset", "target": "put"}, "target"),
    ({"kind": "reset", "cnt": 1}, "unknown"),
]


@pytest.mark.parametrize(("rule", "message"), BAD_FAULTS)
def test_bad_fault_rules(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(FaultError, match=message):
        parse_rule(rule)


def test_cli_fault_syntax_errors() -> None:
    with pytest.raises(FaultError, match="key=value"):
        parse_cli_rule("429:count")


def test_instance_document_per_vm_name() -> None:
    base = instance_document(vm_settings({}))
    web = instance_document(vm_settings({"vmId": "fixed"}, "web-7"))
    assert base["compute"]["name"] == "vmss_vm1"
    assert web["compute"]["name"] == "web-7"
    assert web["compute"]["vmId"] not in ("fixed", base["compute"]["vmId"])
    assert web["compute"]["resourceId"].endswith("/virtualMachines/web-7")
