"""Received SDK messages -> azure.functions.ServiceBusMessage, the way the Python worker does.

The Functions host hands the worker the body plus "trigger metadata" (MessageId, SessionId,
UserProperties, ...), and the worker builds the ServiceBusMessage with azure.functions' own
ServiceBusMessageInConverter. This module builds the same metadata from an
azure.servicebus ServiceBusReceivedMessage and runs the real converter, so every field, and
`.metadata`, looks like it does in Azure.

Deliberate differences: TimeToLive goes over as whole seconds (the converter cannot parse the
host's "d.hh:mm:ss" for TTLs of a day or more); datetimes go over as ISO 8601 UTC with "Z".
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from azure.functions import meta
from azure.functions.servicebus import ServiceBusMessage, ServiceBusMessageInConverter
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.amqp import AmqpMessageBodyType


class MessageConversionError(ValueError):
    """A received message cannot be presented to the function (e.g. an AMQP sequence body)."""


def message_body(message: ServiceBusReceivedMessage) -> bytes:
    """The body bytes, as the .NET SDK's ServiceBusReceivedMessage.Body would give them."""
    body_type = message.body_type
    if body_type == AmqpMessageBodyType.DATA:
        return b"".join(bytes(part) for part in message.body)
    if body_type == AmqpMessageBodyType.VALUE:
        value = message.body
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode("utf-8")
        return json.dumps(value, default=_json_default).encode("utf-8")
    raise MessageConversionError(
        f"message {message.message_id!r} has an AMQP {body_type} body; Functions reads data "
        "or value bodies only"
    )


def _json_default(value: Any) -> Any:
    # Application properties may carry AMQP types JSON has no word for; the host serialises
    # them with Newtonsoft, which writes dates as ISO 8601 and bytes as base64.
    if isinstance(value, dt.datetime):
        return _iso(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, uuid.UUID | dt.timedelta):
        return str(value)
    return repr(value)


def _iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def application_properties(message: ServiceBusReceivedMessage) -> dict[str, Any]:
    props = message.application_properties or {}
    return {_text(k): (_text(v) if isinstance(v, bytes) else v) for k, v in props.items()}


def _fields(message: ServiceBusReceivedMessage, locked_until: dt.datetime | None) -> dict[str, Any]:
    """Metadata values keyed by the names the Functions host uses."""
    ttl = message.time_to_live
    state = getattr(message, "state", None)
    lock_token = message.lock_token
    return {
        "MessageId": message.message_id,
        "SessionId": message.session_id,
        "ContentType": message.content_type,
        "CorrelationId": message.correlation_id,
        "Subject": message.subject,
        "Label": message.subject,  # the pre-v5 name of Subject, still in the metadata
        "ReplyTo": message.reply_to,
        "ReplyToSessionId": message.reply_to_session_id,
        "To": message.to,
        "PartitionKey": message.partition_key,
        "TransactionPartitionKey": None,
        "TimeToLive": None if ttl is None else str(int(ttl.total_seconds())),
        "DeliveryCount": delivery_count(message),
        "SequenceNumber": message.sequence_number,
        "EnqueuedSequenceNumber": message.enqueued_sequence_number,
        "EnqueuedTimeUtc": _iso(message.enqueued_time_utc),
        "ExpiresAtUtc": _iso(message.expires_at_utc),
        "ScheduledEnqueueTimeUtc": _iso(message.scheduled_enqueue_time_utc),
        "LockedUntil": _iso(locked_until or message.locked_until_utc),
        "LockToken": None if lock_token is None else str(lock_token),
        "DeadLetterSource": message.dead_letter_source,
        "DeadLetterReason": message.dead_letter_reason,
        "DeadLetterErrorDescription": message.dead_letter_error_description,
        "State": None if state is None else int(state),
    }


