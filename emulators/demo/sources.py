"""Where the demo's scheduled events come from: the forwarder, Event Grid, or both.

``sebridge demo --source eventgrid`` runs a maintenance event with no forwarder at all: Azure's
side of the event is the IMDS simulator's ground truth, and :class:`PlatformEventGrid` publishes
every new state of every event to the functions host's Event Grid webhook, as the system topic
``Microsoft.ResourceNotifications.MaintenanceResources`` delivers to the ingestion function.
The approval gate acknowledges the event through ARM (the VM is agentless by settings), and
:class:`AcknowledgementsToPlatform` plays Azure honouring that acknowledgement: it starts the
event in the simulator, as an IMDS StartRequests would. ``--source both`` runs the forwarder as
well: every transition then reaches the topic twice under one message id, and the topic's
duplicate detection keeps one. Event Grid's occasional double delivery is played too
(``duplicates``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from emulators.fakes.eventgrid import (
    EventGridDeliveryError,
    EventGridPublisher,
    PlatformView,
    notification,
    scheduled_event_id,
)

SOURCES = ("forwarder", "eventgrid", "both")
FUNCTION = "eventgrid_ingest"
STATE_CONTAINER = "sebridge-eventgrid-state"
log = logging.getLogger("sebridge.demo.eventgrid")


def webhook_url(host_url: str) -> str:
    return f"{host_url}/runtime/webhooks/EventGrid?functionName={FUNCTION}"


def app_settings(source: str, blob_endpoint: str, group: str) -> dict[str, str]:
    """What the Function App needs for ``source``: the ingestion and its records (a container
    at ``blob_endpoint``, Azurite in the demo); with Event Grid alone, the demo's resource group
    runs without forwarders (the gate acknowledges through ARM)."""
    if source == "forwarder":
        return {}
    settings = {
        "EVENTGRID_INGEST_ENABLED": "true",
        "EVENTGRID_STATE_URL": f"{blob_endpoint}/{STATE_CONTAINER}",
    }
    if source == "eventgrid":
        settings["AGENTLESS_RESOURCE_GROUPS"] = group
    return settings


class PlatformEventGrid(threading.Thread):
    """Polls the simulator's document (Azure's truth, not an IMDS poll) and delivers the
    notifications Event Grid publishes for each change; ``report(text)`` narrates."""

    def __init__(
        self,
        sim: Any,  # emulators.imds.testing.SimClient
        publisher: EventGridPublisher,
        *,
        subscription: str,
        group: str,
        vm_name: str,
        report: Callable[[str], None] = lambda _: None,
        duplicates: bool = True,
        interval: float = 0.1,
    ) -> None:
        super().__init__(name="platform-event-grid", daemon=True)
        self.sim, self.publisher = sim, publisher
        self.subscription, self.group, self.vm_name = subscription, group, vm_name
        self.report, self.duplicates, self.interval = report, duplicates, interval
        self.view = PlatformView()
        self.stop_event = threading.Event()
        self.delivered: list[dict[str, Any]] = []
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                document = self.sim.state()["document"]
            except (OSError, RuntimeError, KeyError) as exc:
                log.debug("simulator state unavailable: %s", exc)
                continue
            for properties in self.view.changes(document):
                self._publish(properties)

    def _publish(self, properties: dict[str, Any]) -> None:
        body = notification(
            properties,
            resource_id=scheduled_event_id(
                self.subscription, self.group, self.vm_name, properties["EventId"]
            ),
            event_time=datetime.now(UTC),
        )
        short = f"{properties['EventStatus']:<9} {str(properties['EventId'])[:8]}"
        for copy in range(2 if self.duplicates else 1):
            try:
                statuses = self.publisher.deliver([body])
            except EventGridDeliveryError as exc:
                self.failures.append(str(exc))
                self.report(f"{short} not delivered: {exc}")
                return
            again = " (delivered again, as Event Grid may)" if copy else ""
            self.report(f"{short} -> HTTP {statuses[0]}{again}")
        self.delivered.append(body)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


class AcknowledgementsToPlatform(threading.Thread):
    """Azure honouring an acknowledgement made through ARM: the event starts now, exactly as
    after an IMDS StartRequests (the simulator's approval)."""

    def __init__(
        self,
        arm: Any,  # emulators.fakes.arm.FakeArm
        sim: Any,  # emulators.imds.testing.SimClient
        report: Callable[[str], None] = lambda _: None,
        interval: float = 0.05,
    ) -> None:
        super().__init__(name="platform-acknowledgements", daemon=True)
        self.arm, self.sim, self.report, self.interval = arm, sim, report, interval
        self.stop_event = threading.Event()
        self.honoured: list[str] = []

    def run(self) -> None:
        seen = 0
        while not self.stop_event.wait(self.interval):
            with self.arm.lock:
                new = list(self.arm.acknowledged[seen:])
            seen += len(new)
            for _vm, event_id in new:
                try:
                    status = self.sim.approve(event_id)
                except OSError as exc:
                    self.report(f"acknowledgement of {event_id[:8]} not passed on: {exc}")
                    continue
                self.honoured.append(event_id)
                self.report(f"ARM acknowledge {event_id[:8]} honoured: the event starts ({status})")

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=5)


