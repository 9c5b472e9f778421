"""Actions on the VM itself, plugged into the forwarder's loop: hooks and the drain probe.

:class:`LocalActions` is a consumer of IMDS documents in its own right, not of the delivery
path: the poller hands it every document it read (``document_observed``), before and
independently of the outbox and the state file. It keeps its own view of the events (in
memory and in its journal, :mod:`sebridge.forwarder.local.store`), diffs each document against
it with the forwarder's own diff and message ids, and commits in one journal transaction the
new view with the hook runs and preparation changes the transitions call for. A crash before
that commit derives the same transitions (same ids) again after the restart; after it, the
pending runs resume. The drain probe follows the document itself. Nothing here waits for a
hook or a client: hooks run on the hooks worker's threads, the probe on its own. ``Prepared``
goes through ``deliver``, the forwarder's outbox.

Their flags and settings are :mod:`sebridge.forwarder.local.settings`; the forwarder imports
this module only when one of them is set.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sebridge import lifecycle
from sebridge.contract.events import Envelope, Observer
from sebridge.forwarder.imds.diff import diff, remember
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
from sebridge.forwarder.local.store import LocalStore, View
from sebridge.forwarder.local.worker import HookWorker
from sebridge.forwarder.state import ForwarderState, bounded_lives
from sebridge.imds import Document, isoformat_utc

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
    """A consumer of IMDS documents in its own right (``document_observed``), with its own view
    of the events in the store, and the workers to run."""

    def __init__(
        self,
        store: LocalStore,
        preparations: Preparations,
        hooks: HookWorker | None,
        probe: DrainProbe | None,
    ) -> None:
        self.store = store
        self.journal = store.journal
        self.preparations = preparations
        self.hooks = hooks
        self.probe = probe

    # -- the listener -----------------------------------------------------------------------
    def document_observed(
        self, document: Document, observer: Observer, observed_at: datetime
    ) -> list[Observed]:
        """Every document a poll read, on the poller's thread, before the forwarder writes
        anything: diff it against the local view (the forwarder's diff and message ids), and
        in one journal transaction record the new view with the hook runs and preparation
        changes its transitions call for; then run those hooks and let the probe follow the
        document. Never waits on a hook; a journal that cannot be written delays nothing.
        Returns the transitions derived (for tests)."""
        observed: list[Observed] = []
        jobs = []
        with self.store.lock:
            view = self.store.view
            changes = diff(view.events, document, observed_at, last_seen=view.observed_at)
            lives = dict(view.lives)
            for change in changes:
                key = change.event.key
                life, message_id = lifecycle.advance(
                    lives.pop(key, None), change.transition.value, change.event
                )
                lives[key] = life  # re-inserted: the most recently touched come last
                observed.append(
                    Observed(
                        change.transition, change.event, message_id, observer, document.incarnation
                    )
                )
            present = {event.key for event in document.events}
            self.store.set_view(
                View(
                    remember(view.events, document.events),
                    bounded_lives(lives, present),
                    observed_at,
                    document.incarnation,
                    observer,
                ),
                # Like the forwarder's state file: written when something changed (and at stop).
                persist=bool(changes) or document.incarnation != view.incarnation,
            )
            if self.probe is not None:
                self.probe.follow(document.events, observer)
            for item in observed:
                self.preparations.observe(item)
                if self.hooks is not None:
                    for run in self.store.add_runs(self.hooks.runs_for(item)):
                        jobs.append(self.hooks.job(run, item))
            self.store.flush()  # the one transaction; on failure all of it stays dirty
        for item in observed:
            log.debug("local actions: %s %s", item.transition.value, item.message_id)
        if self.hooks is not None:
            self.hooks.queue(jobs)
        self.preparations.check_all()
        return observed

    def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
        """Not used: the local actions follow the documents, not the delivery path."""

    def polled(self, health: object) -> None:
        """After every poll tick: a journal that could not be written is tried again even
        when IMDS did not answer."""
        if self.store.behind_since is not None:
            self.store.flush()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, fallback: ForwarderState | None = None) -> None:
        """At start, before the first poll: read the journal (a journal without a view takes
        the forwarder's state as its view), drain again for what the view shows, queue the
        hooks a crash cut short, and publish what was prepared but not yet published."""
        if not self.store.load() and fallback is not None:
            log.info(
                "local actions: no view in the journal yet: starting from the forwarder's state"
            )
            self.store.set_view(View.of(fallback))
            self.store.flush()
        view = self.store.view
        if self.probe is not None and view.observer is not None:
            self.probe.follow(view.events.values(), view.observer)
            if self.probe.draining:
                log.info("draining again after a restart, from the journal's view")
        if self.hooks is not None:
            self.hooks.resume()
        self.preparations.check_all()

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

    def heartbeat_health(self) -> dict[str, Any]:
        """What a Heartbeat carries about local actions: only what is wrong."""
        out: dict[str, Any] = {}
        if self.hooks is not None:
            out.update(self.hooks.health())
        if self.preparations.failed_count:
            out["notPrepared"] = self.preparations.failed_count
        if self.store.behind_since is not None:
            out["journalWriteFailing"] = True
            out["journalWriteFailingSince"] = isoformat_utc(self.store.behind_since)
        return out

    def close(self) -> None:
        """At stop: keep when the last poll was (the view), then close the journal."""
        self.store.persist_view()
        self.store.flush()
        self.journal.close()


def build_local_actions(
    settings: LocalSettings,
    state_dir: Path,
    deliver: Callable[[Envelope], bool],
    *,
    trusted_owners: Sequence[int] = (0,),
    base_env: Mapping[str, str] | None = None,
) -> LocalActions | None:
    """The composition of the local actions; None when none is configured. ``deliver`` hands
    Prepared to the forwarder's outbox (True once it is durably there). Raises
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
    store = LocalStore(journal)
    preparations = Preparations(store, deliver)
    hooks = HookWorker(hooks_file, store, preparations, base_env=base_env) if hooks_file else None
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
    return LocalActions(store, preparations, hooks, probe)
