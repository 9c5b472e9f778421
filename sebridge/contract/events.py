"""Message contract v1 on the ``scheduled-events`` topic: the single source for both sides.

The forwarder builds messages with :func:`event_message` and :func:`heartbeat_message`, the
workflows build ``Prepared`` with :func:`prepared_message`, and every consumer reads them back
with :func:`parse_message`. An :class:`Envelope` is plain data; the Service Bus adapters turn it
into an SDK message (and ``sebridge forwarder --dry-run`` prints ``Envelope.to_dict()``).

Body: a CloudEvents 1.0 structured JSON document (:mod:`sebridge.contract.cloudevents`);
``data`` follows ``schemas/scheduled-event-data.v1.json``. Message ids follow the scheme of
:mod:`sebridge.lifecycle`. Every application property is normalised when the message is built
(:func:`property_text`, :func:`property_int`), so no value IMDS sends can make a message that
the Service Bus SDK refuses to encode. A message about an event also carries the event's trace
(``traceparent``, ``Diagnostic-Id``: :mod:`sebridge.contract.tracecontext`). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sebridge import lifecycle
from sebridge.contract import tracecontext
from sebridge.contract.cloudevents import CloudEvent, CloudEventError
from sebridge.imds import InvalidDocument, ScheduledEvent, isoformat_utc, read_incarnation, show

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
    HELD = "Held"
    # Not a lifecycle transition: one VM's report of the impact it measured of an event that
    # completed (data.impact), one message per VM (see measured_message).
    MEASURED = "Measured"

    @property
    def is_report(self) -> bool:
        """Heartbeat and Measured: what one forwarder reports about itself, not a step of an
        event's lifecycle; the workflows that act on transitions (cards, webhooks, pools, the
        gate) ignore them."""
        return self in (Transition.HEARTBEAT, Transition.MEASURED)

    @property
    def cloud_event_type(self) -> str:
        return TYPE_PREFIX + self.value


# Service Bus limits that a message built here must stay within whatever IMDS sends.
MAX_ID_LENGTH = 128  # message_id and session_id
MAX_PROPERTY_TEXT = 256
MAX_RESOURCES_TEXT = 4096  # the comma-joined `resources` property (an availability set's VMs)
INT32 = (-(2**31), 2**31 - 1)


def property_text(value: str, limit: int = MAX_PROPERTY_TEXT) -> str:
    """A string any AMQP encoder takes: lone surrogates replaced, at most ``limit`` characters."""
    clean = value.encode("utf-8", "replace").decode("utf-8")
    return clean if len(clean) <= limit else clean[: limit - 1] + "\u2026"


def property_int(value: int) -> int | None:
    """An integer that fits the 32-bit AMQP int SQL filters compare, else None (left out)."""
    return value if INT32[0] <= value <= INT32[1] else None


class ContractError(ValueError):
    """A message that does not follow contract v1 (the reason says which rule it breaks)."""


@dataclass(frozen=True)
class Observer:
    """The VM whose forwarder saw the document (from IMDS instance metadata).

    For a transition observed through Event Grid it is derived from the scheduled event's ARM
    id: the VM (``vm_name``, ``resource_id`` = the VM's id), or for a scale set the scale set
    (``vm_name`` = ``vm_scale_set_name`` = its name, ``resource_id`` = its id), or for an
    availability set the availability set (``vm_name`` = its name). ``vm_id`` and ``zone`` are
    then empty; ``source`` is ``resource_id`` either way.
    """

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
    def from_data(cls, data: Mapping[str, Any], warnings: list[str] | None = None) -> Observer:
        """Tolerant: a field that is not a string reads as ``""``, reported in ``warnings``
        (``data.observer.<field>: ...``); only a missing vmName raises ContractError."""
        notes = warnings if warnings is not None else []

        def text(key: str) -> str:
            value = data.get(key)
            if isinstance(value, str):
                return value
            if value is not None:
                notes.append(f'data.observer.{key}: {show(value)} is not a string: read as ""')
            return ""

        vm_name = data.get("vmName")
        if not isinstance(vm_name, str) or not vm_name:
            raise ContractError("observer.vmName is missing")
        return cls(
            vm_name=vm_name,
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


def default_message_id(transition: Transition, event: ScheduledEvent) -> str:
    """The id a first observer with no memory of the event gives ``transition``
    (:func:`sebridge.lifecycle.advance` from nothing): observers that remember more pass
    their own ``message_id``."""
    return lifecycle.advance(None, transition.value, event)[1]


def derived_message_id(event: ScheduledEvent, transition: Transition, cause: str) -> str:
    """The id of a transition a workflow reports because of message ``cause`` (Prepared, Held):
    a replay of the cause collapses, another cause is another message. It names the cause's
    appearance (``<ref>:<Transition>:<appearance>:<digest>``) when the cause's id says it, so
    the history puts the action in the event's life without an observer's clock."""
    digest = hashlib.sha256(cause.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    ref = lifecycle.event_ref(event.event_id)
    appearance = lifecycle.appearance_of(cause)
    if appearance is None:
        return f"{ref}:{transition.value}:{digest}"
    return f"{ref}:{transition.value}:{appearance}:{digest}"


OBSERVER_PROPERTIES = ("vmName", "resourceGroup", "subscriptionId", "vmScaleSetName")


def _observer_properties(observer: Observer) -> dict[str, str | int]:
    props: dict[str, str | int] = {"vmName": property_text(observer.vm_name)}
    if observer.resource_group:
        props["resourceGroup"] = property_text(observer.resource_group)
    if observer.subscription_id:
        props["subscriptionId"] = property_text(observer.subscription_id)
    if observer.vm_scale_set_name:
        props["vmScaleSetName"] = property_text(observer.vm_scale_set_name)
    return props


def _event_properties(
    transition: Transition, event: ScheduledEvent | None, observer: Observer
) -> dict[str, str | int]:
    props: dict[str, str | int] = {
        "transition": transition.value,
        "schemaVersion": SCHEMA_VERSION,
        **_observer_properties(observer),
    }
    if event is not None:
        props["eventType"] = property_text(event.event_type)
        props["eventStatus"] = property_text(event.status)
        if event.event_source is not None:
            props["eventSource"] = property_text(event.event_source)
        duration = (
            property_int(event.duration_in_seconds)
            if event.duration_in_seconds is not None
            else None
        )
        if duration is not None:
            props["durationInSeconds"] = duration
        if event.resources:
            props["resources"] = property_text(",".join(event.resources), MAX_RESOURCES_TEXT)
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
    if len(message_id) > MAX_ID_LENGTH or len(session_id) > MAX_ID_LENGTH:
        raise ValueError(f"message or session id longer than {MAX_ID_LENGTH}: {message_id!r}")
    cloud_event = CloudEvent(
        source=source,
        type=transition.cloud_event_type,
        id=message_id,
        subject=subject,
        time=observed_at.astimezone(UTC),
        datacontenttype="application/json",
        dataschema=DATA_SCHEMA,
        data=data,
    )
    if subject is not None:
        # One trace per event (sebridge.contract.tracecontext); a Heartbeat starts none.
        properties = {**properties, **tracecontext.for_message(subject, message_id).properties()}
    return Envelope(
        message_id=message_id,
        session_id=property_text(session_id, MAX_ID_LENGTH),
        subject=transition.value,
        application_properties=properties,
        body=cloud_event.to_dict(),
    )


def event_data(
    event: ScheduledEvent,
    observer: Observer,
    incarnation: int | None,
    *,
    changes: Mapping[str, Any] | None = None,
    approval: Mapping[str, str] | None = None,
    event_grid: Mapping[str, Any] | None = None,
    impact: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``incarnation`` is None for a transition observed through Event Grid (no IMDS document);
    ``event_grid`` then names the notification it was derived from (``id``, ``eventTime``,
    ``topic``, ``resourceId``). ``impact`` is what the observer measured of a Completed."""
    data: dict[str, Any] = {"schemaVersion": SCHEMA_VERSION}
    data.update(event.to_imds())  # the IMDS fields verbatim
    data["notBefore"] = isoformat_utc(event.not_before) if event.not_before else None
    data["documentIncarnation"] = incarnation
    data["observer"] = observer.to_data()
    if changes is not None:
        data["changes"] = dict(changes)
    if approval is not None:
        data["approval"] = dict(approval)
    if event_grid is not None:
        data["eventGrid"] = dict(event_grid)
    if impact is not None:
        data["impact"] = dict(impact)
    return data


def event_message(
    transition: Transition,
    event: ScheduledEvent,
    observer: Observer,
    incarnation: int | None,
    observed_at: datetime,
    *,
    message_id: str | None = None,
    changes: Mapping[str, Any] | None = None,
    approval: Mapping[str, str] | None = None,
    event_grid: Mapping[str, Any] | None = None,
    impact: Mapping[str, Any] | None = None,
) -> Envelope:
    """A lifecycle transition (or ``Approved``) of one event, as seen by ``observer``.

    ``message_id`` comes from :func:`sebridge.lifecycle.advance` with what the observer
    remembers of the event; without it, the id a first observer would give. A transition
    observed through Event Grid has no ``incarnation`` (None) and carries ``event_grid``.
    A Completed may carry ``impact`` (``measuredSeconds``, ``method``): what the observer
    measured of the event from inside the VM; it never enters the message id.
    """
    if transition in (
        Transition.HEARTBEAT,
        Transition.PREPARED,
        Transition.HELD,
        Transition.MEASURED,
    ):
        raise ValueError(f"use the {transition.value.lower()}_message builder")
    if transition is Transition.UPDATED and not changes:
        raise ValueError("an Updated transition needs the changed fields")
    if transition is Transition.APPROVED and approval is None:
        raise ValueError("an Approved transition needs approval (requestedBy, reason)")
    if impact is not None and (
        transition is not Transition.COMPLETED or read_impact(impact, []) is None
    ):
        raise ValueError("impact is measured seconds and a method, on a Completed only")
    return _envelope(
        message_id=message_id or default_message_id(transition, event),
        session_id=lifecycle.event_ref(event.event_id),
        transition=transition,
        source=observer.source,
        subject=event.key,
        observed_at=observed_at,
        data=event_data(
            event,
            observer,
            incarnation,
            changes=changes,
            approval=approval,
            event_grid=event_grid,
            impact=impact,
        ),
        properties=_event_properties(transition, event, observer),
    )


def observed_by(envelope: Envelope, observer: Observer) -> bool:
    """Whether ``envelope`` was built with ``observer`` as its observer (``data.observer``)."""
    data = envelope.body.get("data")
    return isinstance(data, Mapping) and data.get("observer") == observer.to_data()


def built_without_identity(envelope: Envelope) -> bool:
    """Whether ``envelope`` names an observer without vmId and resource id: it was built under a
    fallback (the host name or ``--vm-name``, whatever they were then) before the VM's identity
    was known, in this run or an earlier one."""
    data = envelope.body.get("data")
    observer = data.get("observer") if isinstance(data, Mapping) else None
    return (
        isinstance(observer, Mapping)
        and not observer.get("vmId")
        and not observer.get("resourceId")
    )


def with_observer(envelope: Envelope, observer: Observer) -> Envelope:
    """The same message as seen by ``observer``: ``data.observer``, the observer's application
    properties (:data:`OBSERVER_PROPERTIES`) and the CloudEvent ``source``, when it was the old
    observer's, are replaced; the message id, session id and everything else stay. For a
    message the forwarder built before it knew the VM's identity (instance metadata), which
    must not leave the VM without it. A body without an observer is returned unchanged."""
    data = envelope.body.get("data")
    if not isinstance(data, Mapping) or not isinstance(data.get("observer"), Mapping):
        return envelope
    try:
        old = Observer.from_data(data["observer"])
    except ContractError:
        old = None
    body = {**envelope.body, "data": {**data, "observer": observer.to_data()}}
    if old is not None and body.get("source") == old.source:
        body["source"] = observer.source
    properties = {
        key: value
        for key, value in envelope.application_properties.items()
        if key not in OBSERVER_PROPERTIES
    }
    properties.update(_observer_properties(observer))
    return Envelope(
        message_id=envelope.message_id,
        session_id=envelope.session_id,
        subject=envelope.subject,
        application_properties=properties,
        body=body,
        content_type=envelope.content_type,
    )


def heartbeat_message(
    observer: Observer,
    observed_at: datetime,
    *,
    forwarder_version: str,
    last_incarnation: int | None,
    outbox_depth: int,
    last_successful_poll: datetime | None,
    health: Mapping[str, Any] | None = None,
) -> Envelope:
    """Liveness of one forwarder; its session is the VM name, its id is unique per tick.

    ``health`` (optional, absent while all is well) carries what is wrong while it lasts:
    ``stateSaveFailing`` (+ ``stateSaveFailingSince``: transitions are held back until the
    state file can be saved), ``outboxWriteFailing`` (+ ``...Since``), ``pollFailures`` and
    ``publishFailures`` (in a row), ``setAside`` (messages kept in the outbox's aside table
    because they can never be sent), ``lastError``.
    """
    stamp = observed_at.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    heartbeat: dict[str, Any] = {
        "forwarderVersion": forwarder_version,
        "lastIncarnation": last_incarnation,
        "outboxDepth": outbox_depth,
        "lastSuccessfulPoll": (
            isoformat_utc(last_successful_poll) if last_successful_poll else None
        ),
    }
    if health:
        heartbeat["health"] = dict(health)
    data: dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "observer": observer.to_data(),
        "heartbeat": heartbeat,
    }
    vm = property_text(observer.vm_name.lower(), 80)
    return _envelope(
        message_id=f"heartbeat:{vm}:{stamp}",
        session_id=vm,
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
    incarnation: int | None,
    observed_at: datetime,
    *,
    source: str,
    prepared_vms: list[str],
    cause: str,
    prepared_by: str,
    event_grid: Mapping[str, Any] | None = None,
) -> Envelope:
    """The affected VMs are ready for the event (out of their pools, drained, checkpointed).

    ``observer`` stays the VM whose forwarder reported the event: the approval gate sends the
    command to that VM's session. ``source`` names who did the preparing (a workflow's URN, or
    the VM's ARM id for its forwarder's hooks or drain probe); ``prepared_by`` says how
    (``lb-pools``, ``hooks``, ``drain-probe``). ``cause`` is the id of the message that led to
    it: a replay of that message gives the same id.
    """
    data = event_data(event, observer, incarnation, event_grid=event_grid)
    data["prepared"] = {"vms": list(prepared_vms), "preparedBy": prepared_by}
    return _envelope(
        message_id=derived_message_id(event, Transition.PREPARED, cause),
        session_id=lifecycle.event_ref(event.event_id),
        transition=Transition.PREPARED,
        source=source,
        subject=event.key,
        observed_at=observed_at,
        data=data,
        properties=_event_properties(Transition.PREPARED, event, observer),
    )


