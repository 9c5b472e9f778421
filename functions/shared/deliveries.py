"""Which delivery of its Service Bus message an invocation is (core).

A fault that a redelivery may repair is raised, and Service Bus brings the message back, up to
the subscription's MaxDeliveryCount, then dead-letters it. A fault that no redelivery repairs
must not go the dead-letter way silently: on the last delivery a workflow gives up on it out
loud instead (lb-pools' restore that ARM refuses for good: functions.lb_pools.core), and the
message completes. The trigger layer (functions.shared.triggers) says which delivery this is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Every subscription's and queue's MaxDeliveryCount (infra/servicebus-emulator/Config.json, which
# the Bicep modules deploy as is; a test keeps the two equal).
MAX_DELIVERY_COUNT = 10

_count: ContextVar[int | None] = ContextVar("sebridge_delivery_count", default=None)


@contextmanager
def delivery(count: int | None) -> Iterator[None]:
    """The invocation inside handles the ``count``-th delivery of its message (None: unknown)."""
    token = _count.set(count)
    try:
        yield
    finally:
        _count.reset(token)


def is_last() -> bool:
    """Is this the message's last delivery before the dead-letter queue? (False when unknown:
    outside a Service Bus trigger, a fault is raised as it always was.)"""
    count = _count.get()
    return count is not None and count >= MAX_DELIVERY_COUNT
