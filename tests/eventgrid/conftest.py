"""Fixtures for the Event Grid ingestion tests: the workflow tests' loopback fakes, plus blob
storage with ETags for the per-event records."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from tests.functions.conftest import (  # noqa: F401 - fixtures, found by pytest by name
    app,
    arm_fake,
    identity_fake,
    make_app,
    storage_fake,
    teams_fake,
)

STATE_CONTAINER = "sebridge-eventgrid-state"


@pytest.fixture
def state_storage() -> Iterator[FakeConditionalBlobStorage]:
    server = FakeConditionalBlobStorage()
    server.start()
    yield server
    server.stop()
