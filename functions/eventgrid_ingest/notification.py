"""One Event Grid notification of a scheduled event, read and checked (pure).

Azure publishes every state of every scheduled event of the VMs, scale sets and availability
sets that opt in to the system topic type ``Microsoft.ResourceNotifications.MaintenanceResources``
(event type ``...MaintenanceResources.ScheduledEventEmitted``; Microsoft's page "Scheduled
Events in Event Grid"). The IMDS fields are under ``data.resourceInfo.properties`` (the same
EventId as inside the VM) and ``data.resourceInfo.id`` is the scheduled event's ARM id::

    /subscriptions/{S}/resourceGroups/{G}/providers/Microsoft.Compute/virtualMachines/{N}
        /providers/Microsoft.Maintenance/scheduledEvents/{EventId}

(or ``virtualMachineScaleSets/{N}`` or ``availabilitySets/{N}``; Azure writes the segments in
any case). The function gets the notification in the Event Grid schema (``eventType``,
``eventTime``, ``topic``) or the CloudEvents schema (``type``, ``time``, ``source``); both come
here as a :class:`RawNotification`.

Every name is checked against Azure's naming rules (functions.shared.names, the rules the scope
check applies too) before it can reach a message or an ARM
URL. A notification that breaks them is refused with :class:`InvalidNotification` marked
``security``: the caller logs it as a security event and drops it (no retry can repair it).

The observer (DESIGN.md, contract v1) is derived from the ARM id: the VM for a VM's event; for
a scale set's (or availability set's) event the scale set (availability set) itself, since
Event Grid does not say which VM saw it: ``vmName`` is its name, ``resourceId`` its id (the id
the ARM acknowledge API takes for it), ``vmScaleSetName`` names a scale set. ``Resources``
names the affected VMs as in IMDS.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from functions.shared import names
from sebridge import times
from sebridge.contract.events import Observer
from sebridge.imds import InvalidDocument, ScheduledEvent, isoformat_utc

EVENT_TYPE = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
RESOURCE_TYPE = "microsoft.maintenance/scheduledevents"
# The fields taken over from data.resourceInfo.properties: exactly what IMDS sends, so that a
# transition reads the same whichever way it was observed (ScheduledEventApiVersion is left out).
IMDS_FIELDS = (
    "EventId",
    "EventType",
    "ResourceType",
    "Resources",
    "EventStatus",
    "NotBefore",
    "Description",
    "EventSource",
    "DurationInSeconds",
)

SCHEDULED = "Scheduled"
STARTED = "Started"
COMPLETED = "Completed"
CANCELED = "Canceled"  # Event Grid's spelling; the transition is Cancelled
STATUSES = {s.lower(): s for s in (SCHEDULED, STARTED, COMPLETED, CANCELED)} | {
    "cancelled": CANCELED
}

MAX_RESOURCES = 1000  # an availability set holds at most 200 VMs; a scale set's event fewer
MAX_ID_LENGTH = 1024
MAX_TEXT = 64 * 1024  # any one field (Description); Event Grid caps a whole event at 1 MB

# An EventId (a GUID in any case). Azure's name rules for the parent resource, its resource
# group and subscription are functions.shared.names': the scope check applies the same ones.
_EVENT_GUID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_EVENT_ID = re.compile(
    r"/subscriptions/(?P<subscription>[^/]+)/resourcegroups/(?P<group>[^/]+)"
    r"/providers/microsoft\.compute/(?P<kind>virtualmachines|virtualmachinescalesets|availabilitysets)"
    r"/(?P<name>[^/]+)/providers/microsoft\.maintenance/scheduledevents/(?P<event>[^/]+)",
    re.IGNORECASE,
)
KINDS = {
    "virtualmachines": "virtualMachines",
    "virtualmachinescalesets": "virtualMachineScaleSets",
    "availabilitysets": "availabilitySets",
}
_FRACTION = re.compile(r"(\.\d{6})\d+")


class InvalidNotification(ValueError):
    """The notification cannot become a transition; ``security`` when a name or id is forged
    or malformed (logged as a security event)."""

    def __init__(self, reason: str, *, security: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.security = security


@dataclass(frozen=True)
class RawNotification:
    """What the trigger hands over, in either schema (times as the binding gives them)."""

    id: str | None
    event_type: str | None
    time: datetime | str | None
    topic: str | None
    subject: str | None
    data: Any


@dataclass(frozen=True)
class ParentResource:
    """The VM, scale set or availability set a scheduled event is under."""

    subscription_id: str
    resource_group: str
    kind: str  # virtualMachines, virtualMachineScaleSets or availabilitySets
    name: str

    @property
    def resource_id(self) -> str:
        return (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Compute/{self.kind}/{self.name}"
        )

    def observer(self, location: str = "") -> Observer:
        return Observer(
            vm_name=self.name,
            resource_id=self.resource_id,
            subscription_id=self.subscription_id,
            resource_group=self.resource_group,
            location=location,
            vm_scale_set_name=self.name if self.kind == "virtualMachineScaleSets" else "",
        )


@dataclass(frozen=True)
class Notification:
    """A checked notification: one state of one scheduled event."""

    id: str  # the Event Grid event id (a redelivery repeats it)
    time: datetime | None  # when the event changed: resourceEventTime, else the event time
    status: str  # Scheduled, Started, Completed or Canceled
    event: ScheduledEvent  # the IMDS fields, as IMDS would show them
    parent: ParentResource
    resource_id: str  # the scheduled event's ARM id, as sent
    topic: str
    location: str = ""

    @property
    def observer(self) -> Observer:
        return self.parent.observer(self.location)

    def provenance(self) -> dict[str, Any]:
        """``data.eventGrid`` of the transitions derived from it."""
        return {
            "id": self.id,
            "eventTime": isoformat_utc(self.time) if self.time else None,
            "topic": self.topic,
            "resourceId": self.resource_id,
        }


def parse_time(value: object) -> datetime | None:
    """An ISO 8601 time as Event Grid writes it (up to 7 fractional digits, ``Z`` or no zone:
    UTC) or a datetime from the binding; anything else is None."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and 0 < len(value) <= 64:
        text = _FRACTION.sub(r"\1", value.strip()).replace("Z", "+00:00").replace("z", "+00:00")
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
    else:
        return None
    # The bridge's one range of readable times (sebridge.times): a time of year 1 or 9999 would
    # make every later notification of the event look older than the one recorded (stale).
    return times.readable(moment)


