"""The app's blob adapters against Azurite (Microsoft's storage emulator) instead of the
hand-written fakes: leases (the capacity guard's pool locks) and ETags (agentless ingestion's
records), with Entra bearer tokens over HTTPS, as in Azure."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from azure.identity import ManagedIdentityCredential

from emulators.azurite import Azurite
from emulators.fakes.identity import FakeIdentity
from functions.adapters.event_state import BlobEventStateStore
from functions.adapters.pool_state import BlobPoolStore, LeaseLost
from functions.eventgrid_ingest.core import StateConflict
from functions.shared.ports import PoolBusy
from tests.support.storage import azurite_storage, storage_credential, unique

__all__ = ["azurite_storage", "storage_credential"]
pytestmark = pytest.mark.timeout(120)
POOL = (
    "/subscriptions/x/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/"
    "backendAddressPools/p"
)


def test_azurite_takes_only_a_storage_token(
    azurite_storage: tuple[Azurite, FakeIdentity], storage_credential: ManagedIdentityCredential
) -> None:
    storage, _ = azurite_storage
    url = storage.container_url(unique("c")) + "?restype=container"
    headers = {"x-ms-version": "2023-11-03"}
    assert requests.put(url, headers=headers, timeout=10).status_code in (401, 403)
    arm_token = storage_credential.get_token("https://management.azure.com/.default").token
    wrong = requests.put(
        url, headers={**headers, "Authorization": f"Bearer {arm_token}"}, timeout=10
    )
    assert wrong.status_code in (401, 403)
    token = storage_credential.get_token("https://storage.azure.com/.default").token
    right = requests.put(url, headers={**headers, "Authorization": f"Bearer {token}"}, timeout=10)
    assert right.status_code == 201


def test_a_pool_lease_is_exclusive(
    storage_credential: ManagedIdentityCredential, azurite_storage: tuple[Azurite, FakeIdentity]
) -> None:
    storage, _ = azurite_storage
    container = storage.container_url(unique("pools"))
    first = BlobPoolStore(container, storage_credential)
    second = BlobPoolStore(container, storage_credential, acquire_timeout=1.0)
    with first.hold([POOL]) as lease:
        lease.save(POOL, {"held": {"e1": 1}})
        with pytest.raises(PoolBusy):
            with second.hold([POOL]):
                pass
        with pytest.raises(LeaseLost):  # a write with another lease id is refused
            second.put_state(POOL, {"held": {}}, "00000000-0000-4000-8000-000000000000")
    with second.hold([POOL]) as lease:  # released: the other instance gets it at once
        assert lease.state(POOL)["held"] == {"e1": 1}


def test_event_records_are_written_under_their_etag(
    storage_credential: ManagedIdentityCredential, azurite_storage: tuple[Azurite, FakeIdentity]
) -> None:
    storage, _ = azurite_storage
    store = BlobEventStateStore(storage.container_url(unique("records")), storage_credential)
    assert store.read("e1") == (None, None)
    etag = store.write("e1", {"v": 1}, None)  # creates the container on the way
    with pytest.raises(StateConflict):
        store.write("e1", {"v": 2}, None)  # someone else created it first
    newer = store.write("e1", {"v": 3}, etag)
    with pytest.raises(StateConflict):
        store.write("e1", {"v": 4}, etag)  # a stale ETag loses
    assert store.read("e1") == ({"v": 3}, newer)


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it holds no port)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.timeout(90)
def test_azurite_dies_with_the_process_that_started_it() -> None:
    """Attack 26a, break 12: Azurite ran in its own session, so a parent killed with SIGKILL
    left node running with all three ports. The kernel now ends it with its parent."""
    script = (
        "import sys, time\n"
        "from emulators.azurite import Azurite\n"
        "storage = Azurite(oauth=False).start()\n"
        "print(storage._process.pid, flush=True)\n"
        "time.sleep(80)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        node = int(parent.stdout.readline())
        assert not _gone(node)
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 30
        while not _gone(node) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(node), "Azurite outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
