"""Remove what earlier runs left in a shared namespace, bounded in count and time.

Both helpers receive in receive-and-delete mode, so they remove messages without settling
them one by one, and both stop at a deadline whatever is left.
"""

from __future__ import annotations

import time
from typing import Any

from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import OperationTimeoutError


def _receiver(
    client: ServiceBusClient,
    queue: str | None,
    topic: str | None,
    subscription: str | None,
    **kw: Any,
) -> Any:
    if queue is not None:
        return client.get_queue_receiver(queue, **kw)
    assert topic is not None and subscription is not None, "a queue or a topic and subscription"
    return client.get_subscription_receiver(topic, subscription, **kw)


def _delete_all(receiver: Any, deadline: float) -> int:
    removed = 0
    while time.monotonic() < deadline:
        batch = receiver.receive_messages(max_message_count=100, max_wait_time=0.3)
        removed += len(batch)
        if not batch:
            break
    return removed


def drain_entity(
    client: ServiceBusClient,
    queue: str | None = None,
    *,
    topic: str | None = None,
    subscription: str | None = None,
    dead_letter: bool = False,
    session_ids: tuple[str, ...] = (),
    budget: float = 10.0,
) -> int:
    """Remove every message of an entity (of the named sessions, for a session entity)."""
    deadline = time.monotonic() + budget
    kwargs: dict[str, Any] = {
        "receive_mode": ServiceBusReceiveMode.RECEIVE_AND_DELETE,
        "max_wait_time": 0.3,
    }
    if dead_letter:
        kwargs["sub_queue"] = ServiceBusSubQueue.DEAD_LETTER
    removed = 0
    for extra in [{}] if not session_ids else [{"session_id": sid} for sid in session_ids]:
        with _receiver(client, queue, topic, subscription, **kwargs, **extra) as receiver:
            removed += _delete_all(receiver, deadline)
    return removed


def purge_sessions(
    client: ServiceBusClient,
    queue: str | None = None,
    *,
    topic: str | None = None,
    subscription: str | None = None,
    accept_wait: float,
    budget: float = 60.0,
) -> int:
    """Remove the messages of every session of a session entity; return how many.

    Takes the next available session until none is left: the SDK then raises
    OperationTimeoutError after ``accept_wait`` seconds. Make ``accept_wait`` longer than the
    entity's LockDuration, so a session still locked by a run that was killed comes free in
    time. Use a client with ``retry_total=0``, or each final wait is repeated per retry.
    """
    deadline = time.monotonic() + budget
    removed = 0
    drained: set[str] = set()
    while time.monotonic() < deadline:
        try:
            with _receiver(
                client,
                queue,
                topic,
                subscription,
                session_id=NEXT_AVAILABLE_SESSION,
                receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                max_wait_time=accept_wait,
            ) as receiver:
                session_id = receiver.session.session_id
                if session_id in drained:
                    break  # handed out again although drained (only deferred messages left?)
                drained.add(session_id)
                removed += _delete_all(receiver, deadline)
        except OperationTimeoutError:
            break  # no session with messages left
    return removed
