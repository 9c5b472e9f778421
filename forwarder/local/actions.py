"""Actions on the VM itself, plugged into the forwarder's loop: hooks and the drain probe.

:class:`LocalActions` is a loop listener: the poller hands it every batch of transitions it
derived (``transitions_recorded``), and it passes each one that concerns this VM to the
preparations, the hooks worker and the drain probe, in that order, under the preparations'
lock. Nothing here waits for a hook or a client: hooks run on the hooks worker's threads, the
probe on its own. ``Prepared`` goes through ``enqueue``, the forwarder's outbox.

Their flags and settings are :mod:`sebridge.forwarder.local.settings`; the forwarder imports
this module only when one of them is set.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sebridge.contract.events import Envelope, Observer, Transition
from sebridge.forwarder.local.drain_probe import DrainProbe, ProbeError
from sebridge.forwarder.local.hooks_file import HooksFile, HooksFileError, load_hooks
from sebridge.forwarder.local.journal import Journal, JournalError
from sebridge.forwarder.local.preparation import Observed, Preparations
from sebridge.forwarder.local.settings import (  # re-exported: the settings' old home
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_PROBE_ADDRESS,
    NO_LOCAL_ACTIONS,
    LocalActionsError,
    LocalSettings,
    add_arguments,
    settings_from_args,
)
from sebridge.forwarder.local.worker import HookWorker
from sebridge.imds import ScheduledEvent

__all__ = [
    "DEFAULT_DRAIN_SECONDS",
    "DEFAULT_PROBE_ADDRESS",
    "NO_LOCAL_ACTIONS",
    "LocalActions",
    "LocalActionsError",
    "LocalSettings",
    "add_arguments",
    "build_local_actions",
    "settings_from_args",
]

log = logging.getLogger("forwarder.local")


class LocalActions:
    """The loop listener (``transitions_recorded``/``polled``) and the workers to run."""

    def __init__(
        self,
        journal: Journal,
        preparations: Preparations,
        hooks: HookWorker | None,
        probe: DrainProbe | None,
    ) -> None:
        self.journal = journal
        self.preparations = preparations
        self.hooks = hooks
        self.probe = probe
        # What the forwarder knows now (its events and its observer), for :meth:`reconcile`
        # after the first successful poll; set by the composition root.
        self.current: Callable[[], tuple[Mapping[str, ScheduledEvent], Observer]] | None = None
        self._reconciled = False

    # -- the listener -----------------------------------------------------------------------
    def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
        for envelope in envelopes:
            observed = Observed.from_envelope(envelope)
            if observed is not None:
                self.observe(observed)

    def polled(self, health: object) -> None:
        """After the first successful poll: :meth:`reconcile` with what the forwarder knows."""
        if self._reconciled or self.current is None:
            return
        if getattr(health, "last_successful_poll", None) is None:
            return
        self._reconciled = True
        try:
            events, observer = self.current()
            self.reconcile(events, observer)
        except Exception:
            log.exception("reconciling the local actions failed; going on")

    def reconcile(self, events: Mapping[str, ScheduledEvent], observer: Observer) -> None:
        """Close the window between the forwarder's state file and the journal (a crash between
        the two writes): an event the journal still has open but the forwarder no longer knows
        ended unseen, and an impactful event of this VM the forwarder knows is drained for,
        whatever the journal says."""
        try:
            open_keys = [p.event_key for p in self.journal.open_preparations()]
        except JournalError as exc:
            log.error("cannot read the journal: %s", exc)
            open_keys = []
        for key in open_keys:
            if key not in events:
                log.info("event %s ended while the forwarder was down: local actions end", key)
                with self.preparations.observing():
                    try:
                        self.journal.end(key)
                    except JournalError as exc:
                        log.error("cannot journal the end of %s: %s", key, exc)
                    if self.probe is not None:
                        self.probe.forget(key)
        if self.probe is not None:
            self.probe.restore(
                Observed(
                    Transition.STARTED if event.is_started else Transition.SCHEDULED,
                    event,
                    "",
                    observer,
                )
                for event in events.values()
            )

    def observe(self, observed: Observed) -> None:
        """One transition, on the poller's thread. Never raises, never waits on a hook."""
        try:
            with self.preparations.observing():
                try:
                    self.preparations.observe(observed)
                except JournalError as exc:
                    log.error("cannot journal %s: %s", observed.message_id, exc)
                if self.hooks is not None:
                    self.hooks.observe(observed)
                if self.probe is not None:
                    self.probe.observe(observed)
                if observed.transition in (Transition.SCHEDULED, Transition.UPDATED):
                    self.preparations.check(observed.event.key)
        except Exception:
            log.exception("local actions for %s failed; going on", observed.message_id)

    # -- lifecycle --------------------------------------------------------------------------
    def workers(self, stop: threading.Event) -> tuple[Callable[[], None], ...]:
        """The threads to run beside the poller (each returns once ``stop`` is set)."""
        out: list[Callable[[], None]] = []
        hooks, probe = self.hooks, self.probe
        if hooks is not None:

            def hooks_worker() -> None:
                hooks.run(stop)

            out.append(hooks_worker)
        if probe is not None:

            def drain_probe() -> None:
                probe.serve(stop)

            out.append(drain_probe)
        return tuple(out)

    def resume(self) -> None:
        """At start, before the first poll: drain again, run again what was cut short, and
        publish what was prepared but not yet published."""
        if self.probe is not None:
            restored = []
            try:
                for record in self.journal.open_preparations():
                    try:
                        restored.append(
                            Observed.from_payload(
                                Transition.SCHEDULED, record.cause or "", record.payload
                            )
                        )
                    except ValueError as exc:
                        log.error("damaged preparation record %s: %s", record.event_key, exc)
            except JournalError as exc:
                log.error("cannot read the journal: %s", exc)
            self.probe.restore(restored)
        if self.hooks is not None:
            self.hooks.resume()
        self.preparations.check_all()

    def heartbeat_health(self) -> dict[str, Any]:
        """What a Heartbeat carries about local actions: only what is wrong."""
        out: dict[str, Any] = {}
        if self.hooks is not None:
            out.update(self.hooks.health())
        if self.preparations.failed_count:
            out["notPrepared"] = self.preparations.failed_count
        return out

    def close(self) -> None:
        self.journal.close()


