"""Approve commands: validate, re-read IMDS, POST StartRequests, say how to settle.

No Service Bus here (the receiver is :mod:`sebridge.forwarder.approvals.receiver`); the
decision itself is :mod:`sebridge.forwarder.approvals.decision` (pure).

Settlement (command contract v1):
- invalid, expired, unknown event, VM not listed, IMDS 400 -> dead-letter with a reason;
- already Started, or already approved here              -> complete, with a log line;
- IMDS 200                                                 -> publish Approved, complete;
- IMDS 429/5xx/timeout (after a few quick retries, all within
  COMMAND_IMDS_BUDGET seconds)                              -> abandon: redelivered, and
  dead-lettered by the broker after the queue's max delivery count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from sebridge import lifecycle
from sebridge.contract import commands as contract
from sebridge.contract import tracecontext
from sebridge.contract.events import Envelope, Observer, Transition, event_message
from sebridge.forwarder.approvals.decision import Action, decide
from sebridge.forwarder.imds.client import READ_TIMEOUT, ImdsClient, ImdsError
from sebridge.imds import Document
from sebridge.retry import Backoff

log = logging.getLogger("forwarder.approvals")

IMDS_ATTEMPTS = 4  # re-reads per delivery at most, before abandoning it
# A command's time on IMDS is bounded so that it is settled well inside the session lock of
# the approvals queue (see sebridge.forwarder.approvals.receiver for the arithmetic).
COMMAND_IMDS_BUDGET = 25.0
MIN_REQUEST_SECONDS = 0.5  # not worth starting an IMDS request with less time left


class CommandSink(Protocol):
    """What the handler needs from the forwarder: who we are, and the outbox for Approved."""

    @property
    def observer(self) -> Observer: ...

    def enqueue(self, envelope: Envelope) -> None: ...

    def life_of(self, key: str) -> lifecycle.Life | None: ...


@dataclass(frozen=True)
class Outcome:
    action: str  # complete | dead-letter | abandon
    reason: str = ""
    description: str = ""


class CommandHandler:
    """Validates a command, re-reads IMDS, POSTs, and says how to settle. No Service Bus here."""

    def __init__(
        self,
        forwarder: CommandSink,
        imds: ImdsClient,
        *,
        require_listed: bool = False,
        budget: float = COMMAND_IMDS_BUDGET,
        read_timeout: float = READ_TIMEOUT,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.forwarder = forwarder
        self.imds = imds
        self.require_listed = require_listed
        self.budget = budget
        self.read_timeout = read_timeout
        self.sleep = sleep
        self.clock = clock
        self.approved: set[str] = set()

    def _request_timeout(self, deadline: float) -> float:
        """The deadline of the next IMDS request (all of it): READ_TIMEOUT, cut to the time
        left of the command's budget."""
        left = deadline - self.clock()
        if left < MIN_REQUEST_SECONDS:
            raise ImdsError(f"the command's {self.budget:g} s for IMDS are used up", transient=True)
        return min(self.read_timeout, left)

    def _document(self, deadline: float) -> Document:
        backoff = Backoff(0.5, 4.0)
        while True:
            try:
                return self.imds.get_document(read_timeout=self._request_timeout(deadline))
            except ImdsError as exc:
                delay = backoff.next_delay(at_least=min(exc.retry_after or 0.0, 4.0))
                left = deadline - self.clock()
                if backoff.failures >= IMDS_ATTEMPTS or left < delay + MIN_REQUEST_SECONDS:
                    raise
                log.warning(
                    "re-reading IMDS for a command failed (%s); retry in %.1f s", exc, delay
                )
                self.sleep(delay)

    def handle(
        self,
        body: bytes,
        message_id: str | None = None,
        trace: tracecontext.TraceContext | None = None,
    ) -> Outcome:
        """``trace``: the command message's ``traceparent`` (the event's trace), named in the
        log lines about it (``trace_id``, ``span_id``), the IMDS POST's above all."""
        now = datetime.now(UTC)
        traced = tracecontext.log_fields(trace)
        try:
            command = contract.parse_command(body, now)
        except contract.CommandError as exc:
            log.warning("invalid command %s: %s", message_id, exc, extra=traced)
            return Outcome("dead-letter", exc.reason, exc.description)
        deadline = self.clock() + self.budget
        try:
            document = self._document(deadline)
        except ImdsError as exc:
            log.warning(
                "command %s for %s: cannot check the event against IMDS: %s",
                message_id,
                command.event_id,
                exc,
                extra=traced,
            )
            return Outcome("abandon", "ImdsUnavailable", str(exc))
        observer = self.forwarder.observer
        decision = decide(
            command,
            document,
            vm_name=observer.vm_name,
            require_listed=self.require_listed,
            already_approved=command.event_id in self.approved,
        )
        if decision.action is Action.DEAD_LETTER:
            log.warning(
                "command %s for %s dead-lettered: %s",
                message_id,
                command.event_id,
                decision.description,
                extra=traced,
            )
            return Outcome("dead-letter", decision.reason, decision.description)
        if decision.action is Action.COMPLETE:
            log.info(
                "command %s for %s: %s",
                message_id,
                command.event_id,
                decision.description,
                extra=traced,
            )
            return Outcome("complete", description=decision.description)
        event = decision.event
        assert event is not None
        try:
            # The EventId exactly as IMDS spells it.
            answer = self.imds.approve(event.event_id, read_timeout=self._request_timeout(deadline))
        except ImdsError as exc:
            log.warning(
                "command %s: approving %s failed: %s",
                message_id,
                event.event_id,
                exc,
                extra=traced,
            )
            return Outcome("abandon", "ImdsUnavailable", str(exc))
        if not answer.accepted:
            description = f"IMDS answered {answer.status}: {answer.body}"
            log.error(
                "command %s: IMDS refused the approval of %s: %s",
                message_id,
                event.event_id,
                description,
                extra=traced,
            )
            return Outcome("dead-letter", contract.IMDS_REJECTED, description)
        self.approved.add(command.event_id)
        _, approved_id = lifecycle.advance(
            self.forwarder.life_of(event.key), Transition.APPROVED.value, event
        )
        self.forwarder.enqueue(
            event_message(
                Transition.APPROVED,
                event,
                observer,
                document.incarnation,
                datetime.now(UTC),
                message_id=approved_id,
                approval={"requestedBy": command.requested_by, "reason": command.reason},
            )
        )
        log.info(
            "command %s: approved %s (%s) for %s: %s",
            message_id,
            event.event_id,
            event.event_type,
            command.requested_by,
            command.reason or "no reason given",
            extra=traced,
        )
        return Outcome("complete", description="approved")
