"""Scenario files for the IMDS simulator: load, validate, and derive the expected transitions.

Pure: no sockets, no clocks. A scenario is a JSON file (``scenarios/<name>.json``)::

    {
      "name": "live-migration",            # equals the file name for packaged scenarios
      "description": "one line for --list",
      "provenance": "where the fields and timings come from",
      "vm": {"name": "vmss_vm1", ...},     # optional: instance metadata overrides
      "startDelay": 0,                     # optional: scenario seconds before the timeline
      "incarnationStart": 1,               # optional: DocumentIncarnation before any change
      "events": [
        {
          "EventId": "<guid, any case>", "EventType": "Freeze", "ResourceType": "VirtualMachine",
          "Resources": ["vmss_vm1"],
          "Description": "...", "EventSource": "Platform", "DurationInSeconds": 5,  # optional
          "timeline": [
            {"at": 0, "status": "Scheduled", "notBeforeIn": 15},
            {"at": 6, "notBeforeIn": 20, "set": {"Resources": ["vmss_vm1", "vmss_vm2"]}},
            {"at": 15, "status": "Started"},
            {"at": 21, "status": "gone"},
            {"at": 30, "incarnation": 1}   # DocumentIncarnation jumps to 1 (IMDS re-enabled)
          ],
          "approval": {"startedFor": 6}    # optional, see below
        }
      ],
      "expect": [{"transition": "Scheduled", "eventId": "<lower-case guid>"}, ...]
    }

Times are scenario seconds after ``startDelay``; ``--speed X`` divides them (and NotBefore
offsets) by X. ``notBeforeIn`` is counted from the step's own ``at``.

Approval: a POST StartRequests for a Scheduled event moves it to Started at once and drops the
rest of its timeline; it then vanishes after the same time it would have spent Started without
approval (the gap between its Started and gone steps), or ``approval.startedFor`` if the
timeline never starts it, or :data:`DEFAULT_APPROVED_STARTED_FOR`.

Rules that make ``expect`` robust (checked by :func:`parse_scenario`):

* Two different moments at which the document changes are at least :data:`MIN_STEP_GAP`
  scenario seconds apart, across all events. Forwarder tests run at ``--speed 5`` with a 0.2 s
  poll, so 6 s become 1.2 s: a poller sees every intermediate document. Several events may
  change at the same moment (that is one document change).
* ``expect`` must equal what a poller that sees every document derives with the DESIGN.md
  rules (:func:`derive_transitions`). Transitions from one document change are listed in
  document order for present events, then in previous-document order for vanished ones.
"""

from __future__ import annotations

import itertools
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sebridge.lifecycle import WATCHED_FIELDS

MIN_STEP_GAP = 6.0
DEFAULT_APPROVED_STARTED_FOR = 10.0

SCHEDULED = "Scheduled"
STARTED = "Started"
GONE = "gone"
STATUSES = (SCHEDULED, STARTED, GONE)

EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
EVENT_SOURCES = ("Platform", "User")
TRANSITIONS = ("Scheduled", "Updated", "Started", "Completed", "Cancelled")

# IMDS event fields in the order IMDS documents them; EventStatus/NotBefore come from the timeline.
FIELD_ORDER = (
    "EventId",
    "EventType",
    "ResourceType",
    "Resources",
    "EventStatus",
    "NotBefore",
    "Description",
    "EventSource",
    "DurationInSeconds",
)
REQUIRED_FIELDS = ("EventId", "EventType", "Resources")
OPTIONAL_FIELDS = ("Description", "EventSource", "DurationInSeconds")
SETTABLE_FIELDS = ("EventType", "ResourceType", "Resources", *OPTIONAL_FIELDS)
# A change of one of these while Scheduled is an Updated transition: the kernel's one list.
UPDATE_FIELDS = WATCHED_FIELDS

_SCENARIO_KEYS = {
    "name",
    "description",
    "provenance",
    "vm",
    "startDelay",
    "incarnationStart",
    "events",
    "expect",
}
_EVENT_KEYS = {*FIELD_ORDER, "timeline", "approval"} - {"EventStatus", "NotBefore"}
_STEP_KEYS = {"at", "status", "notBeforeIn", "set", "incarnation", "note"}
_VM_KEYS = {
    "name",
    "vmId",
    "resourceId",
    "subscriptionId",
    "resourceGroupName",
    "location",
    "zone",
    "vmScaleSetName",
    "osType",
    "vmSize",
    "privateIpAddress",
    "tags",
}

