"""Per-pool locks and state: one small blob per backend pool, locked with a blob lease.

Two function instances that handle two events at once must not both pass the capacity guard on
the same pool: each reads the pool's health, sees room for one more drain, and together they
drain two. So the decision and the removal run under a lock per pool. The lock is a lease on
the pool's blob in the app's own storage account (``LB_POOL_STATE_URL``, by default the
container ``sebridge-pools`` of the host storage account), taken with the Blob REST API
(Lease Blob, ``PUT ?comp=lease``):

- ``acquire`` with ``x-ms-lease-duration`` 15..60 s: 201 and ``x-ms-lease-id``; 409
  ``LeaseAlreadyPresent`` while another instance holds it, and we wait (backoff with jitter,
  bounded) and then give up with :class:`PoolBusy` so that Service Bus redelivers the message;
- ``renew`` every third of the duration from a background thread while the work goes on (a
  slow ARM write must not let the lease lapse under us); a renewal that fails means another
  instance may have the pool now, and the next :meth:`check` raises before anything else is
  changed;
- a lease is *provably held* only until the moment the Blob service may let it expire: the
  duration counted from when the last successful acquire or renew was sent (the service took it
  no earlier). :meth:`check` raises once less than :attr:`BlobPoolStore.margin` of that is left,
  so a renewal that hangs (the service stalls, the connection does) stops the writes before the
  lease can lapse, not after it failed;
- ``release`` at the end (or the lease expires by itself if the instance dies).

Why a lease and not an ARM etag on the load balancer: a NIC PUT does not take an If-Match of the
load balancer, so an etag cannot tie the decision to the removal; a lease can, and the same blob
holds the pool's held events (functions.lb_pools.held), written with the lease id so that only
the lock holder can change them. Pools are always locked in sorted order (no deadlock between
two events on the same two pools). The blob name is a digest of the pool's id, so no name from
anywhere reaches the URL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import requests

from functions.adapters.arm import TokenCredential
from functions.adapters.heartbeats import STORAGE_API_VERSION, STORAGE_SCOPE
from functions.adapters.retry import RetryPolicy, send
from functions.adapters.sessions import Session
from functions.shared import event_record
from functions.shared.event_record import event_of
from functions.shared.ports import PoolBusy
from sebridge.retry import Backoff

log = logging.getLogger("sebridge.functions.pool_state")

LEASE_SECONDS = 30
ACQUIRE_TIMEOUT = 30.0  # seconds to wait for a pool another instance holds
# A waiting instance asks again within this long: a pool is held for tens to hundreds of ms (one
# decision and one NIC write), so a longer wait would only leave the pool idle.
ACQUIRE_POLL_CAP = 0.2
MAX_STATE_BYTES = 4 * 1024 * 1024
EVENT_WRITE_ATTEMPTS = 5  # reads and conditional writes of one event record


class PoolStoreError(Exception):
    """The storage account answered something we cannot work with (redelivered)."""


class LeaseLost(Exception):
    """A pool's lease could not be renewed: another instance may hold the pool now."""


def blob_name(pool_id: str) -> str:
    return "pool-" + hashlib.sha256(pool_id.lower().encode("utf-8")).hexdigest()[:40] + ".json"


def event_blob_name(event_id: str) -> str:
    """The index entry of a held event: which pools hold it (a digest: no id reaches the URL)."""
    return "event-" + hashlib.sha256(event_id.lower().encode("utf-8")).hexdigest()[:40] + ".json"


