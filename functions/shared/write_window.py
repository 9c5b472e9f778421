"""Writes decided under a pool's lease go out only while the lease is provably held (core).

A capacity decision (lb-pools' drains, the guard's early approvals: functions.lb_pools) holds
only as long as the pools' leases it was made under: once a lease may have lapsed, another
instance may decide the same pool, and both writes would go through. A write is rarely one
attempt: ARM answers 429 with a ``Retry-After``, 409 or 5xx, and the adapters retry with
backoff (functions.adapters.retry). So the decision opens a *window* for the writes it makes
(:func:`lease_window`, with the lease's ``allowance``), and every adapter that writes asks
:func:`before_attempt` before each attempt and before each wait between attempts:

- the lease can no longer be proven held: the allowance raises (the pool store's LeaseLost)
  and nothing more is written; the message is redelivered and decided anew;
- a retry would wait past the moment the lease can be proven held: the adapter gives up at
  once rather than sleep under the lease, and Service Bus brings the message back later.

Outside a window (restores, which only put members back, and everything else) it allows
everything. The window is the invocation's own (a context variable): writes that a decision
runs side by side on other threads carry it along (functions.shared.batching.side_by_side).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Allowance = Callable[[], float]  # seconds the lease is still provably held; raises once lost

_window: ContextVar[Allowance | None] = ContextVar("sebridge_write_window", default=None)


@contextmanager
def lease_window(allowance: Allowance) -> Iterator[None]:
    """Writes made inside go out only while ``allowance`` says the lease is held."""
    token = _window.set(allowance)
    try:
        yield
    finally:
        _window.reset(token)


def before_attempt() -> float | None:
    """Before a write attempt, or a wait before the next one: the seconds the window is still
    open (None: no window, no limit); raises when it is closed (the lease is lost)."""
    allowance = _window.get()
    return None if allowance is None else allowance()
