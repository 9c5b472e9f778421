"""The return path: approve commands from the ``approvals`` queue -> IMDS StartRequests.

The forwarder receives as a session receiver whose session id is its VM name, so it only ever
sees commands addressed to this VM. It runs in its own thread with its own IMDS session, so a
blocked or reconnecting receiver never delays polling and a slow IMDS never stalls polling.

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
from typing import TYPE_CHECKING, Any, Protocol

from forwarder.backoff import Backoff
from forwarder.commands import Action, decide
from forwarder.imds_client import READ_TIMEOUT, ImdsClient, ImdsError
from forwarder.publisher import service_bus_client
from sebridge.contract import commands as contract
from sebridge.contract.events import Envelope, Observer, Transition, event_message
from sebridge.imds import Document

if TYPE_CHECKING:
    from forwarder.config import ForwarderConfig
    from forwarder.service import Forwarder

log = logging.getLogger("forwarder.approvals")

RECEIVE_WAIT = 5.0  # seconds a receive call blocks when the session is empty
# How long one socket read of the receiver waits. The SDK's default, 0.2 s, wakes an idle
# receiver 5 times a second to run a pass of its AMQP loop: the largest share of the idle
# forwarder's CPU (benchmarks/forwarder_poll.py). A read returns as soon as a frame arrives, so
# a longer wait delays no command; it only lets receive_messages overrun RECEIVE_WAIT by as much.
RECEIVER_SOCKET_TIMEOUT = 1.0
IMDS_ATTEMPTS = 4  # re-reads per delivery at most, before abandoning it
# Why a command's time on IMDS is bounded: this receiver holds the session lock on the
# approvals queue (LockDuration PT1M, infra/servicebus-emulator/Config.json) and can renew it
# only between commands, so every command must be settled well inside one lock period.
# The lock is renewed once it is SESSION_RENEW_EVERY old (checked before each command, after
# each settlement and after each receive); a command then spends at most COMMAND_IMDS_BUDGET
# on IMDS (re-reads, the pauses between them and the POST; each request's read timeout is cut
# to what is left, its connect timeout can add up to 2 s) and is abandoned when that is used
# up. So a lock is at most 15 + 25 + 2 = 42 s old when the command is settled, and at most
# 15 + 30 = 45 s old after the pause that follows an abandon (Backoff cap 30 s): both < 60 s.
# The slow first call of IMDS (up to 2 minutes while the feature is enabled) is the poller's
# to wait out; a command never uses that timeout and is simply redelivered later.
SESSION_RENEW_EVERY = 15.0
COMMAND_IMDS_BUDGET = 25.0
ABANDON_PAUSE_MAX = 30.0
MIN_REQUEST_SECONDS = 0.5  # not worth starting an IMDS request with less time left


class CommandSink(Protocol):
    """What the handler needs from the forwarder: who we are, and the outbox for Approved."""

    @property
    def observer(self) -> Observer: ...

    def enqueue(self, envelope: Envelope) -> None: ...


@dataclass(frozen=True)
class Outcome:
    action: str  # complete | dead-letter | abandon
    reason: str = ""
    description: str = ""


def message_body(message: Any) -> bytes:
    """The body of a received message as bytes, whatever AMQP body type it came as."""
    body = message.body
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(part if isinstance(part, bytes) else bytes(part) for part in body)
    except TypeError:
        return repr(body).encode("utf-8")


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
        sleep: Callable[[float], None] = time.sleep,
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
        """The read timeout for the next IMDS request: READ_TIMEOUT, cut to the time left."""
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

    def handle(self, body: bytes, message_id: str | None = None) -> Outcome:
        now = datetime.now(UTC)
        try:
            command = contract.parse_command(body, now)
        except contract.CommandError as exc:
            log.warning("invalid command %s: %s", message_id, exc)
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
            )
            return Outcome("dead-letter", decision.reason, decision.description)
        if decision.action is Action.COMPLETE:
            log.info("command %s for %s: %s", message_id, command.event_id, decision.description)
            return Outcome("complete", description=decision.description)
        event = decision.event
        assert event is not None
        try:
            # The EventId exactly as IMDS spells it.
            answer = self.imds.approve(event.event_id, read_timeout=self._request_timeout(deadline))
        except ImdsError as exc:
            log.warning("command %s: approving %s failed: %s", message_id, event.event_id, exc)
            return Outcome("abandon", "ImdsUnavailable", str(exc))
        if not answer.accepted:
            description = f"IMDS answered {answer.status}: {answer.body}"
            log.error(
                "command %s: IMDS refused the approval of %s: %s",
                message_id,
                event.event_id,
                description,
            )
            return Outcome("dead-letter", contract.IMDS_REJECTED, description)
        self.approved.add(command.event_id)
        self.forwarder.enqueue(
            event_message(
                Transition.APPROVED,
                event,
                observer,
                document.incarnation,
                datetime.now(UTC),
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
        )
        return Outcome("complete", description="approved")


def settle(receiver: Any, message: Any, outcome: Outcome) -> None:
    if outcome.action == "complete":
        receiver.complete_message(message)
    elif outcome.action == "dead-letter":
        receiver.dead_letter_message(
            message, reason=outcome.reason, error_description=outcome.description[:1024]
        )
    else:
        receiver.abandon_message(message)


class SessionLock:
    """Renews a session receiver's lock once it is SESSION_RENEW_EVERY old (see above)."""

    def __init__(self, receiver: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.receiver = receiver
        self.clock = clock
        self.renewed = clock()

    def keep(self) -> None:
        if self.clock() - self.renewed > SESSION_RENEW_EVERY:
            self.receiver.session.renew_lock()
            self.renewed = self.clock()


def approvals_worker(forwarder: Forwarder, config: ForwarderConfig) -> Callable[[], None]:
    """The receiver thread's body: reconnects with backoff until the forwarder stops."""
    handler = CommandHandler(
        forwarder,
        # Its own client: every request passes the command's own read timeout (see above).
        ImdsClient(config.imds_endpoint, api_version=config.api_version),
        require_listed=config.require_listed,
    )

    def approvals() -> None:
        from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

        backoff = Backoff(1.0, ABANDON_PAUSE_MAX)
        stop = forwarder.stop_event
        while not stop.is_set():
            session_id = forwarder.observer.vm_name
            client = None
            try:
                client = service_bus_client(
                    namespace=config.namespace,
                    connection_string=config.connection_string,
                    client_id=config.client_id,
                )
                with client.get_queue_receiver(
                    config.reply_queue,
                    session_id=session_id,
                    max_wait_time=RECEIVE_WAIT,
                    socket_timeout=RECEIVER_SOCKET_TIMEOUT,
                ) as receiver:
                    log.info("receiving commands on %s, session %s", config.reply_queue, session_id)
                    lock = SessionLock(receiver)
                    while not stop.is_set() and forwarder.observer.vm_name == session_id:
                        # One at a time: asked for more, the SDK waits ~200 ms for a batch
                        # to fill after the first message, and approvals are latency-bound.
                        for message in receiver.receive_messages(
                            max_message_count=1, max_wait_time=RECEIVE_WAIT
                        ):
                            lock.keep()
                            outcome = handler.handle(message_body(message), message.message_id)
                            settle(receiver, message, outcome)
                            lock.keep()
                            if outcome.action == "abandon":
                                stop.wait(backoff.next_delay())
                            else:
                                backoff.reset()
                        lock.keep()
            except (SessionCannotBeLockedError, OperationTimeoutError) as exc:
                delay = backoff.next_delay()
                log.info("session %s not available (%s); retry in %.1f s", session_id, exc, delay)
                stop.wait(delay)
            except Exception as exc:  # noqa: BLE001 - reconnect on anything, never die
                delay = backoff.next_delay()
                log.warning(
                    "approvals receiver failed (%s: %s); reconnecting in %.1f s",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                stop.wait(delay)
            finally:
                if client is not None:
                    try:
                        client.close()
                    except Exception as exc:  # noqa: BLE001
                        log.debug("closing the approvals client failed: %s", exc)

    return approvals
