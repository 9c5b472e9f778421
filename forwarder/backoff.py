"""Exponential backoff with jitter, never shorter than the base delay."""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Delays of ``base * 2**n`` capped at ``cap``, spread uniformly over ``[base, ceiling]``.

    The floor at ``base`` matters for IMDS: with base = the poll interval (>= 1 s), retrying can
    never push the request rate above what normal polling sends, and a 429 can only slow it down.
    """

    def __init__(self, base: float, cap: float, rng: Callable[[], float] = random.random) -> None:
        if base <= 0 or cap < base:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng

    def next_delay(self, at_least: float = 0.0) -> float:
        self.failures += 1
        ceiling = min(self.cap, self.base * 2.0 ** min(self.failures, 30))
        delay = self.base + self._rng() * (ceiling - self.base)
        return max(delay, min(at_least, self.cap))

    def reset(self) -> None:
        self.failures = 0
