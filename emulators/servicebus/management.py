"""``$management`` request/response operations (the ones azure-servicebus uses), as pure
functions of the broker state. See "AMQP 1.0 in Azure Service Bus: request-response-based
operations" for the operation names and map keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from proton import UNDESCRIBED, Array, Data

from emulators.servicebus.broker import (
    BrokerError,
    InvalidRequest,
    MessageStore,
    Resolved,
    StoredMessage,
    check_size,
)
from emulators.servicebus.codec import MessageDecodeError, decode_sections
from emulators.servicebus.wire import encode_delivery, to_timestamp


@dataclass(frozen=True)
class Response:
    status: int
    description: str
    value: Any = None
    condition: str | None = None


OK = 200
NO_CONTENT = 204
# what the SDK sends as last-updated-time when no state_updated_after is given (year 10000)
MAX_LAST_UPDATED_MS = 253402300800000


def _array(kind: int, values: list[Any]) -> Array:
    return Array(cast(Any, UNDESCRIBED), kind, *values)


def _require(body: Mapping[str, Any], key: str) -> Any:
    if key not in body:
        raise InvalidRequest(f"request body lacks {key!r}")
    return body[key]


def _tokens(body: Mapping[str, Any]) -> list[uuid.UUID]:
    raw = _require(body, "lock-tokens")
    values = list(raw.elements if isinstance(raw, Array) else raw)
    if any(v is None for v in values):
        raise InvalidRequest("The lock token supplied is invalid: it is null")
    try:
        return [v if isinstance(v, uuid.UUID) else uuid.UUID(str(v)) for v in values]
    except ValueError as exc:
        raise InvalidRequest(f"bad lock token: {exc}") from exc


def _sequence_numbers(body: Mapping[str, Any]) -> list[int]:
    raw = _require(body, "sequence-numbers")
    return [int(v) for v in (raw.elements if isinstance(raw, Array) else raw)]


def _store(resolved: Resolved) -> MessageStore:
    if resolved.store is None:
        raise InvalidRequest("this operation needs a queue or subscription, not a topic")
    return resolved.store


def handle(
    resolved: Resolved, operation: str, body: Any, now: float, on_change: Callable[[], None]
) -> Response:
    """Run one operation; BrokerError becomes an error response, never an exception."""
    handler = _OPERATIONS.get(operation)
    if handler is None:
        return Response(
            501,
            f"operation {operation!r} is not supported by the emulator",
            condition="amqp:not-implemented",
        )
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        return Response(400, "request body must be an AMQP map", condition="amqp:decode-error")
    body = {str(k): v for k, v in body.items()}
    try:
        response = handler(resolved, body, now)
    except BrokerError as exc:
        return Response(exc.status, exc.description, condition=exc.condition)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        # a malformed request body; answer it rather than leave the client waiting
        return Response(400, f"bad {operation} request: {exc}", condition="amqp:invalid-field")
    on_change()
    return response


def _renew_lock(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    store = _store(resolved)
    until = [to_timestamp(store.renew_lock(token, now)) for token in _tokens(body)]
    return Response(OK, "OK", {"expirations": _array(Data.TIMESTAMP, until)})


def _renew_session_lock(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    store = _store(resolved)
    until = store.renew_session(str(_require(body, "session-id")), None, now)
    return Response(OK, "OK", {"expiration": to_timestamp(until)})


def _messages_value(messages: list[StoredMessage], *, locked: bool, tokens: bool) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    for message in messages:
        entry: dict[str, Any] = {"message": encode_delivery(message, locked=locked)}
        if tokens and message.lock_token is not None:
            entry["lock-token"] = message.lock_token
        entries.append(entry)
    return {"messages": entries}


def _peek(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    store = _store(resolved)
    start = int(body.get("from-sequence-number", 0) or 0)
    count = int(body.get("message-count", 1) or 1)
    session = body.get("session-id")
    messages = store.peek(start, count, None if session is None else str(session))
    if not messages:
        return Response(NO_CONTENT, "No messages to peek")
    return Response(OK, "OK", _messages_value(messages, locked=False, tokens=False))


def _receive_by_sequence(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    store = _store(resolved)
    peek_lock = int(body.get("receiver-settle-mode", 1) or 0) == 1
    messages = store.receive_deferred(_sequence_numbers(body), now, None, peek_lock=peek_lock)
    return Response(OK, "OK", _messages_value(messages, locked=peek_lock, tokens=peek_lock))


def _update_disposition(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    store = _store(resolved)
    status = str(_require(body, "disposition-status"))
    for token in _tokens(body):
        if status == "completed":
            store.complete(token, now)
        elif status == "abandoned":
            store.abandon(token, now)
        elif status == "defered":
            store.defer(token, now)
        elif status == "suspended":
            reason = body.get("deadletter-reason")
            description = body.get("deadletter-description")
            store.dead_letter(
                token,
                now,
                None if reason is None else str(reason),
                None if description is None else str(description),
            )
        else:
            raise InvalidRequest(f"unknown disposition-status {status!r}")
    return Response(OK, "OK")


def _schedule(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    if resolved.target is None:
        raise InvalidRequest("messages can only be scheduled on a queue or topic")
    entries = _require(body, "messages")
    sequence_numbers: list[int] = []
    for entry in entries:
        try:
            raw = bytes(entry["message"])
            sections = decode_sections(raw)
        except (KeyError, TypeError, MessageDecodeError) as exc:
            raise InvalidRequest(f"bad scheduled message: {exc}") from exc
        check_size(resolved.target, len(raw), sections.properties[0] or "")
        at = sections.annotations.get("x-opt-scheduled-enqueue-time")
        when = now if at is None else int(at) / 1000.0
        sequence_numbers.append(resolved.target.schedule(sections, when, now))
    return Response(OK, "OK", {"sequence-numbers": _array(Data.LONG, sequence_numbers)})


def _cancel(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    if resolved.target is None:
        raise InvalidRequest("scheduled messages live on a queue or topic")
    for seq in _sequence_numbers(body):
        resolved.target.cancel_scheduled(seq)
    return Response(OK, "OK")


def _get_session_state(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    info = _store(resolved).session_for(str(_require(body, "session-id")), None, now)
    return Response(OK, "OK", {"session-state": info.state})


def _set_session_state(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    info = _store(resolved).session_for(str(_require(body, "session-id")), None, now)
    state = body.get("session-state")
    info.state = None if state is None else bytes(state)
    info.state_updated_at = now
    return Response(OK, "OK")


def _list_sessions(resolved: Resolved, body: dict[str, Any], now: float) -> Response:
    store = _store(resolved)
    skip = int(body.get("skip", 0) or 0)
    top = int(body.get("top", 100) or 100)
    cutoff = body.get("last-updated-time")
    if cutoff is None or int(cutoff) >= MAX_LAST_UPDATED_MS:
        # no filter: the sessions holding messages
        ids = [sid for sid, info in store.sessions.items() if info.ready or info.locked_tokens]
    else:
        # state_updated_after: the sessions whose state was set after the cutoff
        after = int(cutoff) / 1000.0
        ids = [
            sid
            for sid, info in store.sessions.items()
            if info.state_updated_at is not None and info.state_updated_at > after
        ]
    page = ids[skip : skip + top]
    if not page:
        return Response(NO_CONTENT, "No sessions")
    return Response(OK, "OK", {"skip": skip + len(page), "sessions-ids": page})


_OPERATIONS: dict[str, Callable[[Resolved, dict[str, Any], float], Response]] = {
    "com.microsoft:renew-lock": _renew_lock,
    "com.microsoft:renew-session-lock": _renew_session_lock,
    "com.microsoft:peek-message": _peek,
    "com.microsoft:receive-by-sequence-number": _receive_by_sequence,
    "com.microsoft:update-disposition": _update_disposition,
    "com.microsoft:schedule-message": _schedule,
    "com.microsoft:cancel-scheduled-message": _cancel,
    "com.microsoft:get-session-state": _get_session_state,
    "com.microsoft:set-session-state": _set_session_state,
    "com.microsoft:get-message-sessions": _list_sessions,
}
