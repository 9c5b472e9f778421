"""A managed identity's client id, checked before it reaches a URL (a leaf module: the sign-in
choice and the IMDS token credential both use it, neither imports the other)."""

from __future__ import annotations

import re

_GUID = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def check_client_id(client_id: str) -> str:
    """``client_id`` if it is a GUID (a managed identity's client id), else a ValueError: it is
    checked before it reaches a URL."""
    if not isinstance(client_id, str) or not _GUID.fullmatch(client_id):
        raise ValueError(f"a managed identity's client id is a GUID, not {client_id[:80]!r}")
    return client_id