class _Lease:
    """The leases on some pools, renewed in the background while held."""

    def __init__(self, store: BlobPoolStore, leases: dict[str, tuple[str, float]]) -> None:
        self._store = store
        self._leases = {pool: lease_id for pool, (lease_id, _) in leases.items()}
        # Until when (monotonic) each lease is provably held: when its last acquire or renewal
        # was sent, plus the duration.
        self._until = {pool: sent + store.lease_seconds for pool, (_, sent) in leases.items()}
        self._until_lock = threading.Lock()
        self._lost: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True, name="pool-lease-renew")

    def start(self) -> None:
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self._store.renew_every):
            for pool_id, lease_id in self._leases.items():
                sent = self._store.monotonic()
                try:
                    self._store.lease_action(pool_id, "renew", lease_id)
                except Exception as exc:  # noqa: BLE001 - the renewer thread must not die
                    log.error("lease on pool %s lost: %s", pool_id, exc)
                    self._lost.append(pool_id)
                    continue
                with self._until_lock:
                    self._until[pool_id] = max(
                        self._until[pool_id], sent + self._store.lease_seconds
                    )

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def check(self) -> None:
        if self._lost:
            raise LeaseLost(f"lost the lease on {sorted(set(self._lost))}")
        now = self._store.monotonic()
        with self._until_lock:
            lapsing = sorted(
                p for p, until in self._until.items() if now > until - self._store.margin
            )
        if lapsing:
            raise LeaseLost(
                f"the lease on {lapsing} can no longer be proven held (no renewal went through "
                f"for {self._store.lease_seconds - self._store.margin:g} s)"
            )

    def allowance(self) -> float:
        """:meth:`check`, then how many seconds every lease is still provably held with the
        margin to spare: a write retried later than that could land after the lease lapsed."""
        self.check()
        now = self._store.monotonic()
        with self._until_lock:
            earliest = min(self._until.values(), default=now)
        return max(0.0, earliest - self._store.margin - now)

    def state(self, pool_id: str) -> Mapping[str, Any]:
        return self._store.peek(pool_id)

    def save(self, pool_id: str, state: Mapping[str, Any]) -> None:
        self.check()
        lease_id = self._leases.get(pool_id.lower())
        if lease_id is None:
            raise PoolStoreError(f"pool {pool_id} is not held")
        self._store.put_state(pool_id, state, lease_id)


