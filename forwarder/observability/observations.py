"""What the forwarder has done lately, for ``/healthz``, ``sebridge status`` and systemd.

:class:`Observations` is told of each poll tick and each batch of transitions (it is a
:class:`~sebridge.forwarder.ports.LoopListener`), of each IMDS read and each publish attempt
(through :mod:`sebridge.forwarder.observability.observed`) and of each settled approval
command. It keeps a small, bounded record (no per-poll history) that
:meth:`Observations.snapshot` turns into the document ``status.json`` holds, and
:func:`assess` is the one rule that says whether a forwarder is healthy, for the live endpoint
and the status command alike.

Healthy means all of (docs/monitoring.md, "Health"):

- a poll succeeded within the last :func:`stale_after` seconds (30 s, or 3 poll intervals if
  that is longer): IMDS answers and the loop turns;
- the state file can be saved and the outbox written (else transitions are held back);
- sending to Service Bus has not been failing for longer than :data:`SEND_FAILING_LIMIT`
  (5 minutes: a short broker outage is absorbed by the outbox and is not worth a page).

Set-aside messages are reported but do not make a forwarder unhealthy: they are kept for an
operator, and delivery of everything else goes on.
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sebridge import __version__
from sebridge.contract.events import Envelope
from sebridge.forwarder.observability.health import Health
from sebridge.forwarder.ports import ImdsError
from sebridge.imds import isoformat_utc
from sebridge.times import stored

STATUS_VERSION = 1
STALE_AFTER = 30.0
SEND_FAILING_LIMIT = 300.0
MAX_EVENTS = 100  # events whose last transition is remembered (the most recent)
MAX_APPROVALS = 50  # settled approval commands remembered (the most recent)
MAX_ERROR = 300

# The fixed label values of the metrics (bounded label sets).
POLL_RESULTS = ("ok", "throttled", "unavailable", "refused")
PUBLISH_RESULTS = ("ok", "refused", "failed")
COMMAND_OUTCOMES = ("complete", "dead-letter", "abandon")

_GUID = re.compile(r"^[0-9A-Fa-f]{8}-(?:[0-9A-Fa-f]{4}-){3}[0-9A-Fa-f]{12}$")


def poll_result(exc: ImdsError | None) -> str:
    """One of :data:`POLL_RESULTS` for an IMDS read that ended with ``exc`` (None: ok)."""
    if exc is None:
        return "ok"
    if exc.retry_after is not None or "(429)" in str(exc):
        return "throttled"
    return "unavailable" if exc.transient else "refused"


def command_event_id(message_id: str | None) -> str | None:
    """The EventId of an approve command's message id (``approve:<EventId>``), if it is one."""
    if message_id and message_id.startswith("approve:"):
        candidate = message_id[len("approve:") :]
        if _GUID.match(candidate):
            return candidate.lower()
    return None


def stale_after(poll_interval: float) -> float:
    return max(STALE_AFTER, 3 * poll_interval)


def _iso(moment: datetime | None) -> str | None:
    return isoformat_utc(moment) if moment is not None else None


IDENTITY_UNKNOWN_LIMIT = 300.0  # seconds the VM's identity may stay unknown with messages waiting


def assess(status: Mapping[str, Any], now: datetime, *, slack: float = 0.0) -> list[str]:
    """Why a forwarder whose status document is ``status`` is not healthy at ``now`` (empty:
    healthy). ``slack`` widens the poll age allowed (the status file is written every few
    seconds, so a reader of it sees a poll time up to that much older)."""
    reasons: list[str] = []
    interval = status.get("pollInterval")
    limit = stale_after(interval if isinstance(interval, int | float) else 1.0) + slack
    last_poll = stored(status.get("lastSuccessfulPoll"))
    if last_poll is None:
        reasons.append("no successful poll of IMDS yet")
    else:
        age = (now - last_poll).total_seconds()
        if age > limit:
            reasons.append(f"last successful poll {age:.0f} s ago (limit {limit:.0f} s)")
    for key, what in (
        ("stateSaveFailingSince", "the state file cannot be saved"),
        ("outboxWriteFailingSince", "the outbox cannot be written"),
    ):
        since = stored(status.get(key))
        if since is not None:
            reasons.append(f"{what} since {isoformat_utc(since)}")
    unknown = stored(status.get("identityUnknownSince"))
    depth = status.get("outboxDepth")
    if (
        unknown is not None
        and (now - unknown).total_seconds() > IDENTITY_UNKNOWN_LIMIT
        and isinstance(depth, int)
        and depth > 0
    ):
        reasons.append(
            f"the VM's identity (instance metadata) unknown since {isoformat_utc(unknown)}: "
            f"{depth} message(s) wait to be sent"
        )
    failing = stored(status.get("publishFailingSince"))
    if failing is not None and (now - failing).total_seconds() > SEND_FAILING_LIMIT:
        reasons.append(f"sending to Service Bus failing since {isoformat_utc(failing)}")
    return reasons


