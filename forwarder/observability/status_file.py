"""``status.json`` in the state directory: what ``sebridge status`` reads of the running loop.

The forwarder persists its events and outbox already; what only lives in memory (the last poll
and its result, the last successful send, failures in progress, the last transition of recent
events, the approval commands seen) is written here by :class:`StatusWriter`: at most every
:data:`WRITE_EVERY` seconds while idle, within a second when something worth knowing happened
(a transition, an approval command, health changing), and once more when the forwarder stops.
Never a write per poll.

The file is replaced atomically (a temp file renamed over it), without fsync: it is a report,
not a record, and a reader copes with a missing or damaged one.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sebridge.contract.events import Envelope
from sebridge.forwarder.observability.health import Health
from sebridge.forwarder.observability.observations import Observations

log = logging.getLogger("forwarder.status")

STATUS_FILE = "status.json"
WRITE_EVERY = 10.0
SOON = 1.0  # the least time between two writes, whatever happens


def write_status(path: Path, document: dict[str, object]) -> None:
    data = json.dumps(document, separators=(",", ":")).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # readable by an operator's `sebridge status` (not a secret)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class StatusWriter:
    """A LoopListener that writes ``status.json`` from :class:`Observations` (see module)."""

    def __init__(
        self,
        observations: Observations,
        state_dir: Path,
        *,
        every: float = WRITE_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.observations = observations
        self.path = state_dir / STATUS_FILE
        self.every = every
        self.clock = clock
        self._last = -float("inf")
        self._failing = False

    def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
        return None  # Observations has them; polled() follows within this same tick

    def polled(self, health: Health) -> None:
        since = self.clock() - self._last
        if since >= self.every or (self.observations.changed.is_set() and since >= SOON):
            self.write()

    def write(self) -> bool:
        self.observations.changed.clear()
        self._last = self.clock()
        try:
            write_status(self.path, self.observations.snapshot())
        except OSError as exc:
            if not self._failing:
                log.warning("cannot write %s (%s): retried", self.path, exc)
            self._failing = True
            return False
        self._failing = False
        return True
