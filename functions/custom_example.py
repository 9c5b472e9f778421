"""Your own subscriber, as an example: warn when a VM is about to be lost for good.

Registered only when CUSTOM_SUBSCRIBER_ENABLED is true. It is bound to its own subscription
(CustomSubscriptionName) whose SQL filter passes only what it wants (see README "Subscribe your
own function"): ``transition = 'Scheduled' AND eventType IN ('Preempt', 'Terminate')``. Copy
this file, change the filter and the core function, and register the blueprint.
"""

from __future__ import annotations

import logging

import azure.functions as func

from functions.shared.triggers import decode, log_invocation
from sebridge.contract.events import TransitionMessage

log = logging.getLogger("sebridge.functions.custom")
bp = func.Blueprint()  # type: ignore[no-untyped-call]


def summary(message: TransitionMessage) -> str:
    """The core: one line about the event (pure, unit-testable)."""
    event = message.event
    if event is None:
        return f"{message.transition.value} from {message.observer.vm_name}"
    vms = ", ".join(event.resources) or message.observer.vm_name
    when = event.not_before.isoformat() if event.not_before else "now"
    return f"{event.event_type} {message.transition.value.lower()} for {vms} at {when}"


@bp.function_name("custom_example")
@bp.service_bus_topic_trigger(
    arg_name="msg",
    topic_name="%TopicName%",
    subscription_name="%CustomSubscriptionName%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
@log_invocation
def custom_example(msg: func.ServiceBusMessage) -> None:
    message = decode(msg, "custom_example")
    if message is not None:
        log.warning("VM loss ahead: %s", summary(message))
