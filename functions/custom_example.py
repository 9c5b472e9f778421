"""Your own subscriber, as an example: warn when a VM is about to be lost for good.

Registered only when CUSTOM_SUBSCRIBER_ENABLED is true. It is bound to its own subscription
(CustomSubscriptionName) whose SQL filter passes only what it wants (see README "Subscribe your
own function"): ``transition = 'Scheduled' AND eventType IN ('Preempt', 'Terminate')``. Copy
this file, change the filter and the core function, and register the blueprint.
"""

from __future__ import annotations

import logging

import azure.functions as func

from functions.shared.triggers import service_bus_function
from functions.shared.verified import VerifiedMessage
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


# Declared with service_bus_function: the message is decoded, and the seal and scope checks
# have run, before this is called (a refused message never gets here).
@service_bus_function(bp, "custom_example", "%CustomSubscriptionName%")
def custom_example(message: VerifiedMessage) -> None:
    log.warning("VM loss ahead: %s", summary(message.message))
