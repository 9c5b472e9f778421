"""Retry pacing shared by every part: exponential backoff with jitter, and Retry-After (pure).

One definition for the forwarder (IMDS polls, sends, approval commands) and the workflows
(Teams, webhooks, ARM), so that a fix to either reaches all of them.
"""

from __future__ import annotations

import email.utils
import random
import re
from collections.abc import Callable
from datetime import UTC

# delta-seconds: ASCII digits only (str.isdigit and str.isdecimal take other scripts' digits
# and superscripts, which float() then refuses).
_DELTA_SECONDS = re.compile(r"[0-9]+")


class Backoff:
    """The n-th delay in a row is drawn uniformly from ``[floor, min(cap, base * 2**n)]``.

    ``floor`` defaults to ``base``. That floor matters for IMDS: with base = the poll interval
    (>= 1 s), retrying can never push the request rate above what normal polling sends, and a
    429 can only slow it down. HTTP retries use ``floor=0`` (full jitter).
    """

    def __init__(
        self,
        base: float,
        cap: float,
        *,
        floor: float | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
        self.floor = base if floor is None else max(0.0, min(floor, base))
        self.failures = 0
        self._rng = rng

    def next_delay(self, at_least: float = 0.0) -> float:
        """The next delay (counting one more failure), never below ``at_least`` up to the cap."""
        self.failures += 1
        ceiling = min(self.cap, self.base * 2.0 ** min(self.failures, 30))
        delay = self.floor + self._rng() * (ceiling - self.floor)
        return max(delay, min(at_least, self.cap))

    def reset(self) -> None:
        self.failures = 0


def parse_retry_after(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header in seconds from ``now`` (epoch seconds): delta-seconds or an
    HTTP date (RFC 9110 10.2.3); None when absent or unreadable. Never negative, never raises."""
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > 64:
        return None
    if _DELTA_SECONDS.fullmatch(text):
        return float(text)
    if not text.isascii():
        return None  # an HTTP date is ASCII
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError, AttributeError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return max(0.0, when.timestamp() - now)
    except (OverflowError, ValueError):
        return None
