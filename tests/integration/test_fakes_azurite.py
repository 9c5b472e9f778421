"""`sebridge fakes --azurite`: the settings it prints point at a running Azurite that takes the
printed identity's tokens and trusts the printed certificate (a local run by hand)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import certifi
import pytest
from azure.identity import ManagedIdentityCredential

from emulators.functions_host.settings import _PEM, merge_settings
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


@pytest.mark.timeout(120)
def test_the_printed_settings_work_whatever_bundle_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Attack 26a, break 11: with REQUESTS_CA_BUNDLE already set (a corporate bundle, here
    certifi's), the host skipped the printed one and every history endpoint answered 500
    CERTIFICATE_VERIFY_FAILED. The printed bundle now holds the environment's too, so the host
    takes it for that one key."""
    corporate = tmp_path / "corporate.pem"
    corporate.write_text(Path(certifi.where()).read_text(encoding="utf-8"), encoding="utf-8")
    env = {**os.environ, "REQUESTS_CA_BUNDLE": str(corporate)}
    with ChildProcess("fakes", ["--azurite", "--seconds", "90"], env=env) as fakes:
        fakes.wait_for_line("}", timeout=60)
        settings = json.loads("\n".join(line.text for line in fakes.lines))
        merged = merge_settings(settings, {"REQUESTS_CA_BUNDLE": str(corporate)})
        assert merged.values["REQUESTS_CA_BUNDLE"] == settings["REQUESTS_CA_BUNDLE"]
        assert "REQUESTS_CA_BUNDLE" not in merged.shadowed
        for name in ("IDENTITY_ENDPOINT", "IDENTITY_HEADER", "REQUESTS_CA_BUNDLE"):
            monkeypatch.setenv(name, merged.values[name])
        for name in ("AZURE_CLIENT_ID", "MSI_ENDPOINT", "MSI_SECRET"):
            monkeypatch.delenv(name, raising=False)
        history = TableHistoryStore(settings["HISTORY_TABLE_URL"], ManagedIdentityCredential())
        assert history.latest(EventQuery()).summaries == []


def test_a_bundle_that_drops_trust_does_not_win(tmp_path: Path) -> None:
    """Only a bundle that holds every certificate of the environment's replaces it."""
    blocks = _PEM.findall(Path(certifi.where()).read_text(encoding="utf-8"))
    smaller, larger = tmp_path / "smaller.pem", tmp_path / "larger.pem"
    smaller.write_text("\n".join(blocks[:3]), encoding="utf-8")
    larger.write_text("\n".join(blocks[:5]), encoding="utf-8")
    kept = merge_settings({"REQUESTS_CA_BUNDLE": str(smaller)}, {"REQUESTS_CA_BUNDLE": str(larger)})
    assert kept.values["REQUESTS_CA_BUNDLE"] == str(larger)
    assert kept.shadowed == ("REQUESTS_CA_BUNDLE",)
    taken = merge_settings(
        {"REQUESTS_CA_BUNDLE": str(larger)}, {"REQUESTS_CA_BUNDLE": str(smaller)}
    )
    assert taken.values["REQUESTS_CA_BUNDLE"] == str(larger)
    missing = merge_settings({"REQUESTS_CA_BUNDLE": str(larger)}, {"REQUESTS_CA_BUNDLE": "/nope"})
    assert missing.values["REQUESTS_CA_BUNDLE"] == "/nope"  # unreadable: Core Tools' rule
