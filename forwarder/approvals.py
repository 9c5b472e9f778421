"""The return path: approve commands from the ``approvals`` queue -> IMDS StartRequests.

The forwarder receives as a session receiver whose session id is its VM name, so it only ever
sees commands addressed to this VM. It runs in its own thread with its own IMDS session, so a
blocked or reconnecting receiver never delays polling and a slow IMDS never stalls polling.

Settlement (command contract v1):
- invalid, expired, unknown event, VM not listed, IMDS 400 -> dead-letter with a reason;
- already Started, or already approved here              -> complete, with a log line;
- IMDS 200                                                 -> publish Approved, complete;
- IMDS 429/5xx/timeout (after a few quick retries)         -> abandon: redelivered, and
  dead-lettered by the broker after the queue's max delivery count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from forwarder.backoff import Backoff
from forwarder.commands import Action, decide
from forwarder.imds_client import ImdsClient, ImdsError
from forwarder.publisher import service_bus_client
from sebridge.contract import commands as contract
from sebridge.contract.events import Transition, event_message
from sebridge.imds import Document

if TYPE_CHECKING:
    from forwarder.config import ForwarderConfig
    from forwarder.service import Forwarder

log = logging.getLogger("forwarder.approvals")

RECEIVE_WAIT = 5.0  # seconds a receive call blocks when the session is empty
SESSION_RENEW_EVERY = 20.0  # well inside the queue's 1-minute lock duration
IMDS_ATTEMPTS = 4  # per delivery, before abandoning it


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
        forwarder: Forwarder,
        imds: ImdsClient,
        *,
        require_listed: bool = False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.forwarder = forwarder
        self.imds = imds
        self.require_listed = require_listed
        self.sleep = sleep
        self.approved: set[str] = set()

    def _document(self) -> Document:
        backoff = Backoff(0.5, 4.0)
        for attempt in range(1, IMDS_ATTEMPTS + 1):
            try:
                return self.imds.get_document()
            except ImdsError as exc:
                if attempt == IMDS_ATTEMPTS:
                    raise
                delay = backoff.next_delay(at_least=min(exc.retry_after or 0.0, 4.0))
                log.warning(
                    "re-reading IMDS for a command failed (%s); retry in %.1f s", exc, delay
                )
                self.sleep(delay)
        raise AssertionError("unreachable")

    def handle(self, body: bytes, message_id: str | None = None) -> Outcome:
        now = datetime.now(UTC)
        try:
            command = contract.parse_command(body, now)
        except contract.CommandError as exc:
            log.warning("invalid command %s: %s", message_id, exc)
            return Outcome("dead-letter", exc.reason, exc.description)
        try:
            document = self._document()
        except ImdsError as exc:
            log.warning("cannot check event %s against IMDS: %s", command.event_id, exc)
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
            log.warning("command for %s dead-lettered: %s", command.event_id, decision.description)
            return Outcome("dead-letter", decision.reason, decision.description)
        if decision.action is Action.COMPLETE:
            log.info("command for %s: %s", command.event_id, decision.description)
            return Outcome("complete", description=decision.description)
        event = decision.event
        assert event is not None
        try:
            answer = self.imds.approve(event.event_id)  # the EventId exactly as IMDS spells it
        except ImdsError as exc:
            log.warning("approving %s failed: %s", event.event_id, exc)
            return Outcome("abandon", "ImdsUnavailable", str(exc))
        if not answer.accepted:
            description = f"IMDS answered {answer.status}: {answer.body}"
            log.error("IMDS refused the approval of %s: %s", event.event_id, description)
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
            "approved %s (%s) for %s: %s",
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


def approvals_worker(forwarder: Forwarder, config: ForwarderConfig) -> Callable[[], None]:
    """The receiver thread's body: reconnects with backoff until the forwarder stops."""
    handler = CommandHandler(
        forwarder,
        ImdsClient(config.imds_endpoint, api_version=config.api_version),
        require_listed=config.require_listed,
    )

    def approvals() -> None:
        from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

        backoff = Backoff(1.0, 30.0)
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
                    config.reply_queue, session_id=session_id, max_wait_time=RECEIVE_WAIT
                ) as receiver:
                    log.info("receiving commands on %s, session %s", config.reply_queue, session_id)
                    renewed = time.monotonic()
                    while not stop.is_set() and forwarder.observer.vm_name == session_id:
                        # One at a time: asked for more, the SDK waits ~200 ms for a batch
                        # to fill after the first message, and approvals are latency-bound.
                        for message in receiver.receive_messages(
                            max_message_count=1, max_wait_time=RECEIVE_WAIT
                        ):
                            outcome = handler.handle(message_body(message), message.message_id)
                            settle(receiver, message, outcome)
                            if outcome.action == "abandon":
                                stop.wait(backoff.next_delay())
                            else:
                                backoff.reset()
                        if time.monotonic() - renewed > SESSION_RENEW_EVERY:
                            receiver.session.renew_lock()
                            renewed = time.monotonic()
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
