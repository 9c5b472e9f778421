"""Receive from Service Bus and invoke functions: one thread per concurrent receiver.

Semantics follow the Functions Service Bus extension (v5):
- PEEK_LOCK; on success the message is completed when autoCompleteMessages is true (host.json,
  overridden per trigger); on any failure (conversion, the function, an output binding) it is
  abandoned, so the broker redelivers and dead-letters after MaxDeliveryCount.
- autoCompleteMessages false: a Python function cannot settle messages without the SDK-type
  bindings, so a successful message is left unsettled (no lock renewal); its lock expires and
  the broker redelivers it. A warning says so once per function. Failures are still abandoned.
- Session triggers accept NEXT_AVAILABLE_SESSION on up to maxConcurrentSessions threads and
  process one session's messages in order on one thread, releasing it when it stays idle
  for sessionIdleTimeout. Like the extension's session processor (AcceptNextSessionAsync
  waits clientRetryOptions.tryTimeout, 1 minute by default), an accept waits on the broker
  for tryTimeout, and the broker hands a session that gets messages to a waiting accept at
  once. (Accepts of 2 s each, as before, made every idle thread open a new connection every
  2 s: with 4 session triggers x 16 threads, ~30 connection set-ups a second, which kept the
  host's CPU busy and delayed the accept of a new session by up to ~0.9 s.) At most
  :data:`ACCEPTORS` of a trigger's threads wait in an accept at once; the others wait for
  their turn without a connection. The sync SDK wakes a waiting accept about four times a
  second (an SSL read with a timeout, then a sleep), so 4 triggers x 64 threads all waiting
  kept the host at half a core and the emulator busy while nothing happened. A thread leaves
  the accept as soon as it holds a session and the next one starts its accept at once: a
  burst of sessions is taken ACCEPTORS at a time, each in one round trip.
- Plain triggers run maxConcurrentCalls receivers. cardinality many receives up to
  maxMessageBatchSize messages and invokes once with the list; they are settled together.
- Any receiver fault (broker gone, link detached) closes that thread's client and reconnects
  after exponential backoff with jitter; nothing here exits on it.
On stop, threads finish the invocation in flight and settle it, then close their receivers;
a thread waiting in an accept has its connection closed, so it leaves at once (one the SDK
keeps in a handshake with a broker that stopped answering is not waited for past a second).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusReceiver,
)
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from emulators.functions_host import convert
from emulators.functions_host.bindings import FunctionSpec, ServiceBusTrigger
from emulators.functions_host.hostconfig import MAX_CONCURRENT_RECEIVERS, ServiceBusOptions
from emulators.functions_host.invoke import FunctionInvoker
from emulators.functions_host.logs import event
from emulators.functions_host.sbclient import (
    ClientFactory,
    OutputSender,
    make_client,
    without_keep_alive_thread,
)
from sebridge.retry import Backoff

RECEIVE_WAIT_S = 0.5  # one receive call's wait: also how quickly a thread notices stop
SETTLE_ATTEMPTS = 3  # complete/abandon tries before the message is left to redelivery
MIN_ACCEPT_INTERVAL_S = 0.5  # a broker that refuses accepts at once must not be spun on
ACCEPTORS = 4  # of a session trigger's threads, at most this many wait in an accept at once
ACCEPT_LEAVE_S = 1.0  # at stop, how long a thread torn out of its accept is waited for


def describe_error(exc: BaseException) -> str:
    """One line: type, first line of the message, and where it was raised (file:line)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    summary = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        summary += f" (at {Path(last.filename).name}:{last.lineno})"
    return summary


def _iso(moment: Any) -> str | None:
    """An aware datetime or epoch seconds as ISO 8601 UTC with milliseconds; None stays None."""
    if moment is None:
        return None
    if isinstance(moment, int | float):
        moment = datetime.fromtimestamp(moment, UTC)
    return str(moment.astimezone(UTC).isoformat(timespec="milliseconds"))


@dataclass(frozen=True)
class ServiceBusFunction:
    spec: FunctionSpec
    trigger: ServiceBusTrigger
    invoker: FunctionInvoker


