"""Group commit: requests that arrive while others like them are served are served together.

Two places serialise work that many invocations of one process want at once: the decisions on
one backend pool (under that pool's lease, functions.lb_pools) and the sends to one Service
Bus entity (one link, functions.adapters.servicebus). Taking turns one request at a time
makes the tenth request of a burst wait for nine full turns (a lease taken and given back, or
a send's round trip, each). A :class:`Batcher` lets the requests that queued up during one
turn share the next: one lease, one batch send.

How a request goes (for one key):
- the thread that submits it while no batch of its key is being served *leads*: it serves
  every request queued for the key so far (its own first) in one call of ``serve``;
- a thread that submits while a batch is being served waits; when that batch is done, the lead
  passes to the oldest waiting request, whose thread serves everything queued by then;
- so a request waits for at most one batch before its own, and no thread goes on serving
  others once its own result is ready (the lead is handed on, not kept).

``serve`` returns one result per request, in order; an exception in that list is raised in
that request's thread only (one request's failure is not the others'). An exception raised by
``serve`` itself fails every request of the batch. The batcher never retries: a failed
request fails its invocation, and Service Bus redelivers that message.

:func:`side_by_side` runs the calls of one batch (its NIC writes, say) on a few threads at once.
Threads and locks only, no I/O; the workflows' cores take both as ports and stay pure.
"""

from __future__ import annotations

import contextvars
import copy
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")
V = TypeVar("V")

MAX_BATCH = 64  # requests served in one call at most; the rest go to the next leader

Serve = Callable[[K, list[R]], Sequence[V | BaseException]]


class _Ticket(Generic[R, V]):
    __slots__ = ("error", "lead", "ready", "request", "value")

    def __init__(self, request: R) -> None:
        self.request = request
        self.ready = threading.Event()
        self.lead = False  # woken to serve the next batch rather than with a result
        self.value: V | None = None
        self.error: BaseException | None = None


class Batcher(Generic[K, R, V]):
    """Serves the requests of one key a batch at a time (see the module's docstring)."""

    def __init__(self, *, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queues: dict[K, list[_Ticket[R, V]]] = {}
        self._serving: set[K] = set()
        self.batches = 0  # how many calls of serve so far (for tests and benchmarks)
        self.largest = 0  # the largest batch so far
        self.waited = 0  # requests that queued behind a batch being served

    def submit(self, key: K, request: R, serve: Serve[K, R, V]) -> V:
        """Serve ``request`` (alone or with others of ``key``); its result, or raise its error."""
        ticket: _Ticket[R, V] = _Ticket(request)
        with self._lock:
            self._queues.setdefault(key, []).append(ticket)
            leads = key not in self._serving
            if leads:
                self._serving.add(key)
            else:
                self.waited += 1
        while not leads:
            ticket.ready.wait()
            if not ticket.lead:
                return self._outcome(ticket)
            ticket.ready.clear()
            leads = True
        self._serve_batch(key, serve)
        # The batch just served began with this ticket (the oldest queued), so it is settled.
        return self._outcome(ticket)

    def _serve_batch(self, key: K, serve: Serve[K, R, V]) -> None:
        with self._lock:
            queue = self._queues[key]
            batch, rest = queue[: self._max_batch], queue[self._max_batch :]
            self._queues[key] = rest
            self.batches += 1
            self.largest = max(self.largest, len(batch))
        try:
            try:
                results = list(serve(key, [t.request for t in batch]))
                if len(results) != len(batch):
                    raise RuntimeError(
                        f"serve returned {len(results)} results for {len(batch)} requests"
                    )
            except BaseException as exc:  # noqa: BLE001 - every request of the batch fails
                results = [exc if i == 0 else _copy(exc) for i in range(len(batch))]
            for ticket, result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    ticket.error = result
                else:
                    ticket.value = result
        finally:
            with self._lock:
                waiting = self._queues.get(key)
                if waiting:
                    waiting[0].lead = True  # the oldest waiting request serves the next batch
                    waiting[0].ready.set()
                else:
                    self._queues.pop(key, None)
                    self._serving.discard(key)
            for ticket in batch:
                ticket.ready.set()

    @staticmethod
    def _outcome(ticket: _Ticket[R, V]) -> V:
        if ticket.error is not None:
            raise ticket.error
        return ticket.value  # type: ignore[return-value]  # set whenever error is not


def _copy(exc: BaseException) -> BaseException:
    """Each waiting thread raises an exception object of its own (tracebacks differ)."""
    try:
        twin = copy.copy(exc)
    except Exception:  # noqa: BLE001 - an exception type that cannot be copied
        return exc
    twin.__cause__ = exc.__cause__
    return twin.with_traceback(exc.__traceback__)


def side_by_side(
    max_workers: int,
) -> Callable[[Sequence[Callable[[], None]]], list[BaseException | None]]:
    """Run calls on up to ``max_workers`` threads at once: what each raised, or None, in order."""
    if max_workers < 1:
        raise ValueError("max_workers must be at least 1")

    def run(calls: Sequence[Callable[[], None]]) -> list[BaseException | None]:
        if not calls:
            return []
        workers = min(max_workers, len(calls))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="side-by-side") as pool:
            # Each call runs in a copy of the caller's context: what the invocation set there
            # (the write window of a lease, functions.shared.write_window) holds for it too.
            futures = [pool.submit(contextvars.copy_context().run, call) for call in calls]
        return [future.exception() for future in futures]

    return run