class Observations:
    """The bounded record behind ``/healthz`` and ``status.json`` (thread-safe; the poller,
    the sender and the approvals receiver all report here)."""

    def __init__(
        self,
        poll_interval: float = 1.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.poll_interval = poll_interval
        self.now = now
        self.started_at = now()
        self._lock = threading.Lock()
        self.health = Health()
        self.last_poll_at: datetime | None = None
        self.last_poll_result: str | None = None
        self.last_successful_send: datetime | None = None
        self.publish_failing_since: datetime | None = None
        self._events: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._approvals: deque[dict[str, Any]] = deque(maxlen=MAX_APPROVALS)
        self.changed = threading.Event()  # something worth writing down at once happened

    # -- LoopListener (the poller's thread) -------------------------------------------------
    def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
        at = _iso(self.now())
        with self._lock:
            for envelope in envelopes:
                key = envelope.session_id or ""
                self._events.pop(key, None)
                self._events[key] = {
                    "eventId": key,
                    "transition": envelope.subject,
                    "messageId": envelope.message_id,
                    "at": at,
                }
            while len(self._events) > MAX_EVENTS:
                self._events.popitem(last=False)
        self.changed.set()

    def polled(self, health: Health) -> None:
        was_ok = self.health.ok
        self.health = health
        if health.ok != was_ok:
            self.changed.set()

    # -- the wrappers of sebridge.forwarder.observability.observed -----------------------
    def imds_read(self, seconds: float, result: str) -> None:
        self.last_poll_at = self.now()
        self.last_poll_result = result

    def publish_attempt(self, result: str, count: int) -> None:
        at = self.now()
        if result == "ok":
            self.last_successful_send = at
            if self.publish_failing_since is not None:
                self.publish_failing_since = None
                self.changed.set()
        elif result == "failed" and self.publish_failing_since is None:
            self.publish_failing_since = at
            self.changed.set()

    # -- the approvals receiver's thread ----------------------------------------------------
    def command_settled(self, message_id: str | None, action: str, reason: str) -> None:
        with self._lock:
            self._approvals.append(
                {
                    "eventId": command_event_id(message_id),
                    "outcome": action,
                    "reason": reason[:MAX_ERROR] or None,
                    "at": _iso(self.now()),
                }
            )
        self.changed.set()

    # -- readers ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The status document (``status.json``; ``/healthz`` assesses the same)."""
        health = self.health
        with self._lock:
            events = list(self._events.values())
            approvals = list(self._approvals)
        return {
            "version": STATUS_VERSION,
            "forwarderVersion": __version__,
            "pid": os.getpid(),
            "startedAt": _iso(self.started_at),
            "writtenAt": _iso(self.now()),
            "pollInterval": self.poll_interval,
            "lastPoll": {
                "at": _iso(self.last_poll_at),
                "result": self.last_poll_result,
            },
            "lastSuccessfulPoll": _iso(health.last_successful_poll),
            "polls": health.polls,
            "pollFailures": health.poll_failures,
            "lastError": (health.last_error or "")[:MAX_ERROR] or None,
            "lastSuccessfulSend": _iso(self.last_successful_send),
            "publishFailingSince": _iso(self.publish_failing_since),
            "publishFailures": health.publish_failures,
            "stateSaveFailingSince": _iso(health.state_save_failing_since),
            "outboxWriteFailingSince": _iso(health.outbox_write_failing_since),
            "outboxDepth": health.outbox_depth,
            "identityUnknownSince": _iso(health.identity_unknown_since),
            "setAside": health.set_aside,
            "lastTransitions": events,
            "approvals": approvals,
        }

    def assess(self) -> list[str]:
        """Why this forwarder is not healthy now (empty: healthy)."""
        return assess(self.snapshot(), self.now())
