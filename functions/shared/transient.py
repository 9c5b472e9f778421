"""Retrying an idempotent operation through transient faults, within a window (pure).

Service Bus redelivers an abandoned message at once, so a function that raises on the first
storage timeout burns its ``MaxDeliveryCount`` deliveries (10) in seconds and the message is
dead-lettered by an outage of half a minute. :func:`within` is the one way the workflows ride
out such a fault: it calls ``operation`` again, after exponential backoff with full jitter
(:class:`sebridge.retry.Backoff`), for as long as the operation raises :class:`TransientFault`
and the window lasts, then raises the last fault. A delivery that fails therefore fails after
about ``window.seconds``, and Service Bus's redeliveries are paced by the window: an outage as
long as ``MaxDeliveryCount`` windows loses nothing.

Only what an adapter marks as transient (a timeout, a refused or reset connection, 408, 429,
5xx) is retried; anything else (403: a missing role, 400: a bug) is raised at once, since no
retry can repair it. The operation must be idempotent: it may have half happened when it
failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sebridge.retry import Backoff

log = logging.getLogger("sebridge.functions.transient")

T = TypeVar("T")


class TransientFault(Exception):
    """A failure that may pass by itself (adapters raise it from the SDK's exception)."""


@dataclass(frozen=True)
class RetryWindow:
    """How long, and at what pace, :func:`within` retries (the clock and the sleep are
    injectable, so tests count the waits instead of waiting)."""

    seconds: float = 120.0
    base: float = 1.0  # the first delay is drawn from [0, 2 * base]
    cap: float = 15.0  # no single delay is longer
    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic


def within(window: RetryWindow, operation: Callable[[], T], what: str) -> T:
    """``operation()``, called again after each :class:`TransientFault` until it succeeds or
    ``window.seconds`` have passed since the first call (then the last fault is raised)."""
    deadline = window.monotonic() + window.seconds
    backoff = Backoff(window.base, max(window.base, window.cap), floor=0.0)
    attempt = 0
    while True:
        attempt += 1
        try:
            return operation()
        except TransientFault as exc:
            remaining = deadline - window.monotonic()
            if remaining <= 0:
                log.warning("%s: %s; giving up after %d attempt(s)", what, exc, attempt)
                raise
            delay = min(backoff.next_delay(), remaining)
            log.warning("%s: %s; retry %d in %.1f s", what, exc, attempt, delay)
            window.sleep(delay)
