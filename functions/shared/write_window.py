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
  once rather than sleep under the lease, and Service Bus brings the message back later;
- an attempt could still be under way (up to its request timeout) when the lease can no longer
  be proven held: it is not started (:class:`WindowClosing`), since ARM may apply a request it
  took until the client gives up on it.

A write that did go out and returned is followed by a check of the lease before anything is
published on its strength (lb-pools' Prepared): if the lease lapsed meanwhile, the message is
redelivered instead. And a decision writes what it is about to take down into the pools' state
(their leaving members) before the first write, so that a decision another instance makes under
the next lease counts those members as gone even if a slow write lands after it.

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


class WindowClosing(Exception):
    """A write attempt could outlast the lease: it is not started (the message comes back and
    is decided again under a fresh lease)."""


def before_attempt(request_seconds: float = 0.0) -> float | None:
    """Before a write attempt that may take up to ``request_seconds`` (the request's whole
    timeout), or a wait before the next one: the seconds the window is still open (None: no
    window, no limit); raises when it is closed (the lease is lost), or when the attempt could
    still be under way once it closes (:class:`WindowClosing`): ARM may apply a request it
    accepted until the client gives up on it, so only one that ends while the lease is provably
    held (the allowance keeps the lease's own margin to spare) may start."""
    allowance = _window.get()
    if allowance is None:
        return None
    left = allowance()
    if request_seconds and left <= request_seconds:
        raise WindowClosing(
            f"a write that may take {request_seconds:g} s would outlast the pool's lease "
            f"({left:.1f} s left)"
        )
    return left
