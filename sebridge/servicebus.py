"""The one home of the Service Bus mapping, shipped by both deployables (an adapter: SDK here).

- :func:`add_connection_arguments`: the flags (and their environment variables) that say how to
  reach Service Bus, the same for ``sebridge forwarder`` and ``sebridge approve``;
- :func:`client`: a ``ServiceBusClient`` from a namespace (azure-identity: managed identity in
  Azure) or a connection string (emulators), over AMQP (TCP 5671) or AMQP over WebSockets
  (``transport="websocket"``: TCP 443, for hosts behind a proxy or with only 443 open);
- :func:`envelope_message` / :func:`command_message`: contract objects to SDK messages;
- :func:`message_body`: a received message's body as bytes, whatever AMQP body type it has.

The SDK is imported inside the functions, so ``sebridge forwarder --dry-run`` and the pure
kernel never load it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from sebridge.contract.commands import ApproveCommand
from sebridge.contract.events import Envelope

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

COMMAND_CONTENT_TYPE = "application/json"
COMMAND_SUBJECT = "approve"

# The transports a setting may name: plain AMQP, or AMQP over WebSockets (the SDK's
# TransportType.AmqpOverWebsocket, which imports the websocket-client package).
TRANSPORTS = ("amqp", "websocket")


def check_transport(transport: str) -> str:
    """``transport`` if it names one of :data:`TRANSPORTS` that can be used here, else a
    ValueError saying why (without loading the SDK: settings are checked at start-up)."""
    if transport not in TRANSPORTS:
        raise ValueError(
            f"Service Bus transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}"
        )
    if transport == "websocket":
        import importlib.util

        if importlib.util.find_spec("websocket") is None:
            raise ValueError(
                "the websocket transport needs the websocket-client package "
                "(the SDK imports it for AMQP over WebSockets); it is not installed"
            )
    return transport


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` if it is ``sb://HOST[:PORT]`` (the SDK's ``custom_endpoint_address``: where
    to connect instead of the namespace's own address), else a ValueError saying why."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"not a URL: {endpoint!r} ({exc})") from exc
    if parts.scheme != "sb" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"must be sb://HOST or sb://HOST:PORT, not {endpoint!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"must be sb://HOST or sb://HOST:PORT, not {endpoint!r}")
    if port == 0:
        raise ValueError(f"port 0 is not a port: {endpoint!r}")
    return endpoint


def add_connection_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """``--namespace`` or ``--connection-string``, ``--client-id``, ``--servicebus-transport``
    and ``--servicebus-endpoint``, each defaulting to its environment variable in ``env``
    (values from ``env`` are not checked here: call :func:`check_transport` and
    :func:`check_endpoint`)."""
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--namespace",
        default=env.get("SEBRIDGE_NAMESPACE"),
        help="Service Bus namespace FQDN, managed identity [SEBRIDGE_NAMESPACE]",
    )
    target.add_argument(
        "--connection-string",
        default=env.get("SEBRIDGE_CONNECTION_STRING"),
        help="Service Bus connection string, for emulators [SEBRIDGE_CONNECTION_STRING]",
    )
    parser.add_argument(
        "--client-id",
        default=env.get("AZURE_CLIENT_ID"),
        help="user-assigned managed identity client id [AZURE_CLIENT_ID]",
    )
    parser.add_argument(
        "--servicebus-transport",
        choices=TRANSPORTS,
        default=env.get("SEBRIDGE_SERVICEBUS_TRANSPORT", "amqp"),
        help="amqp (TCP 5671) or websocket (AMQP over WebSockets, TCP 443: behind a proxy or "
        "where only 443 is open) [SEBRIDGE_SERVICEBUS_TRANSPORT] (default %(default)s)",
    )
    parser.add_argument(
        "--servicebus-endpoint",
        default=env.get("SEBRIDGE_SERVICEBUS_ENDPOINT"),
        help="connect to sb://HOST[:PORT] instead of the namespace's own address (an "
        "application gateway, a private route, the emulator's WebSocket port); the namespace "
        "still names the service [SEBRIDGE_SERVICEBUS_ENDPOINT] (default: none)",
    )


# The SDK's administration package and its generated REST layer: azure.servicebus imports the
# first for one helper class (DictMixin, in its _models) and, through its __init__, its whole
# client, which brings azure.core's requests transport (requests, urllib3, charset_normalizer,
# idna) and the REST models. Nothing that sends or receives uses them.
_ADMINISTRATION = ("azure.servicebus.management", "azure.servicebus.management._generated")


def load_sdk(*, administration: bool = True) -> None:
    """Import the SDK now, on the calling thread. A process that first imports it from two
    threads at once can fail: Python's per-module import locks reported a deadlock among
    azure.core's modules to one thread and a KeyError for 'azure.servicebus' to the other
    (seen in the forwarder: its sender connecting while the approvals worker started).

    ``administration=False`` (the forwarder: it only sends and receives) imports the SDK
    without running the administration packages' ``__init__`` (see :data:`_ADMINISTRATION`):
    6.4 MiB less resident memory on every VM. Their modules the SDK needs are imported as
    usual; the packages themselves are dropped from ``sys.modules`` afterwards, so a later
    ``import azure.servicebus.management`` gets the whole package. Should a version of the SDK
    need more of them at import, it is imported the usual way instead."""
    import sys

    if "azure.servicebus" in sys.modules or administration:
        import azure.servicebus.exceptions

        return
    import importlib.util
    import os
    import types

    spec = importlib.util.find_spec("azure.servicebus")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("azure-servicebus is not installed", name="azure.servicebus")
    root = os.path.dirname(spec.origin)
    placed = []
    for name in _ADMINISTRATION:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split(".")[2:])]
            package.__package__ = name
            sys.modules[name] = package
            placed.append(name)
    try:
        import azure.servicebus.exceptions
    except ImportError:
        for name in [n for n in sys.modules if n.startswith("azure.servicebus")]:
            del sys.modules[name]
        import azure.servicebus.exceptions  # noqa: F401
    finally:
        for name in placed:
            bare = sys.modules.get(name)
            if bare is not None and not hasattr(bare, "__file__"):
                del sys.modules[name]
                parent, _, child = name.rpartition(".")
                if getattr(sys.modules.get(parent), child, None) is bare:
                    delattr(sys.modules[parent], child)  # bound again by the next import


def client(
    *,
    namespace: str | None = None,
    connection_string: str | None = None,
    client_id: str | None = None,
    credential: Any = None,
    transport: str = "amqp",
    endpoint: str | None = None,
    **options: Any,
) -> ServiceBusClient:
    """A client for ``connection_string`` if given, else for ``namespace`` with ``credential``
    (default: ``DefaultAzureCredential``, for the user-assigned identity ``client_id`` if set),
    over ``transport`` (one of :data:`TRANSPORTS`), to ``endpoint`` (``sb://HOST[:PORT]``) instead
    of the namespace's own address if given. ``options`` go to the client (``retry_total``,
    ...)."""
    from azure.servicebus import ServiceBusClient, TransportType

    # Always said: given a custom endpoint and no transport, the SDK picks WebSockets.
    websocket = check_transport(transport) == "websocket"
    options.setdefault(
        "transport_type", TransportType.AmqpOverWebsocket if websocket else TransportType.Amqp
    )
    if endpoint:
        options.setdefault("custom_endpoint_address", check_endpoint(endpoint))

    if connection_string:
        return ServiceBusClient.from_connection_string(connection_string, **options)
    if not namespace:
        raise ValueError("a Service Bus namespace or connection string is required")
    return ServiceBusClient(namespace, credential or identity(client_id), **options)


# What Service Bus's Entra tokens are for (the SDK asks for this scope).
TOKEN_SCOPE = "https://servicebus.azure.net/.default"  # noqa: S105 - a scope, not a secret


def identity(client_id: str | None = None) -> Any:
    """The credential every Service Bus client here signs in with: azure-identity's default
    chain, for the user-assigned managed identity ``client_id`` if set (on a VM, the
    forwarders' identity)."""
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(managed_identity_client_id=client_id)


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
        # The event's trace, back to the forwarder (sebridge.contract.tracecontext).
        application_properties=cast("dict[str | bytes, Any]", command.trace_context().properties()),
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
