"""The live scheduled-events document of one simulator: a scenario replayed against a clock.

Pure: the caller passes scenario time ``t`` (seconds at --speed 1) and the wall-clock time
``wall`` (epoch seconds) to every call; nothing here reads a clock or does I/O. The server
holds one :class:`Simulation` behind a lock and advances it lazily on each request, so the
document is a function of time whether or not anyone polls.

DocumentIncarnation goes up by one for every moment at which the document changes (all steps
due at one scenario time are one change), for each approval that starts an event, and for
each test-control change; a step ``{"incarnation": n}`` sets it instead.
"""

from __future__ import annotations

import email.utils
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from emulators.imds.scenario import (
    FIELD_ORDER,
    GONE,
    OPTIONAL_FIELDS,
    SCHEDULED,
    STARTED,
    EventSpec,
    Scenario,
    ScenarioError,
    Step,
    check_field,
    parse_step,
)


def rfc1123(wall: float) -> str:
    """``Mon, 11 Apr 2022 22:26:58 GMT``, what real IMDS puts in NotBefore."""
    return email.utils.formatdate(int(wall), usegmt=True)


@dataclass
class LiveEvent:
    """An event as it stands now, plus the steps still due (absolute scenario times)."""

    spec: EventSpec
    fields: dict[str, Any]
    status: str | None = None  # None until the first step, GONE after the last
    not_before: str = ""
    pending: list[Step] = field(default_factory=list)
    origin: float = 0.0  # scenario time the timeline's "at" values count from

    @property
    def key(self) -> str:
        return str(self.fields["EventId"]).lower()

    @property
    def present(self) -> bool:
        return self.status in (SCHEDULED, STARTED)

    def to_imds(self) -> dict[str, Any]:
        values = dict(self.fields, EventStatus=self.status, NotBefore=self.not_before)
        return {name: values[name] for name in FIELD_ORDER if name in values}


class ControlError(ValueError):
    """A /_sim/event request that cannot be applied (the message says why)."""


