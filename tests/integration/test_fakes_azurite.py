"""`sebridge fakes --azurite`: the settings it prints point at a running Azurite that takes the
printed identity's tokens and trusts the printed certificate (a local run by hand)."""

from __future__ import annotations

import json

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.processes import ChildProcess
from functions.adapters.history_table import TableHistoryStore
from functions.adapters.pool_state import BlobPoolStore
from functions.history.core import EventQuery


@pytest.mark.timeout(120)
def test_the_printed_settings_reach_azurite(monkeypatch: pytest.MonkeyPatch) -> None:
    with ChildProcess("fakes", ["--azurite", "--seconds", "90"]) as fakes:
        fakes.wait_for_line("}", timeout=60)
        settings = json.loads("\n".join(line.text for line in fakes.lines))
        assert settings["HistorySubscriptionName"] == "history"
        assert settings["HISTORY_TABLE_URL"].startswith("https://127.0.0.1:")
        for name in ("IDENTITY_ENDPOINT", "IDENTITY_HEADER", "REQUESTS_CA_BUNDLE"):
            monkeypatch.setenv(name, settings[name])
        for name in ("AZURE_CLIENT_ID", "MSI_ENDPOINT", "MSI_SECRET"):
            monkeypatch.delenv(name, raising=False)
        credential = ManagedIdentityCredential()
        history = TableHistoryStore(settings["HISTORY_TABLE_URL"], credential)
        assert history.latest(EventQuery()).summaries == []  # the table does not exist yet: nothing
        pools = BlobPoolStore(settings["LB_POOL_STATE_URL"], credential)
        with pools.hold(["pool-a"]) as lease:
            lease.save("pool-a", {"held": {}})
        assert pools.peek("pool-a")["held"] == {}
