"""One IMDS request budget for the whole forwarder: at most 5 requests in any second.

IMDS throttles a VM above 5 requests/s (429). The poller and the approvals handler each have
their own connection, but they share this limit, so a flood of approval commands (each re-reads
the document) can never push the VM over it. The poller is never starved: commands may use all
but :attr:`RequestLimit.reserved` of the slots of any one-second window, the poller all of them.

A sliding window (the times of the last requests), not a token bucket: a bucket's burst would
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
        reserved: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_requests < 1 or not 0 <= reserved < max_requests or window <= 0:
            raise ValueError("need max_requests >= 1, 0 <= reserved < max_requests, window > 0")
        self.max_requests = max_requests
        self.window = window
        self.reserved = reserved
        self.clock = clock
        self._lock = threading.Lock()
        self._sent: deque[float] = deque()  # start times of the requests in the last window
        self.waited = 0.0  # seconds callers spent waiting for a slot, in total

    def _wait_needed(self, now: float, priority: bool) -> float:
        """0 if a request may start now (and records it), else how long to wait."""
        while self._sent and self._sent[0] <= now - self.window:
            self._sent.popleft()
        allowed = self.max_requests if priority else self.max_requests - self.reserved
        if len(self._sent) < allowed:
            self._sent.append(now)
            return 0.0
        # The slot frees when the request `allowed` places back leaves the window.
        oldest_blocking = self._sent[len(self._sent) - allowed]
        return max(oldest_blocking + self.window - now, 0.001)

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
