"""The one home of the Service Bus mapping, shipped by both deployables (an adapter: SDK here).

- :func:`client`: a ``ServiceBusClient`` from a namespace (azure-identity: managed identity in
  Azure) or a connection string (emulators);
- :func:`envelope_message` / :func:`command_message`: contract objects to SDK messages;
- :func:`message_body`: a received message's body as bytes, whatever AMQP body type it has.

The SDK is imported inside the functions, so ``sebridge forwarder --dry-run`` and the pure
kernel never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from sebridge.contract.commands import ApproveCommand
from sebridge.contract.events import Envelope

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

COMMAND_CONTENT_TYPE = "application/json"
COMMAND_SUBJECT = "approve"


def client(
    *,
    namespace: str | None = None,
    connection_string: str | None = None,
    client_id: str | None = None,
    credential: Any = None,
    **options: Any,
) -> ServiceBusClient:
    """A client for ``connection_string`` if given, else for ``namespace`` with ``credential``
    (default: ``DefaultAzureCredential``, for the user-assigned identity ``client_id`` if set).
    ``options`` go to the client (``retry_total``, ``transport_type``, ...)."""
    from azure.servicebus import ServiceBusClient

    if connection_string:
        return ServiceBusClient.from_connection_string(connection_string, **options)
    if not namespace:
        raise ValueError("a Service Bus namespace or connection string is required")
    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential(managed_identity_client_id=client_id)
    return ServiceBusClient(namespace, credential, **options)


def envelope_message(envelope: Envelope) -> ServiceBusMessage:
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(
        body=envelope.body_bytes(),
        message_id=envelope.message_id,
        session_id=envelope.session_id,
        subject=envelope.subject,
        content_type=envelope.content_type,
        application_properties=cast(
            "dict[str | bytes, Any]", dict(envelope.application_properties)
        ),
    )


def command_message(command: ApproveCommand, session_id: str) -> ServiceBusMessage:
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(
        command.body_bytes(),
        message_id=command.message_id,
        session_id=session_id,
        content_type=COMMAND_CONTENT_TYPE,
        subject=COMMAND_SUBJECT,
    )


def message_body(message: Any) -> bytes:
    """The body of a received message as bytes: data sections joined, a value or sequence
    body as its string form (never raises)."""
    body = message.body
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8", "replace")
    try:
        return b"".join(part if isinstance(part, bytes) else bytes(part) for part in body)
    except TypeError:
        return repr(body).encode("utf-8", "replace")