def build_local_actions(
    settings: LocalSettings,
    state_dir: Path,
    enqueue: Callable[[Envelope], None],
    *,
    trusted_owners: Sequence[int] = (0,),
    base_env: Mapping[str, str] | None = None,
) -> LocalActions | None:
    """The composition of the local actions; None when none is configured. Raises
    :class:`LocalActionsError` with what stops the start: a refused or invalid hooks file, a
    probe port that cannot be bound, a journal that cannot be opened."""
    if not settings.enabled:
        return None
    hooks_file: HooksFile | None = None
    if settings.hooks_file is not None:
        try:
            hooks_file = load_hooks(settings.hooks_file, trusted_owners)
        except HooksFileError as exc:
            raise LocalActionsError(str(exc)) from exc
        if os.geteuid() == 0:
            log.warning("the forwarder runs as root, so its hooks do: run it as its own user")
    try:
        journal = Journal(state_dir)
    except JournalError as exc:
        raise LocalActionsError(f"hook journal: {exc}") from exc
    preparations = Preparations(journal, enqueue)
    hooks = HookWorker(hooks_file, journal, preparations, base_env=base_env) if hooks_file else None
    probe: DrainProbe | None = None
    if settings.probe_port is not None:
        probe = DrainProbe(
            settings.impact,
            settings.drain_seconds,
            preparations=preparations,
            upstream=settings.probe_upstream,
        )
        try:
            address, port = probe.bind(settings.probe_address, settings.probe_port)
        except ProbeError as exc:
            journal.close()
            raise LocalActionsError(str(exc)) from exc
        log.info("drain probe listening on %s:%d", address, port)
    preparations.preparers = [p for p in (hooks, probe) if p is not None]
    if hooks_file is not None:
        log.info("hooks: %s", hooks_file.describe())
    return LocalActions(journal, preparations, hooks, probe)
