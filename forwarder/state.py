"""Durable forwarder state: the last known events, so restarts and reboots still diff correctly.

Written atomically (:func:`sebridge.forwarder.durable.atomic_write`: temp file in the same
directory, fsync, rename, fsync of the directory), so a crash or power loss leaves either the old
or the new state, never half of one. A missing file
is a first start. A damaged one (not JSON, too deep, too large, absurd values) is moved aside
with a warning and the forwarder starts fresh, as with a missing file: a restart loop under
``Restart=always`` can never come from the state file. Temp files left by interrupted saves are
removed at start, and at most :data:`KEEP_DAMAGED` damaged copies are kept.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sebridge.contract.events import ContractError, Observer
from sebridge.forwarder.durable import atomic_write
from sebridge.forwarder.imds.impact import Impact
from sebridge.imds import InvalidDocument, ScheduledEvent
from sebridge.lifecycle import Life
from sebridge.times import stored

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
STATE_VERSION = 1
MAX_LIVES = 1000  # EventIds remembered for their message ids, present ones and recent past ones
# Far above any real state (1,000 lives of at most 256 versions each is about 6 MB); a larger
# file is damaged, and reading it whole could exhaust the unit's memory.
MAX_STATE_BYTES = 32 * 1024 * 1024
MAX_SQLITE_INTEGER = 2**63 - 1
MAX_TRANSITIONS = 100  # the last transitions kept for `sebridge status` (across restarts)
MAX_SHOWN_ID = 200  # characters of an EventId kept with a transition (status shows it)
KEEP_DAMAGED = 3
_TEMP_PREFIX = f".{STATE_FILE}."
_DAMAGED_MARK = ".corrupt-"
# Errors that say the directory cannot be used at all (as opposed to full, for now).
UNUSABLE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ENOENT})


class StateDirUnusable(Exception):
    """The state directory cannot be used (read-only, no permission, not a directory)."""


@dataclass(frozen=True)
class RecentTransition:
    """One transition the forwarder derived, kept with the state so that ``sebridge status``
    shows the last ones whatever restarts came between."""

    event_ref: str  # the EventId as in session ids (sebridge.lifecycle.event_ref)
    event_id: str  # the EventId as IMDS gave it (at most MAX_SHOWN_ID characters)
    transition: str
    message_id: str
    at: datetime

    def to_data(self) -> dict[str, str]:
        return {
            "eventRef": self.event_ref,
            "eventId": self.event_id,
            "transition": self.transition,
            "messageId": self.message_id,
            "at": self.at.isoformat(),
        }

    @classmethod
    def from_data(cls, value: object) -> RecentTransition | None:
        """Tolerant: None for a record that is not readable (it is dropped, never damage)."""
        if not isinstance(value, dict):
            return None
        texts = [value.get(name) for name in ("eventRef", "eventId", "transition", "messageId")]
        at = stored(value.get("at"))
        if at is None or not all(isinstance(text, str) and 0 < len(text) <= 256 for text in texts):
            return None
        ref, event_id, transition, message_id = (str(text) for text in texts)
        return cls(ref, event_id, transition, message_id, at)


def recent_transitions(
    kept: tuple[RecentTransition, ...], added: list[RecentTransition]
) -> tuple[RecentTransition, ...]:
    """The last MAX_TRANSITIONS of ``kept`` followed by ``added``, oldest first."""
    return (kept + tuple(added))[-MAX_TRANSITIONS:] if added else kept


@dataclass
class ForwarderState:
    incarnation: int | None = None
    events: dict[str, ScheduledEvent] = field(default_factory=dict)
    outbox_seq: int = 0  # the highest outbox row whose transition this state accounts for
    # What is remembered of each EventId for its message ids (sebridge.lifecycle), including
    # events that ended, so that one coming back is told apart from its first appearance.
    lives: dict[str, Life] = field(default_factory=dict)
    # When the document these events come from was observed: the start of the observation gap
    # of an event that has vanished by the next observation (sebridge.forwarder.imds.diff).
    observed_at: datetime | None = None
    # Measured impact of the events still present (sebridge.forwarder.imds.impact), so that a
    # restart before their Completed keeps what was measured. Optional: an older forwarder
    # ignores it, and a record that is not readable is dropped, not taken as damage.
    impacts: dict[str, Impact] = field(default_factory=dict)
    # The VM's identity as instance metadata last gave it (vmId, resource id), so that a restart
    # while instance metadata fails judges this VM's events by it, not by the host name.
    # Optional: an older forwarder ignores it; an unreadable one reads as None.
    identity: Observer | None = None
    # The last transitions derived (at most MAX_TRANSITIONS, oldest first), for `sebridge
    # status`. Optional: an older forwarder ignores them; an older file has none.
    transitions: tuple[RecentTransition, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "incarnation": self.incarnation,
            "outboxSeq": self.outbox_seq,
            "observedAt": self.observed_at.isoformat() if self.observed_at else None,
            "events": [event.to_imds() for event in self.events.values()],
            "lives": {key: life.to_json() for key, life in self.lives.items()},
            "impacts": {key: impact.to_data() for key, impact in self.impacts.items()},
            "identity": self.identity.to_data() if self.identity is not None else None,
            "transitions": [item.to_data() for item in self.transitions],
            "savedAt": datetime.now(UTC).isoformat(),
        }

    @classmethod
    def from_json(cls, obj: object) -> ForwarderState:
        """Strict: anything unexpected raises ValueError (the caller moves the file aside)."""
        if not isinstance(obj, dict) or obj.get("version") != STATE_VERSION:
            raise ValueError("not a version 1 state document")
        incarnation = obj.get("incarnation")
        if incarnation is not None and (
            isinstance(incarnation, bool) or not isinstance(incarnation, int)
        ):
            raise ValueError("incarnation is not an integer")
        raw_events = obj.get("events")
        if not isinstance(raw_events, list):
            raise ValueError("events is not a list")
        outbox_seq = obj.get("outboxSeq", 0)
        if (
            isinstance(outbox_seq, bool)
            or not isinstance(outbox_seq, int)
            or not 0 <= outbox_seq <= MAX_SQLITE_INTEGER
        ):
            raise ValueError("outboxSeq is not an outbox row number")
        events = [ScheduledEvent.from_imds(raw, strict=False) for raw in raw_events]
        raw_lives = obj.get("lives", {})
        if not isinstance(raw_lives, dict) or len(raw_lives) > 10 * MAX_LIVES:
            raise ValueError("lives is not an object of the expected size")
        lives = {str(key): Life.from_json(life) for key, life in raw_lives.items()}
        keys = {e.key for e in events}
        raw_impacts = obj.get("impacts")
        impacts = {
            key: impact
            for key, value in (raw_impacts.items() if isinstance(raw_impacts, dict) else ())
            if key in keys and (impact := Impact.from_data(value)) is not None
        }
        return cls(
            incarnation=incarnation,
            events={e.key: e for e in events},
            outbox_seq=outbox_seq,
            lives=lives,
            observed_at=stored(obj.get("observedAt")),
            impacts=impacts,
            identity=_identity(obj.get("identity")),
            transitions=_transitions(obj.get("transitions")),
        )


def _identity(value: object) -> Observer | None:
    """The identity saved by :meth:`ForwarderState.to_json` (only a resolved one is); None if
    absent or unreadable."""
    if not isinstance(value, dict):
        return None
    try:
        observer = Observer.from_data(value)
    except ContractError:
        return None
    return observer if is_identity(observer) else None  # a name alone is no identity


def _transitions(value: object) -> tuple[RecentTransition, ...]:
    """The transitions saved by :meth:`ForwarderState.to_json`; none if absent (a state file
    from before they were kept) or not a list; an unreadable record is left out."""
    if not isinstance(value, list):
        return ()
    return tuple(
        item
        for raw in value[-MAX_TRANSITIONS:]
        if (item := RecentTransition.from_data(raw)) is not None
    )


def is_identity(observer: Observer) -> bool:
    """Whether ``observer`` is the VM's identity as instance metadata gives it: it names both a
    vmId and a resource id (the workflows' scope check needs them), as opposed to a fallback
    built from the host name or ``--vm-name`` alone, or an answer that named the VM only. The
    one check wherever an identity is accepted: the lookup, the identity saved by an earlier
    run, the local actions' journal, and rebinding a message to it."""
    return bool(observer.vm_id.strip() and observer.resource_id.strip())


def bounded_lives(lives: dict[str, Life], present: set[str]) -> dict[str, Life]:
    """At most MAX_LIVES: every present event's, then the most recently touched past ones."""
    if len(lives) <= MAX_LIVES:
        return lives
    past = [key for key in lives if key not in present]
    keep = set(present) | set(past[-max(0, MAX_LIVES - len(present)) :])
    return {key: life for key, life in lives.items() if key in keep}


def ensure_dir(path: Path) -> None:
    """Create the state directory if needed and prove it writable, or raise StateDirUnusable.

    A full file system is not unusable: the forwarder runs and retries its saves (they are
    reported in its Heartbeats until one succeeds)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            log.warning("state directory %s is full (%s): saves are retried", path, exc.strerror)
            return
        raise StateDirUnusable(f"{exc.strerror or exc} ({path})") from exc


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE

    def clean_leftovers(self) -> int:
        """Remove temp files of saves that a crash interrupted; returns how many."""
        removed = 0
        try:
            leftovers = [
                p
                for p in self.directory.iterdir()
                if p.name.startswith(_TEMP_PREFIX) and p.name.endswith(".tmp")
            ]
        except OSError:
            return 0
        for leftover in leftovers:
            try:
                leftover.unlink()
                removed += 1
            except OSError as exc:
                log.warning("cannot remove %s left by an interrupted save: %s", leftover, exc)
        if removed:
            log.info("removed %d temp file(s) left by interrupted saves", removed)
        return removed

    def load(self) -> ForwarderState:
        self.clean_leftovers()
        try:
            with self.path.open("rb") as handle:
                text = handle.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            log.info("no state at %s: first start", self.path)
            return ForwarderState()
        except IsADirectoryError as exc:
            return self._damaged(exc)
        except OSError as exc:
            if exc.errno in UNUSABLE_ERRNOS:
                raise StateDirUnusable(f"cannot read {self.path}: {exc.strerror}") from exc
            raise
        try:
            if len(text) > MAX_STATE_BYTES:
                raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
            return ForwarderState.from_json(json.loads(text))
        except (
            ValueError,
            TypeError,
            KeyError,
            InvalidDocument,
            UnicodeDecodeError,
            OverflowError,
            RecursionError,
        ) as exc:
            return self._damaged(exc)

    def _damaged(self, exc: BaseException) -> ForwarderState:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        aside = self.path.with_name(f"{STATE_FILE}{_DAMAGED_MARK}{stamp}")
        try:
            os.replace(self.path, aside)
        except OSError as move_error:
            if move_error.errno in UNUSABLE_ERRNOS:
                raise StateDirUnusable(f"cannot move {self.path} aside: {move_error}") from exc
            aside = self.path
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        log.warning(
            "state file %s is unreadable (%s); kept as %s, starting fresh: events that "
            "vanished while the forwarder was down cannot be reported",
            self.path,
            reason,
            aside,
        )
        self._prune_damaged()
        return ForwarderState()

    def _prune_damaged(self) -> None:
        copies = sorted(self.directory.glob(f"{STATE_FILE}{_DAMAGED_MARK}*"))
        for old in copies[:-KEEP_DAMAGED]:
            old.unlink(missing_ok=True)

    def save(self, state: ForwarderState) -> None:
        body = json.dumps(state.to_json(), separators=(",", ":")).encode("utf-8")
        atomic_write(self.path, body)