def valid_vm_name(name: str) -> bool:
    return names.VIRTUAL_MACHINE.valid(name)


def parse_resource_id(resource_id: str) -> tuple[ParentResource, str]:
    """The parent resource and the EventId segment of a scheduled event's ARM id."""
    if len(resource_id) > MAX_ID_LENGTH:
        raise InvalidNotification("data.resourceInfo.id is too long", security=True)
    match = _EVENT_ID.fullmatch(resource_id)
    if match is None:
        raise InvalidNotification(
            "data.resourceInfo.id is not a scheduled event under a VM, scale set or "
            f"availability set: {resource_id[:200]!r}",
            security=True,
        )
    subscription, group, kind, name, event = match.group(
        "subscription", "group", "kind", "name", "event"
    )
    kind = KINDS[kind.lower()]
    problems = []
    if not names.is_subscription_id(subscription):
        problems.append("subscription id is not a GUID")
    if not names.RESOURCE_GROUP.valid(group):
        problems.append(f"resource group {group[:100]!r} breaks Azure's naming rules")
    if not names.BY_TYPE[kind.lower()].valid(name):
        problems.append(f"{kind} name {name[:100]!r} breaks Azure's naming rules")
    if not _EVENT_GUID.fullmatch(event):
        problems.append("the scheduled event's name is not a GUID")
    if problems:
        raise InvalidNotification("data.resourceInfo.id: " + "; ".join(problems), security=True)
    parent = ParentResource(subscription.lower(), group, kind, name)
    return parent, event


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidNotification(f"{where} is not an object")
    return value


