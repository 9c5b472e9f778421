"""The demo's timeline: what happened, stamped with when it happened, printed in that order."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Timeline:
    """What happened, stamped with when it happened (wall clock), printed in that order."""

    start: float = field(default_factory=time.time)
    entries: list[tuple[float, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: bool = False

    def add(self, source: str, text: str, at: float | None = None) -> None:
        offset = (time.time() if at is None else at) - self.start
        with self.lock:
            self.entries.append((offset, source, text))
        if self.live:
            print(f"{offset:7.2f}s  {source:<7} {text}", flush=True)

    def render(self) -> list[str]:
        with self.lock:
            ordered = sorted(self.entries, key=lambda entry: entry[0])
        return [f"{at:7.2f}s  {source:<7} {text}" for at, source, text in ordered]
