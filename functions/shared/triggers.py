"""What every Service Bus trigger does before its core: decode, or log why not.

Every Service Bus trigger is also decorated with :func:`log_invocation` (one structured line per
invocation, functions/shared/invocations.py); ``decode`` tells it what the message was.
"""

from __future__ import annotations

import logging

import azure.functions as func

from functions.shared.invocations import log_invocation, note
from functions.shared.invocations import remember as _remember
from sebridge.contract.events import ContractError, TransitionMessage, parse_message

__all__ = ["decode", "log_invocation", "note"]

log = logging.getLogger("sebridge.functions")


def decode(message: func.ServiceBusMessage, function: str) -> TransitionMessage | None:
    """The contract message, or None after logging why it breaks the contract.

    A message that breaks the contract is completed with an error log, not raised: no retry
    can repair it, and raising would only cycle it ten times into the dead-letter queue of a
    workflow subscription. The ``audit`` subscription keeps a copy of every message for
    inspection, so nothing is lost by completing it here.
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
    return parsed
