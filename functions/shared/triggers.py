"""What every Service Bus trigger does before its core: decode, or log why not."""

from __future__ import annotations

import logging

import azure.functions as func

from sebridge.contract.events import ContractError, TransitionMessage, parse_message

log = logging.getLogger("sebridge.functions")


def decode(message: func.ServiceBusMessage, function: str) -> TransitionMessage | None:
    """The contract message, or None after logging why it breaks the contract.

    A message that breaks the contract is completed with an error log, not raised: no retry
    can repair it, and raising would only cycle it ten times into the dead-letter queue of a
    workflow subscription. The ``audit`` subscription keeps a copy of every message for
    inspection, so nothing is lost by completing it here.
    """
    try:
        return parse_message(message.get_body(), message.message_id)
    except ContractError as exc:
        log.error(
            "%s: message %s breaks contract v1 and is dropped: %s",
            function,
            message.message_id,
            exc,
            extra={"messageId": message.message_id, "reason": str(exc)},
        )
        return None