class Simulation:
    def __init__(self, scenario: Scenario, *, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.scenario = scenario
        self.speed = speed
        self.incarnation = scenario.incarnation_start
        self.now = 0.0
        origin = scenario.start_delay
        self.events: list[LiveEvent] = [
            LiveEvent(
                spec=spec, fields=dict(spec.fields), pending=list(spec.timeline), origin=origin
            )
            for spec in scenario.events
        ]

    # -- time ------------------------------------------------------------------------------

    def _due_moments(self, t: float) -> list[float]:
        return sorted(
            {e.origin + s.at for e in self.events for s in e.pending if e.origin + s.at <= t}
        )

    def advance_to(self, t: float, wall: float) -> list[str]:
        """Apply every step due by scenario time ``t``; returns one log line per change."""
        log: list[str] = []
        for moment in self._due_moments(t):
            self.now = max(self.now, moment)
            changed: list[str] = []
            reset_to: int | None = None
            for event in self.events:
                while event.pending and event.origin + event.pending[0].at <= moment:
                    step = event.pending.pop(0)
                    # NotBefore counts from the step's own time, mapped to the wall clock now.
                    step_wall = wall - (t - (event.origin + step.at)) / self.speed
                    if self._apply(event, step, step_wall):
                        changed.append(f"{event.fields['EventId']} -> {event.status}")
                    if step.incarnation is not None:
                        reset_to = step.incarnation
            if reset_to is not None:
                self.incarnation = reset_to
            elif changed:
                self.incarnation += 1
            if reset_to is not None or changed:
                what = ", ".join(changed) or "no event change"
                log.append(f"t={moment:g}s incarnation {self.incarnation}: {what}")
        self.now = max(self.now, t)
        return log

    def _apply(self, event: LiveEvent, step: Step, step_wall: float) -> bool:
        before = (event.status, event.not_before, dict(event.fields))
        if step.status is not None:
            event.status = step.status
            if step.status in (STARTED, GONE):
                event.not_before = ""
        if step.not_before_in is not None:
            event.not_before = rfc1123(step_wall + step.not_before_in / self.speed)
        for name, value in step.set_fields.items():
            if value is None:
                event.fields.pop(name, None)
            else:
                event.fields[name] = value
        return before != (event.status, event.not_before, event.fields)

    # -- reading ---------------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        return {
            "DocumentIncarnation": self.incarnation,
            "Events": [e.to_imds() for e in self.events if e.present],
        }

    def find(self, event_id: str) -> LiveEvent | None:
        key = event_id.strip().lower()
        for event in self.events:
            if event.key == key and event.status != GONE:
                return event
        return None

    # -- approvals -------------------------------------------------------------------------

    def approve(self, event_ids: Iterable[str], t: float, wall: float) -> list[str]:
        """StartRequests: start each present Scheduled event; unknown or Started ones: no-op.

        Returns the EventIds (as the document spells them) that moved to Started.
        """
        self.advance_to(t, wall)
        started: list[str] = []
        for event_id in event_ids:
            event = self.find(event_id)
            if event is None or event.status != SCHEDULED:
                continue
            stay = event.spec.started_for_after_approval()
            event.status = STARTED
            event.not_before = ""
            event.origin = t
            event.pending = [Step(at=stay, status=GONE)]
            started.append(str(event.fields["EventId"]))
        if started:
            self.incarnation += 1
        return started

    # -- test control (/_sim/event) --------------------------------------------------------

    def control(self, command: Mapping[str, Any], t: float, wall: float) -> dict[str, Any]:
        """Apply one /_sim/event command (see the server docstring); returns the event."""
        self.advance_to(t, wall)
        op = command.get("op")
        if op == "add":
            event = self._add(command, t, wall)
        else:
            event_id = command.get("eventId")
            if not isinstance(event_id, str) or not event_id.strip():
                raise ControlError("eventId (a string) is required")
            found = self.find(event_id)
            if found is None or not found.present:
                raise ControlError(f"no present event with EventId {event_id}")
            event = found
            if op == "update":
                self._update(event, command, wall)
            elif op == "start":
                event.status = STARTED
                event.not_before = ""
                event.pending = []
            elif op == "remove":
                event.status = GONE
                event.pending = []
            else:
                raise ControlError(f"op must be add, update, start or remove, not {op!r}")
            self.incarnation += 1
        return event.to_imds()

    def _add(self, command: Mapping[str, Any], t: float, wall: float) -> LiveEvent:
        raw = command.get("event")
        if not isinstance(raw, Mapping):
            raise ControlError("add needs 'event': an object with the IMDS fields")
        fields: dict[str, Any] = {}
        try:
            for name in ("EventId", "EventType", "Resources"):
                if name not in raw:
                    raise ControlError(f"event.{name} is required")
            for name in FIELD_ORDER:
                if name in raw and name not in ("EventStatus", "NotBefore"):
                    fields[name] = check_field(name, raw[name], "event")
            timeline = command.get("timeline", [])
            if not isinstance(timeline, list):
                raise ControlError("timeline must be a list of steps (at = seconds from now)")
            steps = [parse_step(s, f"timeline[{i}]") for i, s in enumerate(timeline)]
        except ScenarioError as exc:
            raise ControlError(str(exc)) from None
        fields.setdefault("ResourceType", "VirtualMachine")
        if self.find(str(fields["EventId"])) is not None:
            raise ControlError(f"EventId {fields['EventId']} is already present")
        status = raw.get("EventStatus", SCHEDULED)
        if status not in (SCHEDULED, STARTED):
            raise ControlError("event.EventStatus must be Scheduled or Started")
        event = LiveEvent(
            spec=EventSpec(fields=dict(fields), timeline=tuple(steps)),
            fields=fields,
            status=status,
            pending=sorted(steps, key=lambda s: s.at),
            origin=t,
        )
        if status == SCHEDULED:
            event.not_before = self._not_before(raw, command, wall)
        self.events.append(event)
        self.incarnation += 1
        return event

    def _not_before(self, raw: Mapping[str, Any], command: Mapping[str, Any], wall: float) -> str:
        if "notBeforeIn" in command:
            seconds = command["notBeforeIn"]
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
                raise ControlError("notBeforeIn must be a number of scenario seconds >= 0")
            return rfc1123(wall + seconds / self.speed)
        value = raw.get("NotBefore")
        if isinstance(value, str):
            return value  # verbatim, so tests can serve odd formats (ISO 8601, garbage)
        raise ControlError("a Scheduled event needs notBeforeIn or event.NotBefore")

    def _update(self, event: LiveEvent, command: Mapping[str, Any], wall: float) -> None:
        changes = command.get("set", {})
        if not isinstance(changes, Mapping):
            raise ControlError("set must be an object of IMDS fields")
        for name, value in changes.items():
            if name == "NotBefore" and isinstance(value, str):
                event.not_before = value
            elif value is None and name in OPTIONAL_FIELDS:
                event.fields.pop(name, None)
            elif name in ("EventId", "EventStatus"):
                raise ControlError(f"{name} cannot be set (use op start/remove for the status)")
            else:
                try:
                    event.fields[name] = check_field(name, value, "set")
                except ScenarioError as exc:
                    raise ControlError(str(exc)) from None
        if "notBeforeIn" in command:
            event.not_before = self._not_before({}, command, wall)

    def state(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            "speed": self.speed,
            "elapsed": round(self.now, 3),
            "duration": self.scenario.duration,
            "finished": self.now >= self.scenario.duration
            and all(not e.pending for e in self.events),
            "incarnation": self.incarnation,
            "document": self.document(),
            "pending": {
                str(e.fields["EventId"]): [e.origin + s.at for s in e.pending]
                for e in self.events
                if e.pending
            },
        }


def event_ids_of(body: object) -> Sequence[str]:
    """The EventIds of a StartRequests body, or ValueError saying what is malformed."""
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object")
    requests = body.get("StartRequests")
    if not isinstance(requests, list):
        raise ValueError("StartRequests must be a list")
    ids: list[str] = []
    for index, item in enumerate(requests):
        if not isinstance(item, Mapping):
            raise ValueError(f"StartRequests[{index}] must be an object")
        event_id = item.get("EventId")
        if not isinstance(event_id, str) or not event_id.strip():
            raise ValueError(f"StartRequests[{index}].EventId must be a non-empty string")
        ids.append(event_id)
    return ids
