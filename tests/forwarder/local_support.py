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
from sebridge.forwarder.local.preparation import Observed
from sebridge.imds import ScheduledEvent

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
    resources: Sequence[str] = (VM,),
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
        }
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
    """What the forwarder's outbox would get (the ``enqueue`` of the preparations)."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []

    def __call__(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)


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
