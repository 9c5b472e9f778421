"""Service Bus connections named by a binding's `connection` property (pure).

As in the Functions Service Bus extension: the setting `<connection>` holds a connection string,
or the setting collection `<connection>__fullyQualifiedNamespace` (plus optional `__clientId`
and `__credential`) means an identity-based connection through DefaultAzureCredential.
A connection string never appears in a repr or a log line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_CONNECTION = "AzureWebJobsServiceBus"  # what the extension uses when none is named


class MissingConnectionError(ValueError):
    """A binding names a connection that the settings do not define."""


@dataclass(frozen=True)
class ConnectionStringConnection:
    setting: str
    connection_string: str = field(repr=False)

    def describe(self) -> str:
        return f"{self.setting} (connection string)"


@dataclass(frozen=True)
class IdentityConnection:
    setting: str
    fully_qualified_namespace: str
    client_id: str | None = None
    credential: str | None = None

    def describe(self) -> str:
        return f"{self.setting} (identity, {self.fully_qualified_namespace})"


Connection = ConnectionStringConnection | IdentityConnection


def resolve_connection(name: str | None, settings: Mapping[str, str]) -> Connection:
    setting = name or DEFAULT_CONNECTION
    value = settings.get(setting)
    if value:
        return ConnectionStringConnection(setting=setting, connection_string=value)
    namespace = settings.get(f"{setting}__fullyQualifiedNamespace")
    if namespace:
        return IdentityConnection(
            setting=setting,
            fully_qualified_namespace=namespace,
            client_id=settings.get(f"{setting}__clientId") or None,
            credential=settings.get(f"{setting}__credential") or None,
        )
    raise MissingConnectionError(
        f"connection {setting!r} is not configured: set the app setting {setting!r} to a "
        f"connection string or {setting}__fullyQualifiedNamespace for an identity connection"
    )
