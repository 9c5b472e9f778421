"""Events for the IMDS simulator (`sebridge imds-sim`) in tests that run the real forwarder."""

from __future__ import annotations

import uuid

from emulators.imds.testing import RunningSimulator

VM = "vmss_vm1"  # the simulator's VM
# 4 minutes: shorter than the default leads (Reboot and Redeploy 5 min) and the probe's bound,
# so the event is acted on at first sight.
NOTICE = 240


def add_event(
    sim: RunningSimulator,
    *,
    event_type: str = "Reboot",
    resources: list[str] | None = None,
    not_before_in: float = NOTICE,
    duration: int = -1,
) -> str:
    """Add a Scheduled platform event for ``resources`` (this VM by default); its EventId."""
    event_id = str(uuid.uuid4())
    sim.event(
        "add",
        notBeforeIn=not_before_in,
        event={
            "EventId": event_id,
            "EventType": event_type,
            "ResourceType": "VirtualMachine",
            "Resources": [VM] if resources is None else resources,
            "EventStatus": "Scheduled",
            "EventSource": "Platform",
            "DurationInSeconds": duration,
            "Description": "Host maintenance",
        },
    )
    return event_id
