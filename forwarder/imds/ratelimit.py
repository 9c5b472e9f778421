"""One IMDS request budget for the whole forwarder: at most 5 requests in any second.

IMDS throttles a VM above 5 requests/s (429). The poller and the approvals handler each have
their own connection, but they share this limit, so a flood of approval commands (each re-reads
the document) can never push the VM over it. Neither side can starve the other: within any
window, the poller (``priority``) may start at most ``max_requests - 1`` requests and the
others at most ``max_requests - 2``, and all together at most ``max_requests``. So commands
always leave the poller two slots (it needs at most two in a window at 1 poll/s), and even a
poller run at a sub-second interval (simulator tests) leaves commands one.

A sliding window (the start times of the requests), not a token bucket: a bucket's burst would
allow up to twice the rate within one second.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

IMDS_REQUESTS_PER_SECOND = 5
# The window is counted where the requests start; IMDS counts where they arrive, and a request
# can be held up on the way (scheduling, a slow connect). A window 0.2 s longer than a second
# keeps the count at IMDS at 5 even when one request of a window is that late.
WINDOW_SECONDS = 1.2


class RequestLimit:
    def __init__(
        self,
        max_requests: int = IMDS_REQUESTS_PER_SECOND,
        window: float = WINDOW_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_requests < 3 or window <= 0:
            raise ValueError("need max_requests >= 3 and window > 0")
        self.max_requests = max_requests
        self.window = window
        self.clock = clock
        self._lock = threading.Lock()
        # Start times of the requests in the last window, by class (poller, others).
        self._sent: dict[bool, deque[float]] = {True: deque(), False: deque()}
        self.waited = 0.0  # seconds callers spent waiting for a slot, in total

    def _wait_needed(self, now: float, priority: bool) -> float:
        """0 if a request may start now (and records it), else how long to wait."""
        for times in self._sent.values():
            while times and times[0] <= now - self.window:
                times.popleft()
        own, other = self._sent[priority], self._sent[not priority]
        own_cap = self.max_requests - (1 if priority else 2)
        total = len(own) + len(other)
        if len(own) < own_cap and total < self.max_requests:
            own.append(now)
            return 0.0
        # The earliest moment a slot frees: one of ours (over our cap) or any (over the total)
        # leaves the window.
        candidates = []
        if len(own) >= own_cap:
            candidates.append(own[len(own) - own_cap] + self.window)
        if total >= self.max_requests:
            merged = sorted([*own, *other])
            candidates.append(merged[total - self.max_requests] + self.window)
        return max(max(candidates) - now, 0.001)

    def acquire(
        self,
        *,
        priority: bool = False,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> bool:
        """Wait for a slot; False when ``deadline`` (monotonic) would pass first or ``cancel``
        is set while waiting."""
        started = self.clock()
        while True:
            with self._lock:
                now = self.clock()
                wait = self._wait_needed(now, priority)
            if wait == 0.0:
                self.waited += now - started
                return True
            if deadline is not None and now + wait > deadline:
                return False
            if cancel is not None:
                if cancel.wait(wait):
                    return False
            else:
                time.sleep(wait)
