"""How the forwarder is doing, as one snapshot (for Heartbeats, and for a status command or a
metrics endpoint to read), and log lines that are written once per condition, not per retry."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sebridge.imds import Document, isoformat_utc


@dataclass(frozen=True)
class Health:
    last_successful_poll: datetime | None = None
    polls: int = 0
    poll_failures: int = 0  # in a row
    # The state file could not be saved since then: transitions since are held back (kept in
    # the outbox, unsent) until a save succeeds.
    state_save_failing_since: datetime | None = None
    outbox_write_failing_since: datetime | None = None
    publish_failures: int = 0  # in a row
    outbox_depth: int | None = None  # None: the outbox could not be read
    set_aside: int = 0  # messages kept in the outbox's aside table
    last_error: str | None = None
    # Since when the VM's identity (instance metadata) is unknown, so nothing can be sent (None:
    # known). Judged with the time by :func:`~sebridge.forwarder.observability.observations.
    # assess`: unhealthy past IDENTITY_UNKNOWN_LIMIT with messages waiting.
    identity_unknown_since: datetime | None = None

    @property
    def ok(self) -> bool:
        return (
            self.state_save_failing_since is None
            and self.outbox_write_failing_since is None
            and self.poll_failures == 0
            and self.publish_failures == 0
        )

    def heartbeat_health(self) -> dict[str, Any]:
        """What a Heartbeat carries: only what is wrong, while it lasts (empty when healthy)."""
        out: dict[str, Any] = {}
        if self.state_save_failing_since is not None:
            out["stateSaveFailing"] = True
            out["stateSaveFailingSince"] = isoformat_utc(self.state_save_failing_since)
        if self.outbox_write_failing_since is not None:
            out["outboxWriteFailing"] = True
            out["outboxWriteFailingSince"] = isoformat_utc(self.outbox_write_failing_since)
        if self.poll_failures:
            out["pollFailures"] = self.poll_failures
        if self.publish_failures:
            out["publishFailures"] = self.publish_failures
        if self.set_aside:
            out["setAside"] = self.set_aside
        if out and self.last_error:
            out["lastError"] = self.last_error[:500]
        return out


class ConditionLog:
    """Logs a condition when it starts and when it changes, not at every retry.

    ``report(text)`` logs ``text`` at ``level`` if it differs from what was last reported
    (DEBUG otherwise); ``clear(text)`` logs ``text`` at INFO once when a reported condition
    ends. With ``remind_every`` (seconds), a condition reported at ERROR that lasts is logged
    again at ERROR once every ``remind_every`` seconds (a reminder, not a flood)."""

    def __init__(
        self,
        logger: logging.Logger,
        level: int = logging.WARNING,
        *,
        remind_every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.level = level
        self.remind_every = remind_every
        self.clock = clock
        self.current: str | None = None
        self._logged_at = 0.0
        self._since = 0.0

    def report(self, text: str, level: int | None = None) -> bool:
        """True when the line was logged at ``level`` (this log's own unless given): the
        condition is new or changed, or a reminder of it was due."""
        level = self.level if level is None else level
        now = self.clock()
        if text == self.current:
            if (
                self.remind_every is not None
                and level >= logging.ERROR
                and now - self._logged_at >= self.remind_every
            ):
                self._logged_at = now
                self.logger.log(level, "%s (still, for %.0f s)", text, now - self._since)
                return True
            self.logger.debug("%s (still)", text)
            return False
        self.current = text
        self._logged_at = self._since = now
        self.logger.log(level, "%s", text)
        return True

    def clear(self, text: str) -> None:
        if self.current is not None:
            self.current = None
            self.logger.info("%s", text)


class OddValueLog:
    """Logs what reading a document normalised (``ScheduledEvent.warnings``), once per event
    and field while the event is in the documents, not at every poll: one odd IMDS value is
    said, and never floods the log."""

    DOCUMENT = ""  # the key of the document's own warnings (DocumentIncarnation)

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._said: dict[str, frozenset[str]] = {}

    def document(self, document: Document) -> int:
        """Log the document's new warnings; returns how many lines were logged."""
        logged = 0
        present: dict[str, frozenset[str]] = {}
        sources: list[tuple[str, str, tuple[str, ...]]] = [
            (self.DOCUMENT, "IMDS document", document.warnings)
        ]
        sources += [
            (event.key, f"IMDS event {event.event_id}", event.warnings) for event in document.events
        ]
        for key, what, warnings in sources:
            if not warnings:
                continue
            said = self._said.get(key, frozenset())
            for line in warnings:
                if line not in said:
                    self.logger.warning(
                        "%s: odd value normalised: %s", what, line, extra={"eventId": key or None}
                    )
                    logged += 1
            present[key] = said | frozenset(warnings)
        self._said = present
        return logged
