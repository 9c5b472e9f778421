"""A fake Event Grid: scheduled-event notifications, delivered to a webhook as Event Grid does.

Notifications follow Microsoft's "Scheduled Events in Event Grid" page: event type
``Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted``, topic (or
CloudEvents ``source``) ``/subscriptions/{id}``, subject and ``data.resourceInfo.id`` the
scheduled event's ARM id, the IMDS fields under ``data.resourceInfo.properties`` (plus
``ScheduledEventApiVersion``), ``data.operationalInfo.resourceEventTime`` and ``data.apiVersion``.

:class:`EventGridPublisher` plays one event subscription delivering to one endpoint (e.g. the
local functions host's ``/runtime/webhooks/EventGrid?functionName=<name>``):

- :meth:`~EventGridPublisher.validate` does the handshake first: for the Event Grid schema a
  ``Microsoft.EventGrid.SubscriptionValidationEvent`` POST with ``aeg-event-type:
  SubscriptionValidation``, answered 200 with ``{"validationResponse": <code>}``; for the
  CloudEvents schema the CloudEvents abuse-protection ``OPTIONS`` with ``WebHook-Request-Origin``,
  answered 200 with ``WebHook-Allowed-Origin``.
- :meth:`~EventGridPublisher.deliver` POSTs events with ``aeg-event-type: Notification``,
  ``aeg-subscription-name``, ``aeg-delivery-count`` (attempts before this one),
  ``aeg-metadata-version`` and ``aeg-data-version``: the Event Grid schema as a JSON array,
  CloudEvents one event per request (``application/cloudevents+json``) or as a batch
  (``application/cloudevents-batch+json``). A 2xx is delivered; 400, 401, 403 and 413 are
  not retried (Event Grid dead-letters or drops those); anything else, and connection errors,
  are retried after ``retry_delays`` (Event Grid's own schedule starts at 10 s; here it is
  shortened and bounded), up to ``max_attempts``.
Every attempt is recorded in ``deliveries``. Only loopback endpoints are accepted.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import requests

from sebridge.values import is_loopback

EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
VALIDATION_EVENT_TYPE = "Microsoft.EventGrid.SubscriptionValidationEvent"
EVENT_GRID_SCHEMA = "EventGridSchema"
CLOUD_EVENT_SCHEMA = "CloudEventSchemaV1_0"
SCHEMAS = (EVENT_GRID_SCHEMA, CLOUD_EVENT_SCHEMA)
ORIGIN = "eventgrid.azure.net"
NOT_RETRIED = frozenset({400, 401, 403, 413})


class EventGridDeliveryError(Exception):
    """The endpoint failed the handshake, or refused or never took a delivery."""


def iso(moment: datetime) -> str:
    """Event Grid's spelling: UTC with seven fractional digits and ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"


def scheduled_event_id(
    subscription: str, group: str, name: str, event_id: str, kind: str = "virtualMachines"
) -> str:
    """The ARM id of a scheduled event under a VM (or ``virtualMachineScaleSets``,
    ``availabilitySets``)."""
    return (
        f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Compute/"
        f"{kind}/{name}/providers/Microsoft.Maintenance/scheduledEvents/{event_id}"
    )


def notification(
    properties: Mapping[str, Any],
    *,
    resource_id: str,
    event_time: datetime,
    schema: str = EVENT_GRID_SCHEMA,
    location: str = "westeurope",
    event_grid_id: str | None = None,
    operational_info: bool = True,
) -> dict[str, Any]:
    """One ScheduledEventEmitted notification for ``properties`` (the IMDS fields)."""
    subscription = resource_id.split("/")[2]
    data: dict[str, Any] = {
        "resourceInfo": {
            "id": resource_id,
            "name": properties.get("EventId"),
            "type": "microsoft.maintenance/scheduledevents",
            "location": location,
            "properties": {**properties, "ScheduledEventApiVersion": "2020-07-01"},
        },
        "apiVersion": "2024-07-01",
    }
    if operational_info:
        data["operationalInfo"] = {"resourceEventTime": iso(event_time)}
    topic = f"/subscriptions/{subscription}"
    ident = event_grid_id or str(uuid.uuid4())
    if schema == CLOUD_EVENT_SCHEMA:
        return {
            "specversion": "1.0",
            "id": ident,
            "source": topic,
            "subject": resource_id,
            "type": EVENT_TYPE,
            "time": iso(event_time),
            "data": data,
        }
    return {
        "id": ident,
        "topic": topic,
        "subject": resource_id,
        "data": data,
        "eventType": EVENT_TYPE,
        "dataVersion": "1",
        "metadataVersion": "1",
        "eventTime": iso(event_time),
    }


