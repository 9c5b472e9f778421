"""A stored message as the AMQP bytes a receiver gets: broker annotations, header, bare message."""

from __future__ import annotations

import uuid
from typing import Any

from proton import symbol, timestamp

from emulators.servicebus.broker import State, StoredMessage
from emulators.servicebus.codec import encode_message

DATETIMEOFFSET_EPOCH = 621355968000000000  # .NET ticks at 1970-01-01

_ENQUEUED = symbol("x-opt-enqueued-time")
_SEQUENCE = symbol("x-opt-sequence-number")
_LOCKED_UNTIL = symbol("x-opt-locked-until")
_MESSAGE_STATE = symbol("x-opt-message-state")
_DEAD_LETTER_SOURCE = symbol("x-opt-deadletter-source")
_LOCK_TOKEN = symbol("x-opt-lock-token")


def to_timestamp(seconds: float) -> timestamp:
    return timestamp(int(seconds * 1000))


def to_ticks(seconds: float) -> int:
    """DateTimeOffset ticks, the form of com.microsoft:locked-until-utc on a session link."""
    return int(seconds * 10_000_000) + DATETIMEOFFSET_EPOCH


def encode_delivery(
    message: StoredMessage,
    *,
    locked: bool,
    lock_token: uuid.UUID | None = None,
    on_link: bool = False,
) -> bytes:
    """The message as a receiver gets it. Deliveries on a link (``on_link``) carry delivery
    annotations as Service Bus sends them: x-opt-lock-token in peek-lock mode, an empty map in
    receive-and-delete mode; messages inside $management responses carry none."""
    sections = message.sections
    annotations: dict[Any, Any] = {symbol(str(k)): v for k, v in sections.annotations.items()}
    annotations[_ENQUEUED] = to_timestamp(message.enqueued_at)
    annotations[_SEQUENCE] = int(message.sequence_number)
    if locked and message.locked_until:
        annotations[_LOCKED_UNTIL] = to_timestamp(message.locked_until)
    if message.state is State.DEFERRED or message.was_deferred:
        annotations[_MESSAGE_STATE] = 1
    if message.dead_letter_source:
        annotations[_DEAD_LETTER_SOURCE] = message.dead_letter_source
    durable, priority, _ttl, first_acquirer, _count = sections.header
    header = [durable, priority, message.ttl_ms, first_acquirer, message.delivery_count]
    bare = sections.properties_raw + message.application_bytes() + sections.body_raw
    delivery: dict[Any, Any] | None = None
    if on_link:
        delivery = {_LOCK_TOKEN: lock_token} if lock_token is not None else {}
    return encode_message(header, annotations, bare, delivery)