class Dispatcher:
    def __init__(
        self,
        functions: Sequence[ServiceBusFunction],
        options: ServiceBusOptions,
        outputs: OutputSender,
        logger: logging.Logger,
        factory: ClientFactory = make_client,
    ) -> None:
        self._functions = list(functions)
        self._options = options
        self._outputs = outputs
        self._logger = logger
        self._factory = factory
        self._stop = threading.Event()
        self._workers: list[_ReceiverWorker] = []
        self._gates: dict[str, _AcceptGate] = {}  # per session trigger, by function name
        self._renewer: AutoLockRenewer | None = None
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()

    def start(self) -> None:
        sdk_logger = logging.getLogger(_SDK_HANDLER_LOGGER)
        if _ACCEPT_FILTER not in sdk_logger.filters:
            sdk_logger.addFilter(_ACCEPT_FILTER)
        if self._functions:
            renewal = self._options.max_lock_renewal.total_seconds()
            self._renewer = AutoLockRenewer(max_lock_renewal_duration=renewal)
        for function in self._functions:
            count = (
                self._options.max_concurrent_sessions
                if function.trigger.sessions
                else self._options.max_concurrent_calls
            )
            if function.trigger.sessions:
                self._gates[function.spec.name] = _AcceptGate(ACCEPTORS, self._stop)
            for index in range(min(count, MAX_CONCURRENT_RECEIVERS)):
                worker = _ReceiverWorker(self, function, index)
                self._workers.append(worker)
                worker.start()

    def stop(self, grace: float = 10.0) -> None:
        """Stop receiving; wait up to `grace` seconds for invocations in flight to settle."""
        self._stop.set()
        for gate in self._gates.values():
            gate.wake_all()
        deadline = time.monotonic() + grace
        for worker in self._workers:
            if worker.accepting:
                # Waiting for a session for up to tryTimeout: nothing in flight to lose. The
                # SDK logs the accept it sees torn down as an unexpected error; not news here.
                worker.closed_for_stop = True
                worker.force_close()
        for worker in self._workers:
            # Idle threads leave within one receive wait; busy ones get the whole grace. One
            # that waited in an accept holds nothing: its connection is closed, and if the SDK
            # still sits in it (a broker that stopped answering in the middle of the handshake:
            # closing does not end that read), it is left behind after ACCEPT_LEAVE_S.
            left = deadline - time.monotonic()
            if worker.closed_for_stop:
                left = min(left, ACCEPT_LEAVE_S)
            worker.join(timeout=max(0.0, left))
        stuck = [w for w in self._workers if w.is_alive() and w.busy]
        for worker in stuck:
            event(
                self._logger,
                logging.WARNING,
                "shutdown_abandon",
                "invocation still running at shutdown; closing its receiver so the broker "
                "releases the message",
                function=worker.function.spec.name,
                message_id=worker.current_message_id,
            )
            worker.force_close()
        if self._renewer is not None:
            self._renewer.close()
            self._renewer = None

    @property
    def stopping(self) -> threading.Event:
        return self._stop

    def gate(self, function: str) -> _AcceptGate:
        return self._gates[function]

    def warn_once(self, key: str, message: str, **fields: Any) -> None:
        with self._warn_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        event(self._logger, logging.WARNING, "warning", message, **fields)

    def auto_complete(self, trigger: ServiceBusTrigger) -> bool:
        if trigger.auto_complete is not None:
            return trigger.auto_complete
        return self._options.auto_complete


class _AcceptGate:
    """Lets at most ``size`` threads of one session trigger wait in an accept at once; the
    others wait here, idle, until one leaves (or ``stop`` is set and :meth:`wake_all` runs)."""

    def __init__(self, size: int, stop: threading.Event) -> None:
        self._free = size
        self._stop = stop
        self._cond = threading.Condition()

    def enter(self) -> bool:
        """Wait for a turn to accept; False once stopping (the thread then leaves)."""
        with self._cond:
            while self._free <= 0 and not self._stop.is_set():
                self._cond.wait()
            if self._stop.is_set():
                return False
            self._free -= 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify()

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()


class _StoppedAcceptFilter(logging.Filter):
    """Drops the SDK's error records from receiver threads whose accept stop() tore down."""

    def filter(self, record: logging.LogRecord) -> bool:
        thread = threading.current_thread()
        return not (isinstance(thread, _ReceiverWorker) and thread.closed_for_stop)


_SDK_HANDLER_LOGGER = "azure.servicebus._base_handler"
_ACCEPT_FILTER = _StoppedAcceptFilter()


