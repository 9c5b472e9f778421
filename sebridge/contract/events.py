"""Message contract v1 on the ``scheduled-events`` topic: the single source for both sides.

The forwarder builds messages with :func:`event_message` and :func:`heartbeat_message`, the
workflows build ``Prepared`` with :func:`prepared_message`, and every consumer reads them back
with :func:`parse_message`. An :class:`Envelope` is plain data; the Service Bus adapters turn it
into an SDK message (and ``sebridge forwarder --dry-run`` prints ``Envelope.to_dict()``).

Body: a CloudEvents 1.0 structured JSON document built through
``azure.core.messaging.CloudEvent``; ``data`` follows ``schemas/scheduled-event-data.v1.json``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from azure.core.messaging import CloudEvent

from sebridge.imds import ScheduledEvent, isoformat_utc

SCHEMA_VERSION = 1
TYPE_PREFIX = "Azure.VM.ScheduledEvent."
CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
DATA_SCHEMA = "urn:sebridge:schema:scheduled-event-data:v1"


class Transition(StrEnum):
    SCHEDULED = "Scheduled"
    UPDATED = "Updated"
    STARTED = "Started"
    COMPLETED = "Completed"
    CANCELLED = "Cancelled"
    APPROVED = "Approved"
    HEARTBEAT = "Heartbeat"
    PREPARED = "Prepared"

    @property
    def cloud_event_type(self) -> str:
        return TYPE_PREFIX + self.value


# The transitions the forwarder derives from consecutive IMDS documents.
LIFECYCLE = (
    Transition.SCHEDULED,
    Transition.UPDATED,
    Transition.STARTED,
    Transition.COMPLETED,
    Transition.CANCELLED,
)


class ContractError(ValueError):
    """A message that does not follow contract v1 (the reason says which rule it breaks)."""


@dataclass(frozen=True)
class Observer:
    """The VM whose forwarder saw the document (from IMDS instance metadata)."""

    vm_name: str
    vm_id: str = ""
    resource_id: str = ""
    subscription_id: str = ""
    resource_group: str = ""
    location: str = ""
    zone: str = ""
    vm_scale_set_name: str = ""

    def to_data(self) -> dict[str, str]:
        return {
            "vmName": self.vm_name,
            "vmId": self.vm_id,
            "resourceId": self.resource_id,
            "subscriptionId": self.subscription_id,
            "resourceGroup": self.resource_group,
            "location": self.location,
            "zone": self.zone,
            "vmScaleSetName": self.vm_scale_set_name,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Observer:
        def text(key: str) -> str:
            value = data.get(key)
            return value if isinstance(value, str) else ""

        if not text("vmName"):
            raise ContractError("observer.vmName is missing")
        return cls(
            vm_name=text("vmName"),
            vm_id=text("vmId"),
            resource_id=text("resourceId"),
            subscription_id=text("subscriptionId"),
            resource_group=text("resourceGroup"),
            location=text("location"),
            zone=text("zone"),
            vm_scale_set_name=text("vmScaleSetName"),
        )

    @property
    def source(self) -> str:
        """CloudEvents ``source``: the VM's ARM id, or a URN when instance metadata was missing."""
        return self.resource_id or f"urn:sebridge:vm:{self.vm_name}"


@dataclass(frozen=True)
class Envelope:
    """One Service Bus message, as plain data."""

    message_id: str
    session_id: str
    subject: str
    application_properties: dict[str, str | int]
    body: dict[str, Any]
    content_type: str = field(default=CONTENT_TYPE)

    def body_bytes(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":"), sort_keys=True).encode("utf-8")

    def to_dict(self) -> dict[str, Any]:
        """The dry-run line: exactly these five keys."""
        return {
            "message_id": self.message_id,
            "session_id": self.session_id,
            "subject": self.subject,
            "application_properties": dict(self.application_properties),
            "body": self.body,
        }

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Envelope:
        return cls(
            message_id=str(obj["message_id"]),
            session_id=str(obj["session_id"]),
            subject=str(obj["subject"]),
            application_properties=dict(obj["application_properties"]),
            body=dict(obj["body"]),
        )


def _short_hash(value: object) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]


