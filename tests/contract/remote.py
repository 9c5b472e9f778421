"""The settings that point the contract suite at a namespace other than its own emulator
(docs/reliability.md, "The contract suite against Azure"). Standard library only:
tests/conftest.py reads it."""

from __future__ import annotations

import os

REMOTE_SETTINGS = ("SEBRIDGE_CONTRACT_CONNECTION_STRING", "SEBRIDGE_CONTRACT_NAMESPACE")


def on_a_remote_namespace() -> bool:
    """Whether the suite runs against a namespace it shares: Azure, Microsoft's emulator, one
    emulator for every worker."""
    return any(os.environ.get(name) for name in REMOTE_SETTINGS)
