"""Helpers for the tests of the forwarder's local actions (hooks, drain probe)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sebridge import lifecycle
from sebridge.contract.events import Envelope, Observer, Transition
from sebridge.forwarder.local.actions import LocalActions
from sebridge.forwarder.local.drain_probe import DrainProbe
from sebridge.forwarder.local.hooks_file import HooksFile
from sebridge.forwarder.local.journal import Journal
from sebridge.forwarder.local.preparation import Observed, Preparations
from sebridge.forwarder.local.store import LocalStore
from sebridge.forwarder.local.worker import HookWorker
from sebridge.imds import Document, ScheduledEvent

VM = "web-1"
OBSERVER = Observer(
    vm_name=VM,
    vm_id="6b1d7c55-0000-4000-8000-000000000001",
    resource_id="/subscriptions/00000000-0000-4000-8000-0000000000de/resourceGroups/rg-web"
    "/providers/Microsoft.Compute/virtualMachines/web-1",
    subscription_id="00000000-0000-4000-8000-0000000000de",
    resource_group="rg-web",
)


def imds_event(
    event_id: str,
    *,
    event_type: str = "Reboot",
    status: str = "Scheduled",
    resources: Sequence[Any] = (VM,),
    duration: int = -1,
    not_before: str = "Sun, 22 Nov 2026 10:05:00 GMT",
) -> ScheduledEvent:
    return ScheduledEvent.from_imds(
        {
            "EventId": event_id,
            "EventType": event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(resources),
            "EventStatus": status,
            "NotBefore": "" if status == "Started" else not_before,
            "EventSource": "Platform",
            "DurationInSeconds": duration,
        },
        strict=False,
    )


def observed(
    transition: str,
    event_id: str = "11111111-1111-4111-8111-111111111111",
    *,
    appearance: int = 1,
    suffix: str = "",
    **fields: Any,
) -> Observed:
    status = "Started" if transition in ("Started", "Completed") else "Scheduled"
    event = imds_event(event_id, status=fields.pop("status", status), **fields)
    message_id = lifecycle.message_id(
        lifecycle.event_ref(event_id),
        transition,
        appearance,
        digest=lifecycle.content_digest(event) if transition == "Updated" else None,
        occurrence=1 if transition == "Updated" else None,
    )
    return Observed(Transition(transition), event, message_id + suffix, OBSERVER, 7)


class Recorder:
    """The forwarder's outbox as the preparations see it (``deliver``): keeps each envelope and
    says it is durably taken, or refuses while ``full`` (a full disk)."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []
        self.full = False
        self.refused = 0

    def __call__(self, envelope: Envelope) -> bool:
        if self.full:
            self.refused += 1
            return False
        self.envelopes.append(envelope)
        return True


class Parts:
    """The local actions' pieces as build_local_actions composes them, on a journal in
    ``directory``, without a hooks file or a probe unless given (the worker is not started)."""

    def __init__(
        self,
        directory: Path | str,
        hooks: HooksFile | None = None,
        probe: DrainProbe | None = None,
        **worker: Any,
    ) -> None:
        self.outbox = Recorder()
        self.journal = Journal(directory)
        self.store = LocalStore(self.journal)
        self.store.load()
        self.preparations = Preparations(self.store, self.outbox)
        self.worker = HookWorker(hooks, self.store, self.preparations, **worker) if hooks else None
        self.probe = probe
        if probe is not None:
            probe.preparations = self.preparations
        self.preparations.preparers = [p for p in (self.worker, probe) if p is not None]
        self.actions = LocalActions(self.store, self.preparations, self.worker, probe)

    def apply(self, *items: Observed) -> None:
        """Record each transition as a document calling for it would (one flush each), queue
        its hooks and decide Prepared: the worker's and the preparations' side of
        LocalActions.document_observed, for tests that speak in transitions."""
        for item in items:
            with self.store.lock:
                self.preparations.observe(item)
                jobs = []
                if self.worker is not None:
                    runs = self.store.add_runs(self.worker.runs_for(item))
                    jobs = [self.worker.job(run, item) for run in runs]
                self.store.flush()
            if self.worker is not None:
                self.worker.queue(jobs)
            self.preparations.check(item.event.key)


def root_dir(base: Path, name: str = "etc") -> Path:
    """A directory the hooks-file check accepts (root-owned, 0755, under root-owned dirs)."""
    directory = base / name
    directory.mkdir(mode=0o755, exist_ok=True)
    os.chmod(base, 0o755)
    return directory


def write_hooks(directory: Path, hooks: list[dict[str, Any]]) -> Path:
    path = directory / "hooks.json"
    path.write_text(json.dumps({"schemaVersion": 1, "hooks": hooks}))
    os.chmod(path, 0o644)
    return path


def script(directory: Path, name: str, body: str) -> str:
    """An executable shell script (absolute path) for a hook's command."""
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def document(*events: ScheduledEvent, incarnation: int = 1) -> Document:
    return Document.from_imds(
        {"DocumentIncarnation": incarnation, "Events": [e.to_imds() for e in events]}
    )