class _ReceiverWorker(threading.Thread):
    def __init__(self, dispatcher: Dispatcher, function: ServiceBusFunction, index: int) -> None:
        super().__init__(name=f"sb-{function.spec.name}-{index}", daemon=True)
        self.dispatcher = dispatcher
        self.function = function
        self.busy = False
        self.accepting = False  # waiting on the broker for the next available session
        self.closed_for_stop = False  # stop() closed its connection while it waited
        self.current_message_id: str | None = None
        self._client: ServiceBusClient | None = None
        self._client_lock = threading.Lock()
        self._backoff = Backoff(0.5, 15.0, floor=0.25)
        self._logger = dispatcher._logger
        self._options = dispatcher._options
        self._auto_complete = dispatcher.auto_complete(function.trigger)

    # -- connection lifecycle ------------------------------------------------------------
    def run(self) -> None:
        stop = self.dispatcher.stopping
        trigger = self.function.trigger
        while not stop.is_set():
            try:
                client = self._factory_client()
                if trigger.sessions:
                    self._session_loop(client)
                else:
                    self._plain_loop(client)
            except Exception as exc:  # noqa: BLE001 - a receiver fault must never end the thread
                if stop.is_set():
                    break
                delay = self._backoff.next_delay()
                event(
                    self._logger,
                    logging.WARNING,
                    "receiver_error",
                    "receiver failed; reconnecting",
                    function=self.function.spec.name,
                    entity=trigger.entity,
                    error=describe_error(exc),
                    retry_in_s=round(delay, 2),
                )
                self._close_client()
                stop.wait(delay)
            finally:
                if stop.is_set():
                    self._close_client()
        self._close_client()

    def _factory_client(self) -> ServiceBusClient:
        with self._client_lock:
            if self._client is None:
                # The SDK retries a NEXT_AVAILABLE_SESSION accept that timed out (no session
                # waiting) as if it were a fault, multiplying the wait; this loop already asks
                # again, so session clients do not retry and settlement retries itself.
                retries = 0 if self.function.trigger.sessions else 2
                self._client = self.dispatcher._factory(
                    self.function.trigger.connection, retry_total=retries
                )
            return self._client

    def _close_client(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - closing a dead connection may fail
                self._logger.debug("closing client failed: %r", exc)

    def force_close(self) -> None:
        """From another thread at shutdown: drop the connection so unsettled locks are released."""
        self._close_client()

    def _receiver(self, client: ServiceBusClient, **kwargs: Any) -> ServiceBusReceiver:
        trigger = self.function.trigger
        renewer = self.dispatcher._renewer if self._auto_complete else None
        options: dict[str, Any] = {
            "receive_mode": ServiceBusReceiveMode.PEEK_LOCK,
            "prefetch_count": self._options.prefetch_count,
            "auto_lock_renewer": renewer,
            **kwargs,
        }
        if trigger.queue is not None:
            return without_keep_alive_thread(client.get_queue_receiver(trigger.queue, **options))
        return without_keep_alive_thread(
            client.get_subscription_receiver(
                str(trigger.topic), str(trigger.subscription), **options
            )
        )

    @property
    def _batch(self) -> int:
        if self.function.trigger.cardinality == "many":
            return self._options.max_message_batch_size
        return 1

    def _plain_loop(self, client: ServiceBusClient) -> None:
        stop = self.dispatcher.stopping
        with self._receiver(client) as receiver:
            while not stop.is_set():
                messages = receiver.receive_messages(
                    max_message_count=self._batch, max_wait_time=RECEIVE_WAIT_S
                )
                self._backoff.reset()
                if messages:
                    self._handle(receiver, messages, locked_until=None)

    def _session_loop(self, client: ServiceBusClient) -> None:
        stop = self.dispatcher.stopping
        idle = max(0.1, self._options.session_idle_timeout.total_seconds())
        accept_wait = max(0.1, self._options.try_timeout.total_seconds())
        gate = self.dispatcher.gate(self.function.spec.name)
        while not stop.is_set():
            if not gate.enter():
                break
            try:
                receiver = self._accept(client, accept_wait)
            finally:
                gate.leave()  # holding a session, or after the pause: the next one accepts
            if receiver is None:
                continue
            with receiver:
                self._backoff.reset()
                session = receiver.session
                # Wait in short receives so a stop is noticed quickly even with a long
                # sessionIdleTimeout; release the session once it stayed idle that long.
                idle_until = time.monotonic() + idle
                while not stop.is_set():
                    left = idle_until - time.monotonic()
                    if left <= 0:
                        break  # idle: release the session for whoever has the next message
                    messages = receiver.receive_messages(
                        max_message_count=self._batch,
                        max_wait_time=max(0.1, min(left, RECEIVE_WAIT_S)),
                    )
                    if messages:
                        self._handle(receiver, messages, locked_until=session.locked_until_utc)
                        idle_until = time.monotonic() + idle

    def _accept(self, client: ServiceBusClient, wait: float) -> ServiceBusReceiver | None:
        """The next available session's receiver, open; None when none came within ``wait``
        (after a pause of MIN_ACCEPT_INTERVAL_S from the start, should the broker refuse at
        once, or stop)."""
        stop = self.dispatcher.stopping
        started = time.monotonic()
        receiver = self._receiver(client, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=wait)
        self.accepting = True
        try:
            if stop.is_set():  # stop() may have looked before this thread said it accepts
                raise OperationTimeoutError(message="stopping")
            receiver.__enter__()
        except (OperationTimeoutError, SessionCannotBeLockedError):
            # No session is waiting: not a fault. Close the half-open link and ask again.
            self._safe_close(receiver)
            self._backoff.reset()
            stop.wait(max(0.0, MIN_ACCEPT_INTERVAL_S - (time.monotonic() - started)))
            return None
        except Exception:
            self._safe_close(receiver)
            raise
        finally:
            self.accepting = False
        return receiver

    def _safe_close(self, receiver: ServiceBusReceiver) -> None:
        try:
            receiver.close()
        except Exception as exc:  # noqa: BLE001 - a failed accept may leave a broken link
            self._logger.debug("closing receiver failed: %r", exc)

    # -- one delivery --------------------------------------------------------------------
    def _handle(
        self,
        receiver: ServiceBusReceiver,
        messages: list[ServiceBusReceivedMessage],
        *,
        locked_until: Any,
    ) -> None:
        if self.function.trigger.cardinality == "many":
            self._invoke(receiver, messages, locked_until)
        else:
            for message in messages:
                self._invoke(receiver, [message], locked_until)

    def _invoke(
        self,
        receiver: ServiceBusReceiver,
        messages: list[ServiceBusReceivedMessage],
        locked_until: Any,
    ) -> None:
        spec = self.function.spec
        invoker = self.function.invoker
        first = messages[0]
        self.busy = True
        self.current_message_id = first.message_id
        started_at = time.time()
        started = time.perf_counter()
        error: str | None = None
        try:
            value: Any
            if self.function.trigger.cardinality == "many":
                value = convert.to_function_messages(
                    messages, function_name=spec.name, locked_until=locked_until
                )
            else:
                value = convert.to_function_message(
                    first, function_name=spec.name, locked_until=locked_until
                )
            retries = first.delivery_count or 0  # earlier failed attempts (AMQP header)
            result = invoker.invoke(value, retry_count=retries)
            for output in invoker.service_bus_outputs:
                self.dispatcher._outputs.send(output, invoker.output_value(result, output.param))
        except Exception as exc:
            error = describe_error(exc)
            self._logger.debug("invocation of %s failed", spec.name, exc_info=True)
        duration_ms = round((time.perf_counter() - started) * 1000, 1)
        settlement = self._settle(receiver, messages, failed=error is not None)
        event(
            self._logger,
            logging.INFO if error is None else logging.ERROR,
            "invocation",
            f"{spec.name} {'succeeded' if error is None else 'failed'}",
            function=spec.name,
            message_id=first.message_id if len(messages) == 1 else None,
            message_ids=[m.message_id for m in messages] if len(messages) > 1 else None,
            session=first.session_id,
            delivery_count=convert.delivery_count(first),
            # When the broker took the message and when the function began: how long it
            # waited for a receiver (benchmarks/e2e_latency.py reads the two).
            enqueued_at=_iso(first.enqueued_time_utc),
            started_at=_iso(started_at),
            duration_ms=duration_ms,
            outcome="succeeded" if error is None else "failed",
            settlement=settlement,
            error=error,
        )
        self.busy = False
        self.current_message_id = None

    def _settle(
        self,
        receiver: ServiceBusReceiver,
        messages: list[ServiceBusReceivedMessage],
        *,
        failed: bool,
    ) -> str:
        if not failed and not self._auto_complete:
            self.dispatcher.warn_once(
                f"autocomplete:{self.function.spec.name}",
                "autoCompleteMessages is false: successful messages are left unsettled and "
                "are redelivered when their lock expires (Python functions cannot settle "
                "messages without SDK-type bindings)",
                function=self.function.spec.name,
            )
            return "left-locked"
        action = "abandoned" if failed else "completed"
        for message in messages:
            try:
                self._settle_one(receiver, message, failed=failed)
            except Exception as exc:  # noqa: BLE001 - the broker will redeliver; keep going
                event(
                    self._logger,
                    logging.WARNING,
                    "settle_error",
                    f"could not settle message ({action}); it will be redelivered",
                    function=self.function.spec.name,
                    message_id=message.message_id,
                    error=describe_error(exc),
                )
                action = "settle-failed"
        return action

    def _settle_one(
        self, receiver: ServiceBusReceiver, message: ServiceBusReceivedMessage, *, failed: bool
    ) -> None:
        backoff = Backoff(0.2, 2.0, floor=0.1)
        for attempt in range(SETTLE_ATTEMPTS):
            try:
                if failed:
                    receiver.abandon_message(message)
                else:
                    receiver.complete_message(message)
                return
            except (MessageLockLostError, SessionLockLostError, MessageAlreadySettled):
                raise  # retrying cannot help: the lock is gone
            except ServiceBusError:
                if attempt + 1 >= SETTLE_ATTEMPTS or self.dispatcher.stopping.is_set():
                    raise
                time.sleep(backoff.next_delay())