def message_id_for(
    event_id: str, transition: Transition, changes: Mapping[str, Any] | None = None
) -> str:
    """``<EventId>:<Transition>``, plus a short hash of the changes for ``Updated``.

    Every forwarder that sees one event derives the same id, so Service Bus duplicate detection
    keeps one message per transition however many VMs (or restarts) report it.
    """
    base = f"{event_id.strip().lower()}:{transition.value}"
    if transition is Transition.UPDATED:
        return f"{base}:{_short_hash(changes or {})}"
    return base


def _cloud_event_dict(event: CloudEvent[Any]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "specversion": event.specversion,
        "id": event.id,
        "source": event.source,
        "type": event.type,
    }
    if event.subject is not None:
        body["subject"] = event.subject
    if event.time is not None:
        body["time"] = isoformat_utc(event.time)
    if event.datacontenttype is not None:
        body["datacontenttype"] = event.datacontenttype
    if event.dataschema is not None:
        body["dataschema"] = event.dataschema
    body["data"] = event.data
    return body


def _event_properties(
    transition: Transition, event: ScheduledEvent | None, observer: Observer
) -> dict[str, str | int]:
    props: dict[str, str | int] = {
        "transition": transition.value,
        "schemaVersion": SCHEMA_VERSION,
        "vmName": observer.vm_name,
    }
    if observer.resource_group:
        props["resourceGroup"] = observer.resource_group
    if observer.subscription_id:
        props["subscriptionId"] = observer.subscription_id
    if observer.vm_scale_set_name:
        props["vmScaleSetName"] = observer.vm_scale_set_name
    if event is not None:
        props["eventType"] = event.event_type
        props["eventStatus"] = event.status
        if event.event_source is not None:
            props["eventSource"] = event.event_source
        if event.duration_in_seconds is not None:
            props["durationInSeconds"] = event.duration_in_seconds
        if event.resources:
            props["resources"] = ",".join(event.resources)
    return props


def _envelope(
    *,
    message_id: str,
    session_id: str,
    transition: Transition,
    source: str,
    subject: str | None,
    observed_at: datetime,
    data: dict[str, Any],
    properties: dict[str, str | int],
) -> Envelope:
    cloud_event: CloudEvent[Any] = CloudEvent(
        source=source,
        type=transition.cloud_event_type,
        id=message_id,
        subject=subject,
        time=observed_at.astimezone(UTC),
        datacontenttype="application/json",
        dataschema=DATA_SCHEMA,
        data=data,
    )
    return Envelope(
        message_id=message_id,
        session_id=session_id,
        subject=transition.value,
        application_properties=properties,
        body=_cloud_event_dict(cloud_event),
    )


def event_data(
    event: ScheduledEvent,
    observer: Observer,
    incarnation: int,
    *,
    changes: Mapping[str, Any] | None = None,
    approval: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    data: dict[str, Any] = {"schemaVersion": SCHEMA_VERSION}
    data.update(event.to_imds())  # the IMDS fields verbatim
    data["notBefore"] = isoformat_utc(event.not_before) if event.not_before else None
    data["documentIncarnation"] = incarnation
    data["observer"] = observer.to_data()
    if changes is not None:
        data["changes"] = dict(changes)
    if approval is not None:
        data["approval"] = dict(approval)
    return data


def event_message(
    transition: Transition,
    event: ScheduledEvent,
    observer: Observer,
    incarnation: int,
    observed_at: datetime,
    *,
    changes: Mapping[str, Any] | None = None,
    approval: Mapping[str, str] | None = None,
) -> Envelope:
    """A lifecycle transition (or ``Approved``) of one event, as seen by ``observer``."""
    if transition in (Transition.HEARTBEAT, Transition.PREPARED):
        raise ValueError(f"use heartbeat_message/prepared_message for {transition.value}")
    if transition is Transition.UPDATED and not changes:
        raise ValueError("an Updated transition needs the changed fields")
    if transition is Transition.APPROVED and approval is None:
        raise ValueError("an Approved transition needs approval (requestedBy, reason)")
    message_id = message_id_for(event.event_id, transition, changes)
    return _envelope(
        message_id=message_id,
        session_id=event.key,
        transition=transition,
        source=observer.source,
        subject=event.key,
        observed_at=observed_at,
        data=event_data(event, observer, incarnation, changes=changes, approval=approval),
        properties=_event_properties(transition, event, observer),
    )


def heartbeat_message(
    observer: Observer,
    observed_at: datetime,
    *,
    forwarder_version: str,
    last_incarnation: int | None,
    outbox_depth: int,
    last_successful_poll: datetime | None,
) -> Envelope:
    """Liveness of one forwarder; its session is the VM name, its id is unique per tick."""
    stamp = observed_at.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    data: dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "observer": observer.to_data(),
        "heartbeat": {
            "forwarderVersion": forwarder_version,
            "lastIncarnation": last_incarnation,
            "outboxDepth": outbox_depth,
            "lastSuccessfulPoll": (
                isoformat_utc(last_successful_poll) if last_successful_poll else None
            ),
        },
    }
    return _envelope(
        message_id=f"heartbeat:{observer.vm_name.lower()}:{stamp}",
        session_id=observer.vm_name,
        transition=Transition.HEARTBEAT,
        source=observer.source,
        subject=None,
        observed_at=observed_at,
        data=data,
        properties=_event_properties(Transition.HEARTBEAT, None, observer),
    )