def measured_message(
    event: ScheduledEvent,
    observer: Observer,
    incarnation: int | None,
    observed_at: datetime,
    *,
    appearance: int,
    impact: Mapping[str, Any],
) -> Envelope:
    """What ``observer`` measured of an event that completed (``data.impact``: seconds and a
    method), sent next to the Completed by the VM that measured it.

    The Completed has one id whoever observes it, so the topic keeps one of a set's N copies;
    this report is per VM (:func:`sebridge.lifecycle.measured_id`), so every VM's measurement
    reaches the history while the Completed still reaches every other subscriber once.
    ``appearance`` is the Completed's (the event's life in the observer's state).
    """
    if read_impact(impact, []) is None:
        raise ValueError("impact is measured seconds and a method")
    data = event_data(event, observer, incarnation, impact=impact)
    return _envelope(
        message_id=lifecycle.measured_id(
            lifecycle.event_ref(event.event_id), appearance, observer.vm_name
        ),
        session_id=lifecycle.event_ref(event.event_id),
        transition=Transition.MEASURED,
        source=observer.source,
        subject=event.key,
        observed_at=observed_at,
        data=data,
        properties=_event_properties(Transition.MEASURED, event, observer),
    )


def held_message(
    event: ScheduledEvent,
    observer: Observer,
    incarnation: int | None,
    observed_at: datetime,
    *,
    source: str,
    cause: str,
    pool: str,
    healthy: int,
    minimum: int,
    vms: list[str],
    event_grid: Mapping[str, Any] | None = None,
) -> Envelope:
    """lb-pools left ``vms`` in their pools: draining them would leave backend pool ``pool``
    with ``healthy`` healthy members, fewer than ``minimum``. The gate does not approve early."""
    data = event_data(event, observer, incarnation, event_grid=event_grid)
    data["held"] = {"pool": pool, "healthy": healthy, "minimum": minimum, "vms": list(vms)}
    return _envelope(
        message_id=derived_message_id(event, Transition.HELD, cause),
        session_id=lifecycle.event_ref(event.event_id),
        transition=Transition.HELD,
        source=source,
        subject=event.key,
        observed_at=observed_at,
        data=data,
        properties=_event_properties(Transition.HELD, event, observer),
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
    # What the tolerant reader normalised, one line per field ("data.Resources[1]: 5 is not a
    # string: dropped"); consumers log them at WARNING. ``data`` itself stays verbatim.
    warnings: tuple[str, ...] = ()

    @property
    def event_id(self) -> str | None:
        return self.event.key if self.event else None

    @property
    def incarnation(self) -> int | None:
        value = self.data.get("documentIncarnation")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def impact(self) -> MeasuredImpact | None:
        """``data.impact`` of a Completed or a Measured when it is usable (the reader warned
        otherwise)."""
        if self.transition not in (Transition.COMPLETED, Transition.MEASURED):
            return None
        return read_impact(self.data.get("impact"), [])


MAX_MEASURED_SECONDS = 10_000_000  # 116 days: far above any maintenance, below any bad clock
MAX_METHOD_LENGTH = 40


@dataclass(frozen=True)
class MeasuredImpact:
    """What the observing forwarder measured of a Completed event (``data.impact``): seconds
    the VM was out of its sight, and how (``freeze-pause``, ``reboot-gap``; others may come)."""

    seconds: float
    method: str


def read_impact(value: object, warnings: list[str]) -> MeasuredImpact | None:
    """``data.impact`` read tolerantly: None when absent; None and a warning when unusable."""
    if value is None:
        return None
    where = "data.impact"
    if not isinstance(value, Mapping):
        return None  # named by the check of the optional objects
    seconds, method = value.get("measuredSeconds"), value.get("method")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 <= seconds <= MAX_MEASURED_SECONDS
    ):
        warnings.append(
            f"{where}.measuredSeconds: {show(seconds)} is not a number of seconds "
            f"(0 to {MAX_MEASURED_SECONDS}): impact ignored"
        )
        return None
    if not isinstance(method, str) or not method:
        warnings.append(f"{where}.method: {show(method)} is not a method: read as unknown")
        method = "unknown"
    return MeasuredImpact(float(seconds), method[:MAX_METHOD_LENGTH])


