"""The per-event record in blob storage: ETags, races between instances, storage faults.

The production adapter (requests + azure-identity's managed identity) against the loopback
blob fake with conditional writes; the ingestor on top for the races.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from emulators.fakes.identity import FakeIdentity, jwt_claims
from functions.adapters.event_state import BlobEventStateStore, EventStateError
from functions.adapters.retry import RetryPolicy, TransientHttpError
from functions.eventgrid_ingest.core import Ingestor, StateConflict
from sebridge.lifecycle import event_ref
from tests.eventgrid.conftest import STATE_CONTAINER
from tests.eventgrid.support import EVENT_ID, FixedClock, Publisher, note

REF = event_ref(EVENT_ID)
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(
    state_storage: FakeConditionalBlobStorage, identity_fake: FakeIdentity
) -> Iterator[BlobEventStateStore]:
    adapter = BlobEventStateStore(
        state_storage.container_url(STATE_CONTAINER),
        ManagedIdentityCredential(),
        policy=RetryPolicy(attempts=3, max_total_wait=2.0, base_delay=0.05, max_delay=0.2),
    )
    yield adapter


def test_create_read_update_with_etags(
    store: BlobEventStateStore,
    state_storage: FakeConditionalBlobStorage,
    identity_fake: FakeIdentity,
) -> None:
    assert store.read("abc") == (None, None)  # no container yet: nothing stored
    first = store.write("abc", {"n": 1}, None)  # creates the container on the way
    assert store.read("abc") == ({"n": 1}, first)
    second = store.write("abc", {"n": 2}, first)
    assert second != first and store.read("abc") == ({"n": 2}, second)
    with pytest.raises(StateConflict):
        store.write("abc", {"n": 3}, first)  # stale ETag: 412
    with pytest.raises(StateConflict):
        store.write("abc", {"n": 3}, None)  # already exists: 409
    puts = [r for r in state_storage.requests if r.method == "PUT" and "restype" not in r.query]
    assert [r.headers.get("if-none-match") or r.headers.get("if-match") for r in puts] == [
        "*",
        "*",
        first,
        first,
        "*",
    ]
    tokens = {r.headers["authorization"].removeprefix("Bearer ") for r in puts}
    assert tokens and tokens <= set(identity_fake.issued)
    assert all(
        jwt_claims(r.headers["authorization"].removeprefix("Bearer "))["aud"]
        == "https://storage.azure.com"
        for r in puts
    )


def test_transient_storage_faults_are_retried(
    store: BlobEventStateStore, state_storage: FakeConditionalBlobStorage
) -> None:
    state_storage.fail(503, times=2)
    etag = store.write("abc", {"n": 1}, None)
    state_storage.fail(429, times=1, retry_after="0")
    assert store.read("abc") == ({"n": 1}, etag)


def test_a_lasting_fault_raises_for_a_redelivery(
    store: BlobEventStateStore, state_storage: FakeConditionalBlobStorage
) -> None:
    state_storage.fail(500, times=3)  # every attempt the policy allows
    with pytest.raises(TransientHttpError, match="HTTP 500 after 3"):
        store.read("abc")
    state_storage.fail(403, times=1)
    with pytest.raises(EventStateError, match="403"):
        store.read("abc")


def test_a_record_that_is_not_json_is_overwritten(
    store: BlobEventStateStore, state_storage: FakeConditionalBlobStorage
) -> None:
    etag = store.write("abc", {"n": 1}, None)
    state_storage.blobs[STATE_CONTAINER]["abc.json"] = (b"\xff{", etag)
    document, seen = store.read("abc")
    assert document is None and seen == etag
    store.write("abc", {"n": 2}, seen)
    assert store.read("abc")[0] == {"n": 2}


class PausingStore:
    """The real store, with every ingestor's read held at a barrier until both have read: the
    interleaving two instances of the app produce when one event's notifications arrive
    together."""

    def __init__(self, inner: BlobEventStateStore, parties: int) -> None:
        self.inner = inner
        self.barrier = threading.Barrier(parties, timeout=10)
        self.first_round = True

    def read(self, key: str) -> tuple[Any, str | None]:
        result = self.inner.read(key)
        if self.first_round:
            with contextlib.suppress(threading.BrokenBarrierError):
                self.barrier.wait()
        return result

    def write(self, key: str, document: Any, etag: str | None) -> str:
        self.first_round = False
        return self.inner.write(key, document, etag)


@pytest.mark.parametrize(
    "statuses",
    [("Scheduled", "Scheduled"), ("Scheduled", "Started"), ("Started", "Completed")],
    ids=["same notification twice", "scheduled-vs-started", "started-vs-completed"],
)
def test_two_instances_at_once_never_both_publish_from_one_state(
    store: BlobEventStateStore, statuses: tuple[str, str]
) -> None:
    publisher = Publisher()
    shared = PausingStore(store, parties=2)
    notes = [note(status, i * 10) for i, status in enumerate(statuses)]
    outcomes: list[Any] = [None, None]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            ingestor = Ingestor(shared, publisher, FixedClock())  # type: ignore[arg-type]
            outcomes[i] = ingestor.handle(notes[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    # A pending envelope may go out twice under one id (its writer and a reader of the record
    # both publish it); duplicate detection collapses those. Distinct ids must tell one story.
    ids = list(dict.fromkeys(publisher.ids))
    # Whatever the order the race resolved in, the record ends where the later notification
    # leads, and what was published is a prefix-consistent history of it.
    final, _ = store.read(REF)
    assert final is not None and final["pending"] == []
    if statuses == ("Scheduled", "Scheduled"):
        assert ids == [f"{REF}:Scheduled:1"]
    elif statuses == ("Scheduled", "Started"):
        assert ids in (
            [f"{REF}:Scheduled:1", f"{REF}:Started:1"],
            [f"{REF}:Started:1"],  # Started won: the older Scheduled is then stale
        )
    else:
        assert ids in (
            [f"{REF}:Started:1", f"{REF}:Completed:1"],
            [f"{REF}:Completed:1"],
        )
    assert final["status"] == statuses[1]


def test_many_concurrent_redeliveries_publish_one_transition(store: BlobEventStateStore) -> None:
    """Eight instances get the same notification at once: one decides, the others find it
    taken. Some may publish the pending envelope again while its writer is publishing it: the
    same message id, which the topic's duplicate detection collapses (the end-to-end tests
    count what arrives)."""
    publisher = Publisher()
    n = note("Scheduled", 0)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            Ingestor(store, publisher, FixedClock()).handle(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert set(publisher.ids) == {f"{REF}:Scheduled:1"}
    final, _ = store.read(REF)
    assert final is not None and final["pending"] == []
