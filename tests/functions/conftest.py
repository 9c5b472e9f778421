"""Fixtures for the workflow tests: loopback fakes and the app's function objects.

Teams, ARM, the managed-identity endpoint and blob storage are real HTTP servers on 127.0.0.1
(emulators/fakes), reached through the production adapters, requests and azure-identity.
Service Bus sends (commands, Prepared) go to recording fakes injected at the composition
root until the end-to-end tests run them through the Service Bus emulator.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from emulators.fakes.arm import FakeArm
from emulators.fakes.identity import FakeIdentity
from emulators.fakes.storage import FakeBlobStorage
from emulators.fakes.teams import FakeTeams
from functions.shared import composition
from functions.shared.settings import load_settings
from tests.functions.support import (
    App,
    Clock,
    RecordingCommands,
    RecordingPublisher,
    RecordingScheduler,
    base_env,
)


@pytest.fixture
def teams_fake() -> Iterator[FakeTeams]:
    server = FakeTeams()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def arm_fake() -> Iterator[FakeArm]:
    server = FakeArm()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def identity_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIdentity]:
    server = FakeIdentity()
    server.start()
    for name in (
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_SECRET",
        "AZURE_USERNAME",
        "AZURE_FEDERATED_TOKEN_FILE",
        "MSI_ENDPOINT",
        "MSI_SECRET",
        "IMDS_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.environ().items():
        monkeypatch.setenv(name, value)
    yield server
    server.stop()


@pytest.fixture
def storage_fake() -> Iterator[FakeBlobStorage]:
    server = FakeBlobStorage()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_app(
    monkeypatch: pytest.MonkeyPatch,
    teams_fake: FakeTeams,
    arm_fake: FakeArm,
    identity_fake: FakeIdentity,
    storage_fake: FakeBlobStorage,
) -> Iterator[Callable[..., App]]:
    """Import function_app with these extra settings; real adapters talk to the fakes."""

    def make(*, overrides: Mapping[str, Any] | None = None, **extra: str) -> App:
        for name, value in {**base_env(teams_fake, arm_fake, storage_fake), **extra}.items():
            monkeypatch.setenv(name, value)
        commands, publisher, clock = RecordingCommands(), RecordingPublisher(), Clock()
        config = load_settings(dict(os.environ))
        # With DrainMomentsQueueName, lb-pools schedules its drains here (the test's clock).
        scheduler = RecordingScheduler() if config.drain_moments_queue else None
        moments = {"moments": scheduler} if scheduler is not None else {}
        composition.use(
            composition.build(
                config,
                commands=commands,
                publisher=publisher,
                clock=clock,
                **moments,
                **(overrides or {}),
            )
        )
        if "function_app" in sys.modules:
            module = importlib.reload(sys.modules["function_app"])
        else:
            module = importlib.import_module("function_app")
        functions = {f.get_function_name(): f for f in module.app.get_functions()}
        return App(
            functions, commands, publisher, clock, teams_fake, arm_fake, storage_fake, scheduler
        )

    yield make
    composition.use(None)


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    return make_app()