def parse_notification(raw: RawNotification) -> Notification:
    """Check ``raw`` and read it; :class:`InvalidNotification` says what is wrong."""
    if raw.event_type is not None and raw.event_type.lower() != EVENT_TYPE.lower():
        raise InvalidNotification(f"unexpected event type {str(raw.event_type)[:200]!r}")
    if not isinstance(raw.id, str) or not raw.id.strip() or len(raw.id) > 256:
        raise InvalidNotification("the notification has no usable id")
    data = _mapping(raw.data, "data")
    info = _mapping(data.get("resourceInfo"), "data.resourceInfo")
    resource_type = info.get("type")
    if resource_type is not None and str(resource_type).lower() != RESOURCE_TYPE:
        raise InvalidNotification(f"data.resourceInfo.type is {str(resource_type)[:100]!r}")
    resource_id = info.get("id")
    if not isinstance(resource_id, str):
        raise InvalidNotification("data.resourceInfo.id is missing", security=True)
    parent, event_segment = parse_resource_id(resource_id)

    properties = _mapping(info.get("properties"), "data.resourceInfo.properties")
    for name, value in properties.items():
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise InvalidNotification(f"{str(name)[:50]} is longer than {MAX_TEXT} characters")
    fields = {name: properties[name] for name in IMDS_FIELDS if name in properties}
    try:
        event = ScheduledEvent.from_imds(fields)
    except InvalidDocument as exc:
        raise InvalidNotification(f"data.resourceInfo.properties: {exc}") from exc
    if not _EVENT_GUID.fullmatch(event.event_id):
        raise InvalidNotification("EventId is not a GUID", security=True)
    if event.key != event_segment.lower():
        raise InvalidNotification(
            "EventId differs from the scheduled event named in data.resourceInfo.id",
            security=True,
        )
    if len(event.resources) > MAX_RESOURCES:
        raise InvalidNotification(f"more than {MAX_RESOURCES} Resources", security=True)
    bad = [r for r in event.resources if not valid_vm_name(r)]
    if bad:
        raise InvalidNotification(
            f"Resources name {bad[0][:100]!r}, which breaks Azure's VM naming rules",
            security=True,
        )
    status = STATUSES.get(event.status.lower())
    if status is None:
        raise InvalidNotification(f"unknown EventStatus {event.status[:50]!r}")

    topic = raw.topic if isinstance(raw.topic, str) else ""
    if topic and topic.strip("/").lower() != f"subscriptions/{parent.subscription_id}":
        raise InvalidNotification(
            f"the event is in subscription {parent.subscription_id}, the topic is {topic[:100]!r}",
            security=True,
        )
    operational = data.get("operationalInfo")
    changed_at = None
    if isinstance(operational, Mapping):
        changed_at = parse_time(operational.get("resourceEventTime"))
    location = info.get("location")
    return Notification(
        id=raw.id.strip(),
        time=changed_at or parse_time(raw.time),
        status=status,
        event=event,
        parent=parent,
        resource_id=resource_id,
        topic=topic,
        location=location if isinstance(location, str) and len(location) <= 64 else "",
    )


def raw_from_json(body: Mapping[str, Any]) -> RawNotification:
    """A notification as JSON, in the Event Grid schema or the CloudEvents schema."""
    if "specversion" in body:
        return RawNotification(
            id=body.get("id"),
            event_type=body.get("type"),
            time=body.get("time"),
            topic=body.get("source"),
            subject=body.get("subject"),
            data=body.get("data"),
        )
    return RawNotification(
        id=body.get("id"),
        event_type=body.get("eventType"),
        time=body.get("eventTime"),
        topic=body.get("topic"),
        subject=body.get("subject"),
        data=body.get("data"),
    )