def prepared_message(
    event: ScheduledEvent,
    observer: Observer,
    incarnation: int,
    observed_at: datetime,
    *,
    source: str,
    prepared_vms: list[str],
) -> Envelope:
    """Published by a workflow once every affected VM is out of all pools.

    ``observer`` stays the VM whose forwarder reported the event: the approval gate sends the
    command to that VM's session. ``source`` names the workflow that did the preparing.
    """
    data = event_data(event, observer, incarnation)
    data["prepared"] = {"vms": list(prepared_vms)}
    return _envelope(
        message_id=message_id_for(event.event_id, Transition.PREPARED),
        session_id=event.key,
        transition=Transition.PREPARED,
        source=source,
        subject=event.key,
        observed_at=observed_at,
        data=data,
        properties=_event_properties(Transition.PREPARED, event, observer),
    )


@dataclass(frozen=True)
class TransitionMessage:
    """A contract v1 message as a consumer sees it."""

    transition: Transition
    message_id: str | None
    source: str
    time: datetime | None
    data: dict[str, Any]
    observer: Observer
    event: ScheduledEvent | None  # None for Heartbeat

    @property
    def event_id(self) -> str | None:
        return self.event.key if self.event else None

    @property
    def incarnation(self) -> int | None:
        value = self.data.get("documentIncarnation")
        return value if isinstance(value, int) else None


def parse_message(
    body: bytes | str | Mapping[str, Any], message_id: str | None = None
) -> TransitionMessage:
    """Read a topic message body back; :class:`ContractError` says what is wrong with it."""
    if isinstance(body, Mapping):
        obj: Any = dict(body)
    else:
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ContractError(f"body is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ContractError("body is not a JSON object")
    try:
        cloud_event: CloudEvent[Any] = CloudEvent.from_dict(obj)
    except (KeyError, TypeError, ValueError) as exc:
        raise ContractError(f"body is not a CloudEvent: {exc}") from exc
    if not cloud_event.type.startswith(TYPE_PREFIX):
        raise ContractError(f"unexpected CloudEvent type {cloud_event.type!r}")
    try:
        transition = Transition(cloud_event.type.removeprefix(TYPE_PREFIX))
    except ValueError as exc:
        raise ContractError(f"unknown transition in type {cloud_event.type!r}") from exc
    data = cloud_event.data
    if not isinstance(data, dict):
        raise ContractError("data is not a JSON object")
    if data.get("schemaVersion") != SCHEMA_VERSION:
        raise ContractError(f"unsupported schemaVersion {data.get('schemaVersion')!r}")
    observer_data = data.get("observer")
    if not isinstance(observer_data, dict):
        raise ContractError("data.observer is missing")
    observer = Observer.from_data(observer_data)
    event: ScheduledEvent | None = None
    if transition is not Transition.HEARTBEAT:
        try:
            event = ScheduledEvent.from_imds(data)
        except ValueError as exc:
            raise ContractError(f"data does not carry the IMDS event: {exc}") from exc
    return TransitionMessage(
        transition=transition,
        message_id=message_id or cloud_event.id,
        source=cloud_event.source,
        time=cloud_event.time,
        data=data,
        observer=observer,
        event=event,
    )