class PlatformView:
    """Azure's side of an event: successive IMDS documents (the ground truth the simulator
    holds) -> the states Event Grid publishes. Every new or changed event is published with its
    status; an event that leaves is published once more as Completed (it had started) or
    Canceled (it had not). Keys are EventIds in lower case, as IMDS's are case-insensitive."""

    def __init__(self) -> None:
        self.known: dict[str, dict[str, Any]] = {}

    def changes(self, document: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        current: dict[str, dict[str, Any]] = {}
        for event in document.get("Events", []):
            key = str(event["EventId"]).lower()
            current[key] = dict(event)
            if self.known.get(key) != current[key]:
                out.append(dict(event))
        for key, before in self.known.items():
            if key not in current:
                ran = before.get("EventStatus") == "Started"
                out.append(
                    dict(
                        before,
                        EventStatus="Completed" if ran else "Canceled",
                        NotBefore="" if ran else before.get("NotBefore", ""),
                    )
                )
        self.known = current
        return out


@dataclass(frozen=True)
class Attempt:
    event_ids: tuple[str, ...]
    delivery_count: int  # attempts before this one (aeg-delivery-count)
    status: int | None  # None: no answer (connection error or timeout)
    seconds: float
    detail: str = ""


@dataclass
class EventGridPublisher:
    endpoint: str
    schema: str = EVENT_GRID_SCHEMA
    subscription_name: str = "sebridge-eventgrid-ingest"
    max_attempts: int = 4
    retry_delays: Sequence[float] = (0.2, 0.5, 1.0)
    timeout: float = 10.0
    batch: bool = False  # CloudEvents: one request per event unless batched
    deliveries: list[Attempt] = field(default_factory=list)
    session: requests.Session = field(default_factory=requests.Session)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        host = urlsplit(self.endpoint).hostname or ""
        if not is_loopback(host):
            raise ValueError(f"the fake Event Grid delivers to loopback only, not {host!r}")
        if self.schema not in SCHEMAS:
            raise ValueError(f"schema must be one of {SCHEMAS}")
        if not 1 <= self.max_attempts <= 30:
            raise ValueError("max_attempts must be 1..30")

    # -- handshake ------------------------------------------------------------------------
    def validate(self) -> None:
        """The subscription's endpoint validation; raises EventGridDeliveryError."""
        if self.schema == CLOUD_EVENT_SCHEMA:
            response = self.session.options(
                self.endpoint,
                headers={"WebHook-Request-Origin": ORIGIN, "WebHook-Request-Rate": "120"},
                timeout=self.timeout,
            )
            allowed = response.headers.get("WebHook-Allowed-Origin", "")
            if response.status_code != 200 or allowed not in (ORIGIN, "*"):
                raise EventGridDeliveryError(
                    f"CloudEvents handshake: HTTP {response.status_code}, "
                    f"WebHook-Allowed-Origin {allowed!r}"
                )
            return
        code = str(uuid.uuid4())
        event = {
            "id": str(uuid.uuid4()),
            "topic": "/subscriptions/00000000-0000-0000-0000-000000000000",
            "subject": "",
            "data": {"validationCode": code, "validationUrl": "https://127.0.0.1:9/validate"},
            "eventType": VALIDATION_EVENT_TYPE,
            "eventTime": iso(datetime.now(UTC)),
            "metadataVersion": "1",
            "dataVersion": "2",
        }
        response = self.session.post(
            self.endpoint,
            data=json.dumps([event]),
            headers={
                "Content-Type": "application/json",
                "aeg-event-type": "SubscriptionValidation",
                "aeg-subscription-name": self.subscription_name.upper(),
                "aeg-delivery-count": "0",
                "aeg-metadata-version": "1",
                "aeg-data-version": "2",
            },
            timeout=self.timeout,
        )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        got = answer.get("validationResponse") if isinstance(answer, dict) else None
        if response.status_code != 200 or got != code:
            raise EventGridDeliveryError(
                f"validation handshake: HTTP {response.status_code}, answer {answer!r}"
            )

    # -- delivery ---------------------------------------------------------------------------
    def _requests(
        self, events: Sequence[Mapping[str, Any]]
    ) -> list[tuple[bytes, str, list[Mapping[str, Any]]]]:
        if self.schema == EVENT_GRID_SCHEMA:
            return [(json.dumps(list(events)).encode(), "application/json", list(events))]
        if self.batch:
            body = json.dumps(list(events)).encode()
            return [(body, "application/cloudevents-batch+json; charset=utf-8", list(events))]
        return [
            (json.dumps(e).encode(), "application/cloudevents+json; charset=utf-8", [e])
            for e in events
        ]

    def deliver(self, events: Sequence[Mapping[str, Any]]) -> list[int | None]:
        """Deliver ``events`` (one request, or one per event for unbatched CloudEvents);
        returns each request's final status. Raises EventGridDeliveryError when a request was
        refused or never taken."""
        finals = []
        for body, content_type, sent in self._requests(events):
            finals.append(self._send(body, content_type, sent))
        return finals

    def _send(self, body: bytes, content_type: str, events: list[Mapping[str, Any]]) -> int | None:
        ids = tuple(str(e.get("id")) for e in events)
        data_version = str(events[0].get("dataVersion", "")) if events else ""
        metadata = "1.0" if self.schema == CLOUD_EVENT_SCHEMA else "1"
        status: int | None = None
        detail = ""
        for attempt in range(self.max_attempts):
            started = time.perf_counter()
            try:
                response = self.session.post(
                    self.endpoint,
                    data=body,
                    headers={
                        "Content-Type": content_type,
                        "aeg-event-type": "Notification",
                        "aeg-subscription-name": self.subscription_name.upper(),
                        "aeg-delivery-count": str(attempt),
                        "aeg-metadata-version": metadata,
                        "aeg-data-version": data_version,
                    },
                    timeout=self.timeout,
                )
                status, detail = response.status_code, response.text[:200]
            except requests.RequestException as exc:
                status, detail = None, type(exc).__name__
            with self._lock:
                self.deliveries.append(
                    Attempt(ids, attempt, status, time.perf_counter() - started, detail)
                )
            if status is not None and 200 <= status < 300:
                return status
            if status in NOT_RETRIED or attempt + 1 == self.max_attempts:
                break
            time.sleep(self.retry_delays[min(attempt, len(self.retry_delays) - 1)])
        raise EventGridDeliveryError(
            f"events {list(ids)} not delivered: HTTP {status} after "
            f"{len([a for a in self.deliveries if a.event_ids == ids])} attempt(s): {detail}"
        )

    def close(self) -> None:
        self.session.close()
