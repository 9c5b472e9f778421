"""How the forwarder signs in to Service Bus with ``--namespace``: ``--credential``.

- ``managed-identity`` (the default, as on a VM): the forwarder's own token credential for
  IMDS's identity endpoint (:mod:`sebridge.forwarder.imds.token`); azure-identity, cryptography
  and msal are never imported (10.7 MiB of RSS, docs/performance.md);
- ``default``: azure-identity's DefaultAzureCredential (environment, workload identity, managed
  identity, ``az login``, ...): a developer running the forwarder off Azure against a real
  namespace.

One credential per process: the publisher and the approvals receiver share its token cache.
"""

from __future__ import annotations

import threading
from typing import Any

from sebridge import servicebus
from sebridge.forwarder.client_id import check_client_id

__all__ = ["CREDENTIALS", "check_client_id", "check_credential", "credential"]

MANAGED_IDENTITY = "managed-identity"
DEFAULT_CHAIN = "default"
CREDENTIALS = (MANAGED_IDENTITY, DEFAULT_CHAIN)


def check_credential(kind: str) -> str:
    """``kind`` if it names one of :data:`CREDENTIALS`, else a ValueError saying so."""
    if kind not in CREDENTIALS:
        raise ValueError(f"credential must be one of {', '.join(CREDENTIALS)}, not {kind!r}")
    return kind


def credential(kind: str, client_id: str | None, cancel: threading.Event | None = None) -> Any:
    """The token credential ``kind`` names, for the user-assigned identity ``client_id`` if
    set; ``cancel`` ends the managed identity's requests and pauses at once."""
    if check_credential(kind) == DEFAULT_CHAIN:
        return servicebus.identity(client_id)
    from sebridge.forwarder.imds.token import ImdsTokenCredential

    return ImdsTokenCredential(client_id, cancel=cancel)
