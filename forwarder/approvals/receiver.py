"""The return path: the receiver of the ``approvals`` queue (the Service Bus adapter).

The forwarder receives as a session receiver whose session id is its VM name, so it only ever
sees commands addressed to this VM. It runs in its own thread with its own IMDS session, so a
blocked or reconnecting receiver never delays polling and a slow IMDS never stalls polling.
What a command leads to is :class:`sebridge.forwarder.approvals.handler.CommandHandler`'s.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sebridge import servicebus
from sebridge.contract import tracecontext
from sebridge.forwarder.approvals.handler import CommandHandler, Outcome
from sebridge.forwarder.imds.client import ImdsClient
from sebridge.forwarder.imds.ratelimit import RequestLimit
from sebridge.forwarder.ports import StoppedWhileParked
from sebridge.retry import Backoff

if TYPE_CHECKING:
    from sebridge.forwarder.config import ForwarderConfig
    from sebridge.forwarder.service import Forwarder

log = logging.getLogger("forwarder.approvals")

RECEIVE_WAIT = 10.0  # seconds a receive call blocks when the session is empty
# How long one socket read of the receiver waits. The SDK's default, 0.2 s, wakes an idle
# receiver 5 times a second to run a pass of its AMQP loop: the largest share of the idle
# forwarder's CPU (benchmarks/forwarder_poll.py). A read returns as soon as a frame arrives, so
# a longer wait delays no command; it only lets receive_messages overrun RECEIVE_WAIT by as much
# (an idle receive then takes up to 20 s: the lock is still checked before every command and
# stays well inside its 60 s, see SESSION_RENEW_EVERY; a stop does not wait for it, see
# Forwarder.run; a VM renamed under the forwarder moves to its new session that much later).
# Measured as on a VM (managed identity, TLS): 1.71 ms of CPU per idle poll with 1 s, 1.64 ms
# with 2 s, 1.54 ms with 5 s (0.53x, 0.51x and 0.47x the reference listener's 3.2 ms); per
# thread (schedstat over 60 s) the receiver took 0.25 ms a second with 5 s and 0.15 with 10 s,
# each idle receive call costing it about 1.3 ms of the SDK's work.
RECEIVER_SOCKET_TIMEOUT = RECEIVE_WAIT
# Why prefetch 1 and keep_alive 0: with prefetch 0 the SDK (azure-servicebus 7.15, pyamqp)
# starts a keep-alive thread that every 5 s calls listen(wait=socket_timeout) on the receiver's
# connection, and a read holds the transport's socket lock for its whole wait. A command that
# arrives during that second is read by the keep-alive thread, and this thread, which was
# waiting for the lock, then blocks in its own read for up to RECEIVER_SOCKET_TIMEOUT before it
# looks at the message already buffered; flows, settlements and lock renewals wait for the lock
# the same way. So ~1 command in 5 took ~1 s longer (benchmarks/e2e_latency.py, cmd-sent ->
# cmd-recv). The keep-alive thread is only started for prefetch 0 (interval 5 s) or when
# keep_alive is set; this loop always listens, so it needs none. Prefetch 1 changes nothing
# else that matters here: the session is this VM's alone and its lock covers its messages.
RECEIVER_PREFETCH = 1
# Why a command's time on IMDS is bounded: this receiver holds the session lock on the
# approvals queue (LockDuration PT1M, infra/servicebus-emulator/Config.json) and can renew it
# only between commands, so every command must be settled well inside one lock period.
# The lock is renewed once it is SESSION_RENEW_EVERY old (checked before each command, after
# each settlement and after each receive); a command then spends at most COMMAND_IMDS_BUDGET
# on IMDS (waiting for a request slot of the shared 5/s limit, re-reads, the pauses between
# them and the POST; each request's overall deadline, connect and a trickling body included,
# is cut to what is left) and is abandoned when that is used up. So a lock is at most
# 15 + 25 = 40 s old when the command is settled (the bound test adds 2 s of connect time as a
# margin), at most 15 + 30 = 45 s old after the pause that follows an abandon (Backoff cap
# 30 s), and at most 15 + 2 x 10 = 35 s old at the end of an idle receive: all < 60 s.
# The slow first call of IMDS (up to 2 minutes while the feature is enabled) is the poller's
# to wait out; a command never uses that timeout and is simply redelivered later.
SESSION_RENEW_EVERY = 15.0
ABANDON_PAUSE_MAX = 30.0


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


def open_receiver(client: Any, queue: str, session_id: str) -> Any:
    """The approvals receiver on ``session_id`` (not yet open): one thread reads its
    connection, with no SDK keep-alive thread beside it (see RECEIVER_PREFETCH)."""
    return client.get_queue_receiver(
        queue,
        session_id=session_id,
        max_wait_time=RECEIVE_WAIT,
        socket_timeout=RECEIVER_SOCKET_TIMEOUT,
        prefetch_count=RECEIVER_PREFETCH,
        keep_alive=0,
    )


def approvals_worker(
    forwarder: Forwarder,
    config: ForwarderConfig,
    limit: RequestLimit | None = None,
    credential: Any = None,
) -> Callable[[], None]:
    """The receiver thread's body: reconnects with backoff until the forwarder stops.
    ``limit`` is the IMDS request budget it shares with the poller (which has priority);
    ``credential`` the process's token credential (None: servicebus.client's default)."""
    stop = forwarder.stop_event
    handler = CommandHandler(
        forwarder,
        # Its own connection: every request has the command's own deadline (see above), and
        # ends at once when the forwarder stops.
        ImdsClient(config.imds_endpoint, api_version=config.api_version, limit=limit, cancel=stop),
        require_listed=config.require_listed,
        sleep=stop.wait,
    )

    def approvals() -> None:
        from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

        reconnect = Backoff(1.0, ABANDON_PAUSE_MAX)  # reset by a receive that worked
        pause = Backoff(1.0, ABANDON_PAUSE_MAX)  # after an abandon; reset by a settled command
        while not stop.is_set():
            session_id = forwarder.observer.vm_name
            client = None
            try:
                client = servicebus.client(
                    namespace=config.namespace,
                    connection_string=config.connection_string,
                    client_id=config.client_id,
                    credential=credential,
                    transport=config.servicebus_transport,
                    endpoint=config.servicebus_endpoint,
                    retry_total=1,
                    retry_backoff_factor=0.5,
                )
                with contextlib.ExitStack() as opened:
                    with forwarder.parked():  # waiting for the session: no state touched
                        receiver = opened.enter_context(
                            open_receiver(client, config.reply_queue, session_id)
                        )
                    log.info("receiving commands on %s, session %s", config.reply_queue, session_id)
                    lock = SessionLock(receiver)
                    while not stop.is_set() and forwarder.observer.vm_name == session_id:
                        # One at a time: asked for more, the SDK waits ~200 ms for a batch
                        # to fill after the first message, and approvals are latency-bound.
                        # Parked: a stop may close the forwarder's state meanwhile.
                        with forwarder.parked():
                            messages = receiver.receive_messages(
                                max_message_count=1, max_wait_time=RECEIVE_WAIT
                            )
                        reconnect.reset()  # the link works: the next drop starts afresh
                        for message in messages:
                            log.debug(
                                "command %s received (enqueued %s)",
                                message.message_id,
                                message.enqueued_time_utc,
                            )
                            lock.keep()
                            outcome = handler.handle(
                                servicebus.message_body(message),
                                message.message_id,
                                tracecontext.from_properties(message.application_properties),
                            )
                            settle(receiver, message, outcome)
                            forwarder.command_settled(
                                message.message_id, outcome.action, outcome.reason
                            )
                            lock.keep()
                            if outcome.action == "abandon":
                                stop.wait(pause.next_delay())
                            else:
                                pause.reset()
                        lock.keep()
            except StoppedWhileParked:
                return  # the stop may have closed the forwarder's state: touch nothing
            except (SessionCannotBeLockedError, OperationTimeoutError) as exc:
                delay = reconnect.next_delay()
                log.info("session %s not available (%s); retry in %.1f s", session_id, exc, delay)
                stop.wait(delay)
            except Exception as exc:  # noqa: BLE001 - reconnect on anything, never die
                delay = reconnect.next_delay()
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