def delivery_count(message: ServiceBusReceivedMessage) -> int:
    """Deliveries so far, counting this one, as the .NET SDK and so Functions report it.

    The AMQP header counts earlier failed attempts (0 on first delivery) and the Python SDK
    passes it through; Azure.Messaging.ServiceBus adds one, so a first delivery is 1.
    """
    return (message.delivery_count or 0) + 1


def _datum(value: Any) -> meta.Datum | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return meta.Datum(type="json", value=json.dumps(value))
    if isinstance(value, int):
        return meta.Datum(type="int", value=value)
    if isinstance(value, str):
        return meta.Datum(type="string", value=value)
    return meta.Datum(type="json", value=json.dumps(value, default=_json_default))


def _sys_metadata(function_name: str) -> meta.Datum:
    return meta.Datum(
        type="json",
        value=json.dumps(
            {
                "MethodName": function_name,
                "UtcNow": _iso(dt.datetime.now(dt.UTC)),
                "RandomGuid": str(uuid.uuid4()),
            }
        ),
    )


def trigger_metadata(
    message: ServiceBusReceivedMessage,
    *,
    function_name: str,
    locked_until: dt.datetime | None = None,
) -> dict[str, meta.Datum]:
    metadata: dict[str, meta.Datum] = {}
    for name, value in _fields(message, locked_until).items():
        datum = _datum(value)
        if datum is not None:
            metadata[name] = datum
    props = application_properties(message)
    # Both names are present in the host's metadata; the converter reads UserProperties to
    # tell a single message from a batch.
    metadata["ApplicationProperties"] = _datum(props) or meta.Datum(type="json", value="{}")
    metadata["UserProperties"] = _datum(props) or meta.Datum(type="json", value="{}")
    metadata["sys"] = _sys_metadata(function_name)
    return metadata


def to_function_message(
    message: ServiceBusReceivedMessage,
    *,
    function_name: str,
    locked_until: dt.datetime | None = None,
) -> ServiceBusMessage:
    data = meta.Datum(type="bytes", value=message_body(message))
    metadata = trigger_metadata(message, function_name=function_name, locked_until=locked_until)
    result = ServiceBusMessageInConverter.decode(data, trigger_metadata=metadata)
    assert isinstance(result, ServiceBusMessage)
    return result


def batch_trigger_metadata(
    messages: Sequence[ServiceBusReceivedMessage],
    *,
    function_name: str,
    locked_until: dt.datetime | None = None,
) -> dict[str, meta.Datum]:
    """Metadata for cardinality many: one <Name>Array per field, as the host sends it."""
    rows = [_fields(m, locked_until) for m in messages]
    metadata: dict[str, meta.Datum] = {}
    for name in rows[0] if rows else ():
        values = [row[name] for row in rows]
        metadata[f"{name}Array"] = meta.Datum(type="json", value=json.dumps(values))
    props = [application_properties(m) for m in messages]
    encoded = json.dumps(props, default=_json_default)
    metadata["ApplicationPropertiesArray"] = meta.Datum(type="json", value=encoded)
    metadata["UserPropertiesArray"] = meta.Datum(type="json", value=encoded)
    metadata["sys"] = _sys_metadata(function_name)
    return metadata


def to_function_messages(
    messages: Sequence[ServiceBusReceivedMessage],
    *,
    function_name: str,
    locked_until: dt.datetime | None = None,
) -> list[ServiceBusMessage]:
    bodies = [message_body(m) for m in messages]
    # The worker receives a protobuf CollectionBytes; the converter only reads `.bytes`.
    data = meta.Datum(type="collection_bytes", value=SimpleNamespace(bytes=bodies))
    metadata = batch_trigger_metadata(
        messages, function_name=function_name, locked_until=locked_until
    )
    result = ServiceBusMessageInConverter.decode(data, trigger_metadata=metadata)
    assert isinstance(result, list)
    return result


def describe(metadata: Mapping[str, meta.Datum]) -> dict[str, Any]:
    """Plain values of a metadata mapping (for logs and tests)."""
    return {k: v.python_value for k, v in metadata.items()}
