"""Measured impact: how long maintenance took this VM away, as the forwarder sees it (pure).

The forwarder cannot see the host; it sees its own polls. What it can measure from inside the
VM is the time it was *blind*: no poll ran when its schedule said one should.

- ``freeze-pause``: while an event that names this VM is Started, the largest jump between the
  starts of two consecutive polls beyond what the loop meant to wait (the poll interval, or
  the backoff after a failed poll). A Hyper-V freeze pauses the guest whole. Whether the
  guest's CLOCK_MONOTONIC advances across the pause depends on the host's reference clock;
  CLOCK_REALTIME is stepped to the host's time on resume (the Hyper-V time sync service's
  ``ICTIMESYNCFLAG_SYNC``, or chrony afterwards). So each jump is taken on both clocks and the
  larger counts: a pause shows on at least one of them. It is an upper bound: a slow or
  failing IMDS request inside the window counts as blind time too, and so would a wall clock
  stepped forward by time sync for another reason. A pause that neither clock shows (the
  reference clock stopped and time sync not yet run at the next poll) is not seen: then the
  measurement reads close to 0.
- ``reboot-gap``: the forwarder does not survive a reboot or redeploy. The time between its
  last observation before (kept in its state file) and its first successful poll after, on
  the wall clock (the only one that survives a reboot), attributed to the event it was
  watching: one that names this VM and is Started, or Scheduled with NotBefore reached. While
  such an event is on (or due within :data:`WATCH_AHEAD`), the state is saved at least every
  :data:`PERSIST_EVERY` seconds, so after a hard stop the gap is at most that much too long; a
  clean stop (SIGTERM, a graceful reboot) saves the last poll exactly. It includes the VM's
  boot and the forwarder's own start.

Each event keeps its largest measurement (and its method) until it ends; the Completed carries
it as ``data.impact``. Nothing is measured for an event that does not name this VM (other VMs
of an availability set see it too), nor for one the forwarder never watched while it was on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sebridge.imds import ScheduledEvent

FREEZE_PAUSE = "freeze-pause"
REBOOT_GAP = "reboot-gap"
METHODS = (FREEZE_PAUSE, REBOOT_GAP)
PERSIST_EVERY = 5.0  # seconds between state saves while a watched event is on (disk wear)
WATCH_AHEAD = timedelta(seconds=60)  # a Scheduled event this close to NotBefore is watched
MAX_SECONDS = 10_000_000.0  # far above any maintenance (116 days): a larger value is a bad clock


@dataclass(frozen=True)
class Impact:
    seconds: float
    method: str

    def to_data(self) -> dict[str, Any]:
        """``data.impact`` of a Completed (and the state file's record)."""
        return {"measuredSeconds": round(self.seconds, 1), "method": self.method}

    @classmethod
    def from_data(cls, obj: object) -> Impact | None:
        """A record written by :meth:`to_data`; None for anything else (ignored, not fatal)."""
        if not isinstance(obj, dict):
            return None
        seconds, method = obj.get("measuredSeconds"), obj.get("method")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            return None
        if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
            return None
        return cls(float(seconds), method) if method in METHODS else None


def names_vm(event: ScheduledEvent, vm_name: str) -> bool:
    """Whether the event is this VM's (``Resources`` lists it): only then is it measured."""
    name = vm_name.lower()
    return bool(name) and any(resource.lower() == name for resource in event.resources)


def is_on(event: ScheduledEvent, now: datetime) -> bool:
    """Started, or Scheduled with NotBefore reached: it may be running (or about to)."""
    return event.is_started or (event.not_before is not None and event.not_before <= now)


def _due(event: ScheduledEvent, now: datetime) -> bool:
    return event.is_started or (
        event.not_before is not None and event.not_before <= now + WATCH_AHEAD
    )


class ImpactMeter:
    """The measurements of one forwarder process (see the module).

    The loop tells it when each poll starts (:meth:`poll_started`), what the loop then meant to
    wait (:meth:`expect`), and each document observed (:meth:`observed`); it asks for the
    measurement of an event that completed (:meth:`measurement`), which to keep on disk
    (:meth:`keep_only`) and whether the state should be saved now (:meth:`wants_save`)."""

    def __init__(
        self,
        saved: Mapping[str, Impact] | None = None,
        *,
        last_observed: datetime | None = None,
    ) -> None:
        """``saved``: the measurements in the state file; ``last_observed``: the time of the
        observation the state file holds (the start of a reboot gap)."""
        self.impacts: dict[str, Impact] = dict(saved or {})
        self._resumed_from = last_observed
        self._last_start: tuple[float, datetime] | None = None
        self._expected = 0.0
        self._gap = 0.0  # blind time before the poll in progress, beyond the schedule
        self._last_save: float | None = None

    def poll_started(self, monotonic: float, wall: datetime) -> None:
        if self._last_start is not None:
            mono_before, wall_before = self._last_start
            jump = max(monotonic - mono_before, (wall - wall_before).total_seconds())
            self._gap = min(MAX_SECONDS, max(0.0, jump - self._expected))
        self._last_start = (monotonic, wall)

    def expect(self, seconds: float) -> None:
        """The wait the loop means to keep before the next poll starts."""
        self._expected = max(0.0, seconds)

    def observed(
        self,
        known: Mapping[str, ScheduledEvent],
        events: Iterable[ScheduledEvent],
        vm_name: str,
        now: datetime,
    ) -> None:
        """A successful poll at ``now`` read ``events``; ``known`` is what the previous
        observation (or the state file, on the first poll of a process) showed."""
        current = {event.key: event for event in events}
        if self._resumed_from is not None:
            gap = min(MAX_SECONDS, max(0.0, (now - self._resumed_from).total_seconds()))
            for key, event in known.items():
                if names_vm(event, vm_name) and is_on(event, now):
                    self._keep(key, Impact(gap, REBOOT_GAP))
        self._resumed_from = None
        for key, event in current.items():
            before = known.get(key)
            was_started = before is not None and before.is_started
            if names_vm(event, vm_name) and (event.is_started or was_started):
                self._keep(key, Impact(self._gap if was_started else 0.0, FREEZE_PAUSE))
        for key, before in known.items():
            if key not in current and before.is_started and names_vm(before, vm_name):
                self._keep(key, Impact(self._gap, FREEZE_PAUSE))  # the gap it ended in
        self._gap = 0.0

    def _keep(self, key: str, impact: Impact) -> None:
        held = self.impacts.get(key)
        if held is None or impact.seconds > held.seconds:
            self.impacts[key] = impact

    def measurement(self, key: str) -> Impact | None:
        """The measurement of an event (for its Completed)."""
        return self.impacts.get(key)

    def keep_only(self, keys: Iterable[str]) -> dict[str, Impact]:
        """Forget the events that ended (their Completed is recorded); returns what is left,
        for the state file. Until then a Completed derived again (its outbox write failed, or
        a crash came before the state was saved) carries the same measurement."""
        keep = set(keys)
        self.impacts = {k: v for k, v in self.impacts.items() if k in keep}
        return dict(self.impacts)

    def wants_save(
        self, events: Iterable[ScheduledEvent], vm_name: str, now: datetime, monotonic: float
    ) -> bool:
        """Whether to save the state now so that a hard stop keeps the last poll's time: a
        watched event is on or due, and the last save is :data:`PERSIST_EVERY` s old."""
        if self._last_save is not None and monotonic - self._last_save < PERSIST_EVERY:
            return False
        return any(names_vm(e, vm_name) and _due(e, now) for e in events)

    def saved(self, monotonic: float) -> None:
        self._last_save = monotonic
