"""What every Service Bus trigger does before its core: decode, verify, or log why not.

Every Service Bus-triggered function of the app (built-in or your own) is declared with
:func:`service_bus_function`, which registers the trigger on the blueprint and, for each message:

1. decodes it (:func:`decode`): a message that breaks the contract is logged and completed;
2. logs each of the parser's warnings (odd fields it normalised) at WARNING, once;
3. verifies it (functions.shared.verified: the seal check and the scope check, with the
   process's cached ARM VM reads): a refusal is logged as a security event (or a missing
   permission) and the message completed; its invocation line says ``"outcome":"refused"``
   (and ``refusal``: ``security`` or ``permission``), not ``ok``;
4. only then calls the function, with a :class:`VerifiedMessage`. A function declared with
   ``unverified=True`` (the Teams cards, the webhooks' audit endpoints) is also called for a
   refused message, with an :class:`UnverifiedMessage`, and marks its output as unverified.

Step 4 runs in the invocation's span, a child of the message's ``traceparent`` in the event's
trace (functions.shared.tracing), with step 3's ARM calls replayed under it; a refused message's
span is the root of a trace of its own (``sebridge.refused``), never in the event's trace.
Every such trigger is also decorated with :func:`log_invocation` (one structured line per
invocation, functions/shared/invocations.py). A guard test checks that every Service Bus
function of ``function_app.py`` was declared this way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal, overload

import azure.functions as func

from functions.shared import composition, deliveries, tracing
from functions.shared.invocations import REFUSED, Trigger, log_invocation, note
from functions.shared.invocations import remember as _remember
from functions.shared.verified import UnverifiedMessage, VerifiedMessage, verify_and_log
from sebridge.contract.events import ContractError, TransitionMessage, parse_message

__all__ = [
    "VERIFICATION_ATTRIBUTE",
    "decode",
    "log_invocation",
    "note",
    "service_bus_function",
]

log = logging.getLogger("sebridge.functions")

VERIFICATION_ATTRIBUTE = "sebridge_verification"  # "verified" or "unverified", on the trigger
VerifiedHandler = Callable[[VerifiedMessage], None]
AnyHandler = Callable[[VerifiedMessage | UnverifiedMessage], None]


def decode(message: func.ServiceBusMessage, function: str) -> TransitionMessage | None:
    """The contract message, or None after logging why it breaks the contract.

    A message that breaks the contract is completed with an error log, not raised: no retry
    can repair it, and raising would only cycle it ten times into the dead-letter queue of a
    workflow subscription. The ``audit`` subscription keeps a copy of every message for
    inspection, so nothing is lost by completing it here. What the parser read but had to
    normalise (its ``warnings``) is logged at WARNING, once per invocation.
    """
    try:
        parsed = parse_message(message.get_body(), message.message_id)
    except ContractError as exc:
        _remember(None)
        log.error(
            "%s: message %s breaks contract v1 and is dropped: %s",
            function,
            message.message_id,
            exc,
            extra={"messageId": message.message_id, "reason": str(exc)},
        )
        return None
    _remember(parsed)
    for warning in getattr(parsed, "warnings", ()):
        log.warning(
            "%s: message %s: %s",
            function,
            message.message_id,
            warning,
            extra={"messageId": message.message_id, "reason": str(warning)},
        )
    return parsed


def _delivery_count(message: func.ServiceBusMessage) -> int | None:
    """Which delivery of the message this is (functions.shared.deliveries), when the worker
    says."""
    try:
        count = message.delivery_count
    except Exception:  # noqa: BLE001 - a worker that does not set it
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _application_properties(message: func.ServiceBusMessage) -> Mapping[Any, Any] | None:
    """The message's application properties (the carrier of its trace), or None."""
    try:
        properties = message.application_properties
    except Exception:  # noqa: BLE001 - a worker that does not set them
        return None
    return properties if isinstance(properties, Mapping) else None


@overload
def service_bus_function(
    bp: func.Blueprint, name: str, subscription: str
) -> Callable[[VerifiedHandler], object]: ...


@overload
def service_bus_function(
    bp: func.Blueprint, name: str, subscription: str, *, unverified: Literal[True]
) -> Callable[[AnyHandler], object]: ...


def service_bus_function(
    bp: func.Blueprint, name: str, subscription: str, *, unverified: bool = False
) -> Callable[[VerifiedHandler], object] | Callable[[AnyHandler], object]:
    """Register ``name`` on ``bp``: a session-enabled trigger on the topic's ``subscription``
    (a ``%Setting%`` binding expression) that calls the decorated function with verified
    messages only (see the module's docstring), or with every message that keeps the contract
    when ``unverified`` is true."""

    def register(handler: Callable[[Any], None]) -> object:
        def trigger(msg: func.ServiceBusMessage) -> None:
            message = decode(msg, name)
            properties = _application_properties(msg)
            if message is None:
                # Its traceparent is the sender's word: a body that breaks the contract proves
                # nothing about the event it names, so its span starts a trace of its own.
                with tracing.invocation_span(
                    name,
                    properties=properties,
                    event_id=None,
                    message_id=msg.message_id,
                    refused="breaks contract v1",
                ):
                    return
            # Verified first, its ARM calls' spans held back: only a verified message's
            # invocation joins its event's trace; a refused one starts a trace of its own.
            failure: Exception | None = None
            with tracing.deferred() as verification:
                deps = composition.dependencies()
                try:
                    checked = verify_and_log(
                        name, deps.arm, message, deps.trust, records=deps.pools
                    )
                except Exception as exc:  # noqa: BLE001 - raised again in the span below
                    failure = exc
            if failure is not None:  # not verified: its span joins no event's trace
                with tracing.invocation_span(
                    name,
                    properties=properties,
                    event_id=message.event_id,
                    message_id=msg.message_id,
                    refused=f"not verified: {type(failure).__name__}",
                    start_time=verification.started,
                ):
                    verification.replay()
                    raise failure
            refused = checked.reason if isinstance(checked, UnverifiedMessage) else None
            with tracing.invocation_span(
                name,
                properties=properties,
                event_id=message.event_id,
                message_id=msg.message_id,
                attributes={"sebridge.transition": message.transition.value},
                refused=refused,
                start_time=verification.started,
            ):
                verification.replay()
                if isinstance(checked, UnverifiedMessage):
                    # Its own outcome in the invocation line, not "ok": nothing acted on it. A
                    # function that shows unverified messages may still name a finer one.
                    kind = "security" if checked.refusal.security else "permission"
                    note(REFUSED, refusal=kind)
                    if not unverified:
                        return
                with deliveries.delivery(_delivery_count(msg)):
                    handler(checked)

        trigger.__name__ = trigger.__qualname__ = name
        trigger.__doc__ = handler.__doc__
        logged: Trigger = log_invocation(trigger)
        setattr(logged, VERIFICATION_ATTRIBUTE, "unverified" if unverified else "verified")
        bound = bp.service_bus_topic_trigger(
            arg_name="msg",
            topic_name="%TopicName%",
            subscription_name=subscription,
            connection="ServiceBusConnection",
            is_sessions_enabled=True,
        )(logged)
        return bp.function_name(name)(bound)

    return register
