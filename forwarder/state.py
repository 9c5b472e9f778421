"""Durable forwarder state: the last known events, so restarts and reboots still diff correctly.

Written atomically (temp file in the same directory, fsync, rename, fsync of the directory), so a
crash or power loss leaves either the old or the new state, never half of one. A missing file
is a first start; an unreadable one is moved aside with a warning and the forwarder starts fresh.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sebridge.imds import InvalidDocument, ScheduledEvent
from sebridge.lifecycle import Life

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
STATE_VERSION = 1
MAX_LIVES = 1000  # EventIds remembered for their message ids, present ones and recent past ones


@dataclass
class ForwarderState:
    incarnation: int | None = None
    events: dict[str, ScheduledEvent] = field(default_factory=dict)
    outbox_seq: int = 0  # the highest outbox row whose transition this state accounts for
    # What is remembered of each EventId for its message ids (sebridge.lifecycle), including
    # events that ended, so that one coming back is told apart from its first appearance.
    lives: dict[str, Life] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "incarnation": self.incarnation,
            "outboxSeq": self.outbox_seq,
            "events": [event.to_imds() for event in self.events.values()],
            "lives": {key: life.to_json() for key, life in self.lives.items()},
            "savedAt": datetime.now(UTC).isoformat(),
        }

    @classmethod
    def from_json(cls, obj: object) -> ForwarderState:
        if not isinstance(obj, dict) or obj.get("version") != STATE_VERSION:
            raise ValueError("not a version 1 state document")
        incarnation = obj.get("incarnation")
        if incarnation is not None and not isinstance(incarnation, int):
            raise ValueError("incarnation is not an integer")
        raw_events = obj.get("events")
        if not isinstance(raw_events, list):
            raise ValueError("events is not a list")
        outbox_seq = obj.get("outboxSeq", 0)
        if not isinstance(outbox_seq, int) or isinstance(outbox_seq, bool) or outbox_seq < 0:
            raise ValueError("outboxSeq is not a non-negative integer")
        events = [ScheduledEvent.from_imds(raw) for raw in raw_events]
        raw_lives = obj.get("lives", {})
        if not isinstance(raw_lives, dict):
            raise ValueError("lives is not an object")
        lives = {str(key): Life.from_json(life) for key, life in raw_lives.items()}
        return cls(
            incarnation=incarnation,
            events={e.key: e for e in events},
            outbox_seq=outbox_seq,
            lives=lives,
        )


def bounded_lives(lives: dict[str, Life], present: set[str]) -> dict[str, Life]:
    """At most MAX_LIVES: every present event's, then the most recently touched past ones."""
    if len(lives) <= MAX_LIVES:
        return lives
    past = [key for key in lives if key not in present]
    keep = set(present) | set(past[-max(0, MAX_LIVES - len(present)) :])
    return {key: life for key, life in lives.items() if key in keep}


def ensure_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE

    def load(self) -> ForwarderState:
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            log.info("no state at %s: first start", self.path)
            return ForwarderState()
        try:
            return ForwarderState.from_json(json.loads(text))
        except (ValueError, InvalidDocument, UnicodeDecodeError) as exc:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            aside = self.path.with_name(f"{STATE_FILE}.corrupt-{stamp}")
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = self.path
            log.warning(
                "state file %s is unreadable (%s); kept as %s, starting fresh: events that "
                "vanished while the forwarder was down cannot be reported",
                self.path,
                exc,
                aside,
            )
            return ForwarderState()

    def save(self, state: ForwarderState) -> None:
        body = json.dumps(state.to_json(), separators=(",", ":")).encode("utf-8")
        atomic_write(self.path, body)