def start_event_grid(
    host_url: str,
    sim: Any,
    arm: Any,
    *,
    subscription: str,
    group: str,
    vm_name: str,
    report: Callable[[str], None],
    deadline: float = 30.0,
    start_clock: bool = False,
) -> tuple[PlatformEventGrid, AcknowledgementsToPlatform]:
    """Validate the event subscription against the host (as Event Grid does when it is
    created; retried until the host answers) and start publishing. ``start_clock``: nobody
    polls IMDS (no forwarder), so one read starts a simulator run with --start-on-first-poll."""
    publisher = EventGridPublisher(webhook_url(host_url), retry_delays=(0.2, 0.5, 1.0))
    until = time.monotonic() + deadline
    while True:
        try:
            publisher.validate()
            break
        except (EventGridDeliveryError, OSError) as exc:
            if time.monotonic() > until:
                raise EventGridDeliveryError(f"the host never took the handshake: {exc}") from exc
            time.sleep(0.2)
    report("event subscription validated (SubscriptionValidation handshake)")
    if start_clock:
        sim.document()
    platform = PlatformEventGrid(
        sim, publisher, subscription=subscription, group=group, vm_name=vm_name, report=report
    )
    acknowledgements = AcknowledgementsToPlatform(arm, sim, report)
    platform.start()
    acknowledgements.start()
    return platform, acknowledgements


PER_CAUSE = ("Updated", "Prepared", "Held", "Measured")  # more than one per appearance


def one_message_per_transition(seen: list[dict[str, Any]]) -> list[str]:
    """Problems when one transition reached the topic more than once (empty: none did).

    ``seen`` items carry ``event``, ``transition`` and ``message_id``. Scheduled, Started and
    the ends happen once per appearance of an event (``<ref>:<Transition>:<appearance>``); an
    Updated once per resulting content, a Prepared or Held once per message that caused it
    (``<ref>:<T>:<appearance>:<cause digest>``: a Scheduled, then an Updated that added VMs), a
    Measured once per VM: those are counted by their whole id. Two copies of one transition
    under different ids would mean the two sources disagreed on the id and duplicate detection
    could not help."""
    counts: dict[tuple[str, ...], int] = {}
    for item in seen:
        message_id = str(item.get("message_id") or "")
        parts = message_id.split(":")
        if item["transition"] in PER_CAUSE:
            key: tuple[str, ...] = (item["event"].key, message_id)
        else:
            appearance = parts[2] if len(parts) > 2 else "?"
            key = (item["event"].key, item["transition"], appearance)
        counts[key] = counts.get(key, 0) + 1
    return [
        f"{' '.join(key[1:])} of {key[0][:8]} reached the topic {n} times"
        for key, n in counts.items()
        if n > 1
    ]


def verdict(source: str, seen: list[dict[str, Any]]) -> list[str]:
    """What the source adds to the demo's verdict: with both sources, one message per
    transition."""
    return one_message_per_transition(list(seen)) if source == "both" else []


def summary(source: str, seen: list[dict[str, Any]]) -> list[str]:
    if source == "forwarder":
        return []
    lines = [f"{len(seen)} message(s) on the topic, one per transition"]
    if source == "eventgrid":
        lines.append("no forwarder ran: Event Grid carried every state, ARM took the approvals")
    else:
        lines.append(
            "forwarder and Event Grid published each transition under the same message id; "
            "the topic's duplicate detection kept one"
        )
    return lines