PACKAGE_SCENARIOS = "emulators.imds"
DEFAULT_SCENARIO = "live-migration"


class ScenarioError(ValueError):
    """A scenario file that the simulator cannot replay faithfully (the message says where)."""


@dataclass(frozen=True)
class Step:
    at: float
    status: str | None = None
    not_before_in: float | None = None
    set_fields: Mapping[str, Any] = field(default_factory=dict)
    incarnation: int | None = None

    def changes_event(self) -> bool:
        return self.status is not None or self.not_before_in is not None or bool(self.set_fields)


@dataclass(frozen=True)
class EventSpec:
    """One event: its fixed IMDS fields (without EventStatus/NotBefore) and its timeline."""

    fields: Mapping[str, Any]
    timeline: tuple[Step, ...]
    approval_started_for: float | None = None

    @property
    def event_id(self) -> str:
        return str(self.fields["EventId"])

    @property
    def key(self) -> str:
        return self.event_id.lower()

    def started_for_after_approval(self) -> float:
        """How long the event stays Started when approved (see the module docstring)."""
        started = [s.at for s in self.timeline if s.status == STARTED]
        gone = [s.at for s in self.timeline if s.status == GONE]
        if started and gone and gone[-1] > started[0]:
            return gone[-1] - started[0]
        if self.approval_started_for is not None:
            return self.approval_started_for
        return DEFAULT_APPROVED_STARTED_FOR


@dataclass(frozen=True)
class Expectation:
    transition: str
    event_id: str

    def to_json(self) -> dict[str, str]:
        return {"transition": self.transition, "eventId": self.event_id}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    provenance: str
    events: tuple[EventSpec, ...]
    expect: tuple[Expectation, ...]
    vm: Mapping[str, Any] = field(default_factory=dict)
    start_delay: float = 0.0
    incarnation_start: int = 1
    source: str = "<memory>"

    @property
    def duration(self) -> float:
        """Scenario seconds from start until the last step (startDelay included)."""
        last = max((s.at for e in self.events for s in e.timeline), default=0.0)
        return self.start_delay + last


# ---------------------------------------------------------------------------------------------
# Parsing and validation