class BlobPoolStore:
    def __init__(
        self,
        container_url: str,
        credential: TokenCredential,
        *,
        session: requests.Session | None = None,
        policy: RetryPolicy | None = None,
        lease_seconds: int = LEASE_SECONDS,
        acquire_timeout: float = ACQUIRE_TIMEOUT,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        renew_every: float | None = None,  # default: a third of the lease
    ) -> None:
        if not 15 <= lease_seconds <= 60:
            raise ValueError("a blob lease lasts 15 to 60 seconds")
        self._container = container_url.rstrip("/")
        self._credential = credential
        self._session = session or Session()
        self._policy = policy or RetryPolicy(attempts=3, max_total_wait=10.0, timeout=10.0)
        self.lease_seconds = lease_seconds
        self.renew_every = renew_every or max(1.0, lease_seconds / 3)
        self._acquire_timeout = acquire_timeout
        self._sleep = sleep
        self._monotonic = monotonic
        # How much of a lease must be left for writes to go on (a sixth: 5 s of 30).
        self.margin = lease_seconds / 6
        self._existing: set[str] = set()  # blobs known to exist (created or seen)
        self._known_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"BlobPoolStore({self._container})"

    def _headers(self, **extra: str) -> dict[str, str]:
        token = self._credential.get_token(STORAGE_SCOPE).token
        return {"Authorization": f"Bearer {token}", "x-ms-version": STORAGE_API_VERSION, **extra}

    def _url(self, pool_id: str) -> str:
        return f"{self._container}/{blob_name(pool_id)}"

    def _send(self, method: str, url: str, what: str, **kwargs: Any) -> requests.Response:
        return send(
            self._session,
            method,
            url,
            policy=self._policy,
            what=f"pool state {what}",
            sleep=self._sleep,
            **kwargs,
        )

    # ---- state ---------------------------------------------------------------------------
    def peek(self, pool_id: str) -> Mapping[str, Any]:
        response = self._send("GET", self._url(pool_id), "read", headers=self._headers())
        if response.status_code == 404:
            return {}
        if response.status_code != 200:
            raise PoolStoreError(f"read pool state: HTTP {response.status_code}")
        if len(response.content) > MAX_STATE_BYTES:
            log.error("pool state of %s is too large, treated as empty", pool_id)
            return {}
        try:
            state = json.loads(response.content) if response.content else {}
        except ValueError as exc:
            log.error("unreadable pool state of %s, treated as empty: %s", pool_id, exc)
            return {}
        return state if isinstance(state, dict) else {}

    # ---- the events' records (functions.shared.event_record) -------------------------------
    # One blob per event: the index of held events (written by lb-pools under the leases of the
    # pools it changes, read by an Approve link that names only its event; a hint, checked
    # against the pools' own state) and what each scope last said of the event (written by the
    # gate, read by every early approval). Written under the blob's ETag: lb-pools and the gate
    # write the same record at once, and neither may lose the other's change.
    # A hold is kept per scope (``event_id`` is a scoped key, functions.shared.verified), in
    # the record of its EventId: an Approve link that names only the event finds every scope's.
    def index_held(self, event_id: str, pool_ids: Sequence[str]) -> None:
        self.update_event(
            event_of(event_id),
            lambda record: event_record.with_held_pools(record, event_id, pool_ids),
        )

    def held_pools(self, event_id: str) -> list[str]:
        return event_record.held_pools(self.read_event(event_of(event_id)), event_id)

    def _read_event(self, event_id: str) -> tuple[dict[str, Any], str | None]:
        url = f"{self._container}/{event_blob_name(event_id)}"
        response = self._send("GET", url, "event read", headers=self._headers())
        if response.status_code == 404:
            return {}, None
        if response.status_code != 200:
            raise PoolStoreError(f"read event record: HTTP {response.status_code}")
        etag = response.headers.get("ETag")
        try:
            record = json.loads(response.content) if response.content else {}
        except ValueError:
            log.error("unreadable event record of %s, treated as empty", event_id[:64])
            return {}, etag
        return (record if isinstance(record, dict) else {}), etag

    def read_event(self, event_id: str) -> dict[str, Any]:
        return self._read_event(event_id)[0]

    def update_event(self, event_id: str, change: Callable[[dict[str, Any]], bool]) -> None:
        url = f"{self._container}/{event_blob_name(event_id)}"
        for _ in range(EVENT_WRITE_ATTEMPTS):
            record, etag = self._read_event(event_id)
            if not change(record):
                return
            body = json.dumps(record, separators=(",", ":")).encode()
            condition = {"If-Match": etag} if etag else {"If-None-Match": "*"}
            response = self._send(
                "PUT",
                url,
                "event write",
                data=body,
                headers=self._headers(
                    **{
                        "x-ms-blob-type": "BlockBlob",
                        "Content-Type": "application/json",
                        **condition,
                    }
                ),
            )
            code = response.headers.get("x-ms-error-code", "")
            if response.status_code == 404 and code == "ContainerNotFound":
                self._create_container()
                continue
            if response.status_code in (409, 412):
                continue  # written meanwhile: read it again and change that
            if response.status_code != 201:
                raise PoolStoreError(f"write event record: HTTP {response.status_code} {code}")
            return
        raise PoolStoreError(
            f"write event record: still changing after {EVENT_WRITE_ATTEMPTS} attempts"
        )

    def put_state(self, pool_id: str, state: Mapping[str, Any], lease_id: str) -> None:
        body = json.dumps({**state, "pool": pool_id}, separators=(",", ":")).encode()
        response = self._send(
            "PUT",
            self._url(pool_id),
            "write",
            data=body,
            headers=self._headers(
                **{
                    "x-ms-blob-type": "BlockBlob",
                    "x-ms-lease-id": lease_id,
                    "Content-Type": "application/json",
                }
            ),
        )
        if response.status_code == 412:
            raise LeaseLost(f"pool state write refused ({response.headers.get('x-ms-error-code')})")
        if response.status_code != 201:
            raise PoolStoreError(f"write pool state: HTTP {response.status_code}")

    # ---- leases --------------------------------------------------------------------------
    def lease_action(self, pool_id: str, action: str, lease_id: str) -> requests.Response:
        response = self._send(
            "PUT",
            self._url(pool_id),
            f"lease {action}",
            params={"comp": "lease"},
            headers=self._headers(**{"x-ms-lease-action": action, "x-ms-lease-id": lease_id}),
        )
        if response.status_code != 200:
            code = response.headers.get("x-ms-error-code", "")
            raise PoolStoreError(f"lease {action}: HTTP {response.status_code} {code}")
        return response

    def _ensure_blob(self, pool_id: str) -> None:
        with self._known_lock:
            if pool_id in self._existing:
                return
        for _ in range(2):
            response = self._send(
                "PUT",
                self._url(pool_id),
                "create",
                data=b"{}",
                headers=self._headers(
                    **{"x-ms-blob-type": "BlockBlob", "If-None-Match": "*"},
                ),
            )
            code = response.headers.get("x-ms-error-code", "")
            if response.status_code == 404 and code == "ContainerNotFound":
                self._create_container()
                continue
            # 409 BlobAlreadyExists, or 412 when it exists under a lease: both mean "exists".
            if response.status_code in (201, 409, 412):
                with self._known_lock:
                    self._existing.add(pool_id)
                return
            raise PoolStoreError(f"create pool state: HTTP {response.status_code} {code}")
        raise PoolStoreError("create pool state: the container could not be created")

    def _create_container(self) -> None:
        response = self._send(
            "PUT",
            self._container,
            "create container",
            params={"restype": "container"},
            headers=self._headers(),
        )
        if response.status_code not in (201, 409):
            raise PoolStoreError(f"create container: HTTP {response.status_code}")

    def monotonic(self) -> float:
        return self._monotonic()

    def _acquire(self, pool_id: str) -> tuple[str, float]:
        """(the lease id, when the acquire that got it was sent)."""
        self._ensure_blob(pool_id)
        proposed = str(uuid.uuid4())
        deadline = self._monotonic() + self._acquire_timeout
        backoff = Backoff(0.02, ACQUIRE_POLL_CAP, floor=0.0)
        waited = False
        while True:
            sent = self._monotonic()
            response = self._send(
                "PUT",
                self._url(pool_id),
                "lease acquire",
                params={"comp": "lease"},
                headers=self._headers(
                    **{
                        "x-ms-lease-action": "acquire",
                        "x-ms-lease-duration": str(self.lease_seconds),
                        "x-ms-proposed-lease-id": proposed,
                    }
                ),
            )
            code = response.headers.get("x-ms-error-code", "")
            if response.status_code == 201:
                if waited:
                    log.info("pool %s free again, lease taken", pool_id)
                return response.headers.get("x-ms-lease-id") or proposed, sent
            if response.status_code == 404 and code == "BlobNotFound":
                with self._known_lock:
                    self._existing.discard(pool_id)
                self._ensure_blob(pool_id)
                continue
            if response.status_code != 409 or code != "LeaseAlreadyPresent":
                raise PoolStoreError(f"lease acquire: HTTP {response.status_code} {code}")
            if self._monotonic() >= deadline:
                raise PoolBusy(
                    f"pool {pool_id} stayed locked by another instance for "
                    f"{self._acquire_timeout:g} s"
                )
            if not waited:
                log.info("pool %s is locked by another instance, waiting", pool_id)
                waited = True
            self._sleep(backoff.next_delay())

    @contextmanager
    def hold(self, pool_ids: Sequence[str]) -> Iterator[_Lease]:
        leases: dict[str, tuple[str, float]] = {}
        lease: _Lease | None = None
        try:
            for pool_id in sorted({p.lower() for p in pool_ids}):
                leases[pool_id] = self._acquire(pool_id)
            lease = _Lease(self, leases)
            lease.start()
            yield lease
        finally:
            if lease is not None:
                lease.stop()
            for pool_id, (lease_id, _) in leases.items():
                try:
                    self.lease_action(pool_id, "release", lease_id)
                except Exception as exc:  # noqa: BLE001 - never mask the body's own error
                    # It expires by itself within the lease duration.
                    log.warning("releasing the lease on %s failed: %s", pool_id, exc)
