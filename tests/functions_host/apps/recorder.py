"""A thread-safe place where test functions record what they saw, and tests wait for it."""

from __future__ import annotations

import threading
import time
from typing import Any


class Recorder:
    def __init__(self) -> None:
        self._items: list[Any] = []
        self._changed = threading.Condition()

    def add(self, item: Any) -> None:
        with self._changed:
            self._items.append(item)
            self._changed.notify_all()

    def items(self) -> list[Any]:
        with self._changed:
            return list(self._items)

    def clear(self) -> None:
        with self._changed:
            self._items.clear()

    def wait_for(self, count: int, timeout: float) -> list[Any]:
        """Block until at least `count` items exist or `timeout` passes; return what exists."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._items) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return list(self._items)