def _number(value: object, where: str, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScenarioError(f"{where}: expected a number, got {value!r}")
    if value < minimum:
        raise ScenarioError(f"{where}: must be >= {minimum:g}, got {value!r}")
    return float(value)


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: expected an integer, got {value!r}")
    return value


def _string(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ScenarioError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _unknown_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {unknown} (allowed: {sorted(allowed)})")


def check_field(name: str, value: object, where: str) -> Any:
    """Type-check one IMDS field as the simulator will serve it."""
    here = f"{where}.{name}"
    if name == "EventId":
        text = _string(value, here)
        try:
            uuid.UUID(text)
        except ValueError:
            raise ScenarioError(f"{here}: {text!r} is not a GUID") from None
        return text
    if name == "EventType":
        text = _string(value, here)
        if text not in EVENT_TYPES:
            raise ScenarioError(f"{here}: {text!r} is not one of {list(EVENT_TYPES)}")
        return text
    if name == "EventSource":
        text = _string(value, here)
        if text not in EVENT_SOURCES:
            raise ScenarioError(f"{here}: {text!r} is not one of {list(EVENT_SOURCES)}")
        return text
    if name in ("ResourceType", "Description"):
        return _string(value, here)
    if name == "Resources":
        if not isinstance(value, list) or not all(isinstance(r, str) and r for r in value):
            raise ScenarioError(f"{here}: expected a list of non-empty strings, got {value!r}")
        return list(value)
    if name == "DurationInSeconds":
        duration = _int(value, here)
        if duration < -1:
            raise ScenarioError(f"{here}: must be -1 (unknown) or >= 0, got {duration}")
        return duration
    raise ScenarioError(f"{here}: not an IMDS event field")


def parse_step(obj: object, where: str) -> Step:
    if not isinstance(obj, Mapping):
        raise ScenarioError(f"{where}: a timeline step must be an object, got {obj!r}")
    _unknown_keys(obj, _STEP_KEYS, where)
    if "at" not in obj:
        raise ScenarioError(f"{where}: missing 'at' (scenario seconds)")
    at = _number(obj["at"], f"{where}.at")
    status = obj.get("status")
    if status is not None and status not in STATUSES:
        raise ScenarioError(f"{where}.status: {status!r} is not one of {list(STATUSES)}")
    not_before_in = None
    if "notBeforeIn" in obj:
        not_before_in = _number(obj["notBeforeIn"], f"{where}.notBeforeIn")
    set_fields: dict[str, Any] = {}
    raw_set = obj.get("set", {})
    if not isinstance(raw_set, Mapping):
        raise ScenarioError(f"{where}.set: expected an object, got {raw_set!r}")
    for name, value in raw_set.items():
        if name not in SETTABLE_FIELDS:
            raise ScenarioError(
                f"{where}.set: {name!r} cannot be set (settable: {list(SETTABLE_FIELDS)}; "
                "EventStatus and NotBefore come from status and notBeforeIn)"
            )
        if value is None:  # null removes an optional field
            if name not in OPTIONAL_FIELDS:
                raise ScenarioError(f"{where}.set.{name}: only optional fields can be removed")
            set_fields[name] = None
        else:
            set_fields[name] = check_field(name, value, f"{where}.set")
    incarnation = None
    if "incarnation" in obj:
        incarnation = _int(obj["incarnation"], f"{where}.incarnation")
        if incarnation < 0:
            raise ScenarioError(f"{where}.incarnation: must be >= 0")
    step = Step(
        at=at,
        status=status,
        not_before_in=not_before_in,
        set_fields=set_fields,
        incarnation=incarnation,
    )
    if not step.changes_event() and step.incarnation is None:
        raise ScenarioError(f"{where}: the step changes nothing")
    return step


def _check_timeline(steps: Sequence[Step], where: str) -> None:
    """Steps of one event must follow the IMDS life cycle: Scheduled -> Started -> gone."""
    if not steps:
        raise ScenarioError(f"{where}: the timeline is empty")
    status: str | None = None
    previous_at: float | None = None
    for index, step in enumerate(steps):
        here = f"{where}[{index}]"
        if previous_at is not None and step.at <= previous_at:
            raise ScenarioError(f"{here}: 'at' must increase ({step.at:g} after {previous_at:g})")
        previous_at = step.at
        if status is None:
            if step.status not in (SCHEDULED, STARTED):
                raise ScenarioError(f"{here}: the first step must have status Scheduled or Started")
            if step.status == SCHEDULED and step.not_before_in is None:
                raise ScenarioError(f"{here}: a Scheduled event needs notBeforeIn")
        elif status == GONE:
            raise ScenarioError(f"{here}: the event is already gone (a gone EventId never returns)")
        elif step.status == SCHEDULED and status == STARTED:
            raise ScenarioError(f"{here}: an event cannot go back from Started to Scheduled")
        elif step.status == STARTED and status == STARTED:
            raise ScenarioError(f"{here}: the event is already Started")
        if step.not_before_in is not None and (step.status or status) != SCHEDULED:
            raise ScenarioError(f"{here}: notBeforeIn only applies while Scheduled")
        if step.status == GONE and (step.set_fields or step.not_before_in is not None):
            raise ScenarioError(f"{here}: a gone step cannot also change fields")
        if step.status is not None:
            status = step.status


def _parse_event(obj: object, where: str) -> EventSpec:
    if not isinstance(obj, Mapping):
        raise ScenarioError(f"{where}: an event must be an object")
    _unknown_keys(obj, _EVENT_KEYS, where)
    fields: dict[str, Any] = {}
    for name in REQUIRED_FIELDS:
        if name not in obj:
            raise ScenarioError(f"{where}: missing {name}")
    for name in FIELD_ORDER:
        if name in obj:
            fields[name] = check_field(name, obj[name], where)
    fields.setdefault("ResourceType", "VirtualMachine")
    raw_timeline = obj.get("timeline")
    if not isinstance(raw_timeline, list):
        raise ScenarioError(f"{where}.timeline: expected a list of steps")
    steps = tuple(parse_step(s, f"{where}.timeline[{i}]") for i, s in enumerate(raw_timeline))
    _check_timeline(steps, f"{where}.timeline")
    started_for = None
    approval = obj.get("approval")
    if approval is not None:
        if not isinstance(approval, Mapping):
            raise ScenarioError(f"{where}.approval: expected an object")
        _unknown_keys(approval, {"startedFor"}, f"{where}.approval")
        if "startedFor" in approval:
            started_for = _number(
                approval["startedFor"], f"{where}.approval.startedFor", minimum=MIN_STEP_GAP
            )
    return EventSpec(fields=fields, timeline=steps, approval_started_for=started_for)


def _check_gaps(events: Sequence[EventSpec], where: str) -> None:
    moments = sorted({s.at for e in events for s in e.timeline})
    for earlier, later in itertools.pairwise(moments):
        if later - earlier < MIN_STEP_GAP:
            raise ScenarioError(
                f"{where}: document changes at {earlier:g} s and {later:g} s are less than "
                f"{MIN_STEP_GAP:g} scenario seconds apart; a 0.2 s poller at --speed 5 could "
                "miss the document in between (put them at the same moment or further apart)"
            )


def _parse_expect(obj: object, where: str) -> tuple[Expectation, ...]:
    if not isinstance(obj, list):
        raise ScenarioError(f"{where}: expected a list of transitions")
    out = []
    for index, item in enumerate(obj):
        here = f"{where}[{index}]"
        if not isinstance(item, Mapping):
            raise ScenarioError(f"{here}: expected an object")
        _unknown_keys(item, {"transition", "eventId"}, here)
        transition = item.get("transition")
        if transition not in TRANSITIONS:
            raise ScenarioError(f"{here}.transition: {transition!r} is not one of {TRANSITIONS}")
        event_id = _string(item.get("eventId"), f"{here}.eventId")
        if event_id != event_id.lower():
            raise ScenarioError(f"{here}.eventId: write it in lower case ({event_id.lower()})")
        out.append(Expectation(transition=str(transition), event_id=event_id))
    return tuple(out)


def parse_scenario(obj: object, *, source: str = "<memory>") -> Scenario:
    """Validate a decoded scenario file; raise :class:`ScenarioError` naming the bad part."""
    where = source
    if not isinstance(obj, Mapping):
        raise ScenarioError(f"{where}: a scenario must be a JSON object")
    _unknown_keys(obj, _SCENARIO_KEYS, where)
    for key in ("name", "description", "provenance", "events", "expect"):
        if key not in obj:
            raise ScenarioError(f"{where}: missing {key!r}")
    name = _string(obj["name"], f"{where}.name")
    description = _string(obj["description"], f"{where}.description")
    if "\n" in description:
        raise ScenarioError(f"{where}.description: must be one line (it is what --list prints)")
    provenance = _string(obj["provenance"], f"{where}.provenance")
    vm = obj.get("vm", {})
    if not isinstance(vm, Mapping):
        raise ScenarioError(f"{where}.vm: expected an object")
    _unknown_keys(vm, _VM_KEYS, f"{where}.vm")
    for key, value in vm.items():
        if key == "tags":
            if not isinstance(value, Mapping):
                raise ScenarioError(f"{where}.vm.tags: expected an object")
        elif not isinstance(value, str):
            raise ScenarioError(f"{where}.vm.{key}: expected a string")
    start_delay = _number(obj.get("startDelay", 0), f"{where}.startDelay")
    incarnation_start = _int(obj.get("incarnationStart", 1), f"{where}.incarnationStart")
    raw_events = obj["events"]
    if not isinstance(raw_events, list):
        raise ScenarioError(f"{where}.events: expected a list")
    events = tuple(_parse_event(e, f"{where}.events[{i}]") for i, e in enumerate(raw_events))
    seen: set[str] = set()
    for event in events:
        if event.key in seen:
            raise ScenarioError(f"{where}: EventId {event.event_id} appears twice (ignoring case)")
        seen.add(event.key)
    _check_gaps(events, f"{where}.events")
    expect = _parse_expect(obj["expect"], f"{where}.expect")
    derived = derive_transitions(events)
    if derived != expect:
        raise ScenarioError(
            f"{where}.expect does not match the timeline. A poller that sees every document "
            f"derives:\n{json.dumps([e.to_json() for e in derived], indent=2)}"
        )
    return Scenario(
        name=name,
        description=description,
        provenance=provenance,
        events=events,
        expect=expect,
        vm=dict(vm),
        start_delay=start_delay,
        incarnation_start=incarnation_start,
        source=source,
    )


# ---------------------------------------------------------------------------------------------
# What a correct forwarder derives (DESIGN.md "Lifecycle transitions"), from the spec alone.


def _snapshot_at(events: Sequence[EventSpec], moment: float) -> dict[str, dict[str, Any]]:
    """The document at ``moment`` as {key: fields}, NotBefore as absolute scenario seconds."""
    out: dict[str, dict[str, Any]] = {}
    for event in events:
        fields: dict[str, Any] = dict(event.fields)
        status: str | None = None
        for step in event.timeline:
            if step.at > moment:
                break
            if step.status is not None:
                status = step.status
            if step.not_before_in is not None:
                fields["NotBefore"] = step.at + step.not_before_in
            for name, value in step.set_fields.items():
                if value is None:
                    fields.pop(name, None)
                else:
                    fields[name] = value
        if status in (SCHEDULED, STARTED):
            fields["EventStatus"] = status
            if status == STARTED:
                fields["NotBefore"] = ""
            out[event.key] = fields
    return out


def diff_documents(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> list[Expectation]:
    """DESIGN.md's rules on two documents keyed by lower-case EventId (insertion = doc order)."""
    out: list[Expectation] = []
    for key, new in after.items():
        old = before.get(key)
        status = new["EventStatus"]
        if old is None:
            out.append(Expectation(SCHEDULED if status == SCHEDULED else STARTED, key))
        elif old["EventStatus"] == SCHEDULED and status == STARTED:
            out.append(Expectation(STARTED, key))
        elif status == SCHEDULED and any(old.get(f) != new.get(f) for f in UPDATE_FIELDS):
            out.append(Expectation("Updated", key))
    for key, old in before.items():
        if key not in after:
            done = old["EventStatus"] == STARTED
            out.append(Expectation("Completed" if done else "Cancelled", key))
    return out


def derive_transitions(events: Sequence[EventSpec]) -> tuple[Expectation, ...]:
    """The transitions a poller that sees every document derives when nobody approves."""
    moments = sorted({s.at for e in events for s in e.timeline})
    previous: dict[str, dict[str, Any]] = {}
    out: list[Expectation] = []
    for moment in moments:
        current = _snapshot_at(events, moment)
        out.extend(diff_documents(previous, current))
        previous = current
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Files


def _scenario_dir() -> Any:
    return resources.files(PACKAGE_SCENARIOS).joinpath("scenarios")


def scenario_names() -> list[str]:
    """Names of the scenarios shipped in the package, sorted."""
    return sorted(
        entry.name.removesuffix(".json")
        for entry in _scenario_dir().iterdir()
        if entry.name.endswith(".json")
    )


def _decode(text: str, source: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{source}: not valid JSON: {exc}") from None


def load_scenario(name_or_path: str) -> Scenario:
    """A packaged scenario by name, or a JSON file by path (anything with a / or .json)."""
    looks_like_path = "/" in name_or_path or "\\" in name_or_path or name_or_path.endswith(".json")
    if looks_like_path:
        path = Path(name_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(f"{path}: cannot read the scenario file: {exc}") from None
        return parse_scenario(_decode(text, str(path)), source=str(path))
    entry = _scenario_dir().joinpath(f"{name_or_path}.json")
    if not entry.is_file():
        raise ScenarioError(
            f"unknown scenario {name_or_path!r}; known: {', '.join(scenario_names())} "
            "(or give a path to a .json file)"
        )
    source = f"scenarios/{name_or_path}.json"
    scenario = parse_scenario(_decode(entry.read_text(encoding="utf-8"), source), source=source)
    if scenario.name != name_or_path:
        raise ScenarioError(f"{source}: name {scenario.name!r} differs from the file name")
    return scenario
