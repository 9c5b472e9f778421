"""Reading the emulator's entities back with the real SDK, for tests."""

from __future__ import annotations

import time
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient
from azure.servicebus.exceptions import OperationTimeoutError

from sebridge.servicebus import message_body

TOPIC = "scheduled-events"


def as_dict(message: Any) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "session_id": message.session_id,
        "subject": message.subject,
        "properties": {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in (message.application_properties or {}).items()
        },
        "body": message_body(message),
        "dead_letter_reason": message.dead_letter_reason,
        "dead_letter_error_description": message.dead_letter_error_description,
        "delivery_count": message.delivery_count,
    }


def receive_all(
    connection_string: str,
    subscription: str,
    *,
    want: int,
    timeout: float = 20.0,
    topic: str = TOPIC,
    sub_queue: Any = None,
) -> list[dict[str, Any]]:
    """Complete and return messages from every session of a subscription until ``want`` are in
    (then one more empty round, so that extras would be caught). Fewer than ``want`` when
    ``timeout`` passes is a failure: a test that asks for more than it expects would otherwise
    pass slowly, waiting out its whole timeout every run."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    idle_rounds = 0
    # retry_total=0: with nothing waiting, the SDK would retry the session accept 3 times.
    with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        while time.monotonic() < deadline and (len(out) < want or idle_rounds < 1):
            try:
                session = None if sub_queue is not None else NEXT_AVAILABLE_SESSION
                with client.get_subscription_receiver(
                    topic, subscription, session_id=session, max_wait_time=1, sub_queue=sub_queue
                ) as receiver:
                    got = receiver.receive_messages(max_message_count=100, max_wait_time=1)
                    for message in got:
                        out.append(as_dict(message))
                        receiver.complete_message(message)
                    idle_rounds = 0 if got else idle_rounds + 1
            except OperationTimeoutError:
                idle_rounds += 1  # no session with messages waiting
    if len(out) < want:
        raise AssertionError(
            f"{len(out)} of {want} messages on {topic}/{subscription} within {timeout:g} s: "
            f"{[(m['session_id'], m['subject']) for m in out]}"
        )
    return out
