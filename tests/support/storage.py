"""Azurite (the real Azure Storage emulator) for tests, with the identity fake's tokens.

``azurite_storage`` (one per module: it takes a few seconds to start) serves blobs and tables
over HTTPS with ``--oauth basic``; ``storage_credential`` is a real azure-identity
ManagedIdentityCredential against the loopback identity fake, and the process trusts Azurite's
certificate through ``REQUESTS_CA_BUNDLE``, as every local run does. Import both fixtures into a
test module to use them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.azurite import Azurite
from emulators.fakes.identity import FakeIdentity

_IDENTITY_VARIABLES = (
    "AZURE_CLIENT_ID",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_SECRET",
    "MSI_ENDPOINT",
    "MSI_SECRET",
    "IMDS_ENDPOINT",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "REQUESTS_CA_BUNDLE",
)


@pytest.fixture(scope="module")
def azurite_storage() -> Iterator[tuple[Azurite, FakeIdentity]]:
    saved = {name: os.environ.get(name) for name in _IDENTITY_VARIABLES}
    identity = FakeIdentity()
    identity.start()
    try:
        with Azurite() as storage:
            for name in _IDENTITY_VARIABLES:
                os.environ.pop(name, None)
            os.environ.update({**storage.environ(), **identity.environ()})
            yield storage, identity
    finally:
        identity.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def storage_credential(azurite_storage: tuple[Azurite, FakeIdentity]) -> ManagedIdentityCredential:
    return ManagedIdentityCredential()


def unique(prefix: str) -> str:
    """A fresh container or table name (letters and digits), so tests never share state."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"
