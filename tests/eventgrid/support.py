"""Helpers for the Event Grid ingestion tests: notifications, timelines, an in-memory store."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from emulators.fakes.eventgrid import (
    EVENT_GRID_SCHEMA,
    PlatformView,
    notification,
    scheduled_event_id,
)
from emulators.imds.scenario import load_scenario
from emulators.imds.simulation import Simulation
from functions.eventgrid_ingest.core import StateConflict
from functions.eventgrid_ingest.notification import (
    Notification,
    parse_notification,
    raw_from_json,
)
from sebridge.contract.events import Envelope
from sebridge.forwarder.imds.diff import diff, index
from sebridge.imds import Document
from sebridge.lifecycle import Life, advance
from tests.fixtures import golden

HERE = Path(__file__).parent
SUB = golden.SUBSCRIPTION
RG = "rg-web"
VM = "web-1"
EVENT_ID = golden.EVENT_ID  # upper case, as IMDS may send it
T0 = datetime(2026, 11, 22, 1, 20, 0, tzinfo=UTC)
BASE_WALL = T0.timestamp()


def documented_sample(**substitutions: str) -> dict[str, Any]:
    """Microsoft's sample payload ("Scheduled Events in Event Grid"), verbatim but for its
    placeholders, which break Azure's naming rules and are replaced by real-looking values."""
    text = (HERE / "fixtures" / "documented-sample.json").read_text()
    values = {
        "subscription-id": SUB,
        "rg-name": RG,
        "vmss-name": "myvmss",
        "event-id": "3da1b9aa-5204-4335-8c33-c54e315dcffe",
        **substitutions,
    }
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def properties(status: str = "Scheduled", **fields: Any) -> dict[str, Any]:
    """The golden event's IMDS fields with a status (and some fields replaced)."""
    out = {**golden.SCHEDULED, "EventStatus": status, **fields}
    if status in ("Started", "Completed"):
        out["NotBefore"] = ""
    return out


def event_json(
    status: str = "Scheduled",
    at: datetime | int = 0,
    *,
    schema: str = EVENT_GRID_SCHEMA,
    event_grid_id: str | None = None,
    vm: str = VM,
    **fields: Any,
) -> dict[str, Any]:
    when = at if isinstance(at, datetime) else T0 + timedelta(seconds=at)
    props = properties(status, **fields)
    return notification(
        props,
        resource_id=scheduled_event_id(SUB, RG, vm, props["EventId"]),
        event_time=when,
        schema=schema,
        event_grid_id=event_grid_id,
    )


def note(status: str = "Scheduled", at: datetime | int = 0, **fields: Any) -> Notification:
    return parse_notification(raw_from_json(event_json(status, at, **fields)))


# -- the same event seen by a forwarder and through Event Grid --------------------------------
def scenario_documents(name: str) -> list[tuple[float, dict[str, Any]]]:
    """Every distinct IMDS document of a packaged scenario, with its scenario time."""
    scenario = load_scenario(name)
    sim = Simulation(scenario, speed=1.0)
    moments = sorted({e.origin + s.at for e in sim.events for s in e.pending})
    out = [(0.0, sim.document())]
    for moment in moments:
        sim.advance_to(moment, BASE_WALL + moment)
        out.append((moment, sim.document()))
    return out


def forwarder_ids(documents: Iterable[Mapping[str, Any]]) -> list[str]:
    """The message ids a forwarder that saw every document publishes (its diff + advance)."""
    known: dict[str, Any] = {}
    lives: dict[str, Life] = {}
    ids = []
    for raw in documents:
        document = Document.from_imds(raw)
        for change in diff(known, document):
            life, message_id = advance(
                lives.get(change.event.key), change.transition.value, change.event
            )
            lives[change.event.key] = life
            ids.append(message_id)
        known = index(document.events)
    return ids


def platform_notifications(
    timeline: Iterable[tuple[float, Mapping[str, Any]]], vm: str = VM
) -> list[dict[str, Any]]:
    """The Event Grid notifications Azure publishes for the same documents (PlatformView)."""
    view = PlatformView()
    out = []
    for moment, document in timeline:
        for props in view.changes(document):
            out.append(
                notification(
                    props,
                    resource_id=scheduled_event_id(SUB, RG, vm, props["EventId"]),
                    event_time=T0 + timedelta(seconds=moment),
                )
            )
    return out


# -- an in-memory store with the blob store's contract (for the pure core's tests) ------------
@dataclass
class MemoryStore:
    records: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    writes: int = 0
    _versions: Any = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, key: str) -> tuple[Mapping[str, Any] | None, str | None]:
        with self._lock:
            stored = self.records.get(key)
            if stored is None:
                return None, None
            return json.loads(json.dumps(stored[0])), stored[1]

    def write(self, key: str, document: Mapping[str, Any], etag: str | None) -> str:
        with self._lock:
            stored = self.records.get(key)
            if (stored is None and etag is not None) or (stored is not None and stored[1] != etag):
                raise StateConflict(key)
            new = f"v{next(self._versions)}"
            self.records[key] = (json.loads(json.dumps(document)), new)
            self.writes += 1
            return new


@dataclass
class Publisher:
    published: list[Envelope] = field(default_factory=list)
    fail_next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, envelope: Envelope) -> None:
        with self._lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                raise ConnectionError("Service Bus is down (injected)")
            self.published.append(envelope)

    @property
    def ids(self) -> list[str]:
        return [e.message_id for e in self.published]


class FixedClock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now