MAX_BODY_BYTES = 1024 * 1024


def parse_message(
    body: bytes | str | Mapping[str, Any], message_id: str | None = None
) -> TransitionMessage:
    """Read a topic message body back: the one tolerant reader of the contract.

    :class:`ContractError` only for what makes a message unusable: not JSON, not a CloudEvent
    (its required attributes), an unknown transition, an unsupported schemaVersion, no usable
    EventId, no observer name. Every other odd field is normalised or dropped (as a document's
    are, :mod:`sebridge.imds`) and named in ``warnings``; the event itself is never dropped.
    Nothing else is raised, whatever the body holds: a consumer logs the reason and completes
    the message (no retry can repair it).
    """
    try:
        return _parse(body, message_id)
    except ContractError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        raise ContractError(f"unreadable message: {type(exc).__name__}: {exc}") from exc


# Optional parts of ``data`` that consumers read as objects when present.
_DATA_OBJECTS = ("changes", "approval", "prepared", "held", "heartbeat", "eventGrid", "impact")


def _parse(body: bytes | str | Mapping[str, Any], message_id: str | None) -> TransitionMessage:
    if isinstance(body, Mapping):
        obj: Any = dict(body)
    else:
        if len(body) > MAX_BODY_BYTES:
            raise ContractError(f"body is larger than {MAX_BODY_BYTES} bytes")
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ContractError(f"body is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ContractError("body is not a JSON object")
    warnings: list[str] = []
    try:
        cloud_event = CloudEvent.from_dict(obj, warnings=warnings)
    except CloudEventError as exc:
        raise ContractError(f"body is not a CloudEvent: {exc}") from exc
    if not cloud_event.type.startswith(TYPE_PREFIX):
        raise ContractError(f"unexpected CloudEvent type {cloud_event.type[:100]!r}")
    try:
        transition = Transition(cloud_event.type.removeprefix(TYPE_PREFIX))
    except ValueError as exc:
        raise ContractError(f"unknown transition in type {cloud_event.type[:100]!r}") from exc
    data = cloud_event.data
    if not isinstance(data, dict):
        raise ContractError("data is not a JSON object")
    version = data.get("schemaVersion")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise ContractError(f"unsupported schemaVersion {str(version)[:20]!r}")
    observer_data = data.get("observer")
    if not isinstance(observer_data, dict):
        raise ContractError("data.observer is missing")
    observer = Observer.from_data(observer_data, warnings)
    event: ScheduledEvent | None = None
    if transition is not Transition.HEARTBEAT:
        try:
            event = ScheduledEvent.from_imds(data, strict=False, prefix="data.")
        except InvalidDocument as exc:
            raise ContractError(f"data does not carry the IMDS event: {exc}") from exc
        warnings.extend(event.warnings)
    read_incarnation(data.get("documentIncarnation"), warnings, "data.documentIncarnation")
    not_before = data.get("notBefore")
    if not_before is not None and not isinstance(not_before, str):
        warnings.append(f"data.notBefore: {show(not_before)} is not a string: ignored")
    for name in _DATA_OBJECTS:
        value = data.get(name)
        if value is not None and not isinstance(value, dict):
            warnings.append(f"data.{name}: {show(value)} is not an object: ignored")
    read_impact(data.get("impact"), warnings)
    if transition is Transition.MEASURED and data.get("impact") is None:
        warnings.append("data.impact: missing on a Measured: nothing measured")
    return TransitionMessage(
        transition=transition,
        message_id=message_id or cloud_event.id,
        source=cloud_event.source,
        time=cloud_event.time,
        data=data,
        observer=observer,
        event=event,
        warnings=tuple(warnings),
    )
