"""Blob storage, just enough for the heartbeat store and the pool locks: block blobs in
containers, in memory, with leases.

Why it stays beside Azurite (emulators/azurite, which the demo, ``sebridge fakes --azurite`` and
the storage integration tests use): the workflow unit tests and the functions loop need what
Azurite cannot give, every request and every lease call recorded (``requests``, ``lease_log``:
the capacity tests prove that two instances contended for a pool), a clock the tests move
(``clock``: a lease that expires without waiting 15 s), and no node process per test.

PUT/GET a blob, PUT ``?restype=container``; requires ``Authorization: Bearer`` and
``x-ms-version``; answers 404 with ``x-ms-error-code`` BlobNotFound / ContainerNotFound.
``If-None-Match: *`` on a PUT of an existing blob: 409 BlobAlreadyExists. Every blob has an
``ETag`` (in the answers to GET and PUT, new with every write); ``If-Match: <etag>`` on a PUT
of another version, or of a blob that does not exist, fails with 412 ConditionNotMet.

Leases (Lease Blob, ``PUT ?comp=lease``, ``x-ms-lease-action``), as the Blob service does them:

- ``acquire``: ``x-ms-lease-duration`` -1 (infinite) or 15..60, else 400 InvalidHeaderValue;
  optional ``x-ms-proposed-lease-id``; 201 with ``x-ms-lease-id``. While another lease is active:
  409 LeaseAlreadyPresent (acquiring again with the active lease's own id renews it: 201);
- ``renew``: 200; the lease may have expired, as long as nobody took the blob since; another id:
  409 LeaseIdMismatchWithLeaseOperation; no lease, or it was released: 409
  LeaseNotPresentWithLeaseOperation;
- ``release``: 200 (the blob is free at once); the same 409s;
- ``break``: 202, the lease ends at once (break period 0);
- a lease on a blob that does not exist: 404 BlobNotFound.

Writing a leased blob needs the active lease's id in ``x-ms-lease-id``: missing, 412
LeaseIdMissing; another id, 412 LeaseIdMismatchWithBlobOperation; an id on a blob without an
active lease, 412 LeaseNotPresentWithBlobOperation. Reads need no lease. Every lease call is kept
in ``lease_log`` (action, blob, status, error code) for tests.

``hang(action)`` makes lease calls of that action (``renew``, say) wait, outside the lock, until
:meth:`release` (or a bound passes): a Blob service that stalls while the lease runs out.
``clock`` (monotonic seconds) decides when a lease expires; tests may replace it.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from emulators.fakes._server import LoopbackServer, Reply, Request


@dataclass
class Lease:
    lease_id: str
    duration: int  # seconds, -1: infinite
    expires: float | None  # monotonic time; None: infinite
    released: bool = False

    def active(self, now: float) -> bool:
        return not self.released and (self.expires is None or now < self.expires)


@dataclass(frozen=True)
class LeaseCall:
    at: float
    action: str
    blob: str
    status: int
    code: str


def _fail(status: int, code: str) -> Reply:
    return Reply(status, b"", {"x-ms-error-code": code})


class FakeBlobStorage(LoopbackServer):
    def __init__(self, containers: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.blobs: dict[str, dict[str, bytes]] = {name: {} for name in containers}
        self.etags: dict[tuple[str, str], str] = {}
        self._versions = itertools.count(1)
        self.leases: dict[tuple[str, str], Lease] = {}
        self.lease_log: list[LeaseCall] = []
        self.clock: Callable[[], float] = time.monotonic
        self._hang_action: str | None = None
        self._hang_bound = 0.0
        self._released = threading.Event()
        self.hanging = 0  # lease calls waiting in hang() now

    def hang(self, action: str, *, at_most: float = 30.0) -> None:
        """Lease calls of ``action`` wait until :meth:`release` (at most ``at_most`` s each)."""
        self._released.clear()
        self._hang_action, self._hang_bound = action, at_most

    def release(self) -> None:
        self._hang_action = None
        self._released.set()

    def delay(self, request: Request) -> float:
        action = request.headers.get("x-ms-lease-action", "").lower()
        if (
            self._hang_action
            and request.query.get("comp") == "lease"
            and action == self._hang_action
        ):
            with self.lock:
                self.hanging += 1
            try:
                self._released.wait(self._hang_bound)
            finally:
                with self.lock:
                    self.hanging -= 1
        return 0.0

    def container_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    def handle(self, request: Request) -> Reply:
        if not request.headers.get("authorization", "").startswith("Bearer "):
            return Reply(401, b"", {"x-ms-error-code": "NoAuthenticationInformation"})
        if "x-ms-version" not in request.headers:
            return Reply(400, b"", {"x-ms-error-code": "MissingRequiredHeader"})
        container, _, blob = request.path.strip("/").partition("/")
        if request.method == "PUT" and request.query.get("restype") == "container":
            if container in self.blobs:
                return Reply(409, b"", {"x-ms-error-code": "ContainerAlreadyExists"})
            self.blobs[container] = {}
            return Reply(201, b"")
        if container not in self.blobs:
            return Reply(404, b"", {"x-ms-error-code": "ContainerNotFound"})
        if request.method == "PUT" and blob and request.query.get("comp") == "lease":
            reply = self._lease(container, blob, request)
            self.lease_log.append(
                LeaseCall(
                    time.time(),
                    request.headers.get("x-ms-lease-action", ""),
                    blob,
                    reply.status,
                    reply.headers.get("x-ms-error-code", ""),
                )
            )
            return reply
        if request.method == "PUT" and blob:
            if request.headers.get("x-ms-blob-type") != "BlockBlob":
                return Reply(400, b"", {"x-ms-error-code": "InvalidHeaderValue"})
            if request.headers.get("if-none-match") == "*" and blob in self.blobs[container]:
                return _fail(409, "BlobAlreadyExists")
            refused = self._write_refused(container, blob, request)
            if refused is not None:
                return refused
            if_match = request.headers.get("if-match")
            current = self.etags.get((container, blob)) if blob in self.blobs[container] else None
            if if_match and (current is None or (if_match != "*" and if_match != current)):
                return _fail(412, "ConditionNotMet")
            self.blobs[container][blob] = request.body
            etag = f'"0x{next(self._versions):016X}"'
            self.etags[(container, blob)] = etag
            return Reply(201, b"", {"ETag": etag})
        if request.method == "GET" and blob:
            if blob not in self.blobs[container]:
                return Reply(404, b"", {"x-ms-error-code": "BlobNotFound"})
            etag = self.etags.get((container, blob), '"0x0"')
            return Reply(200, self.blobs[container][blob], {"ETag": etag})
        return Reply(405, b"")

    def _write_refused(self, container: str, blob: str, request: Request) -> Reply | None:
        lease = self.leases.get((container, blob))
        given = request.headers.get("x-ms-lease-id")
        active = lease is not None and lease.active(self.clock())
        if active:
            assert lease is not None
            if not given:
                return _fail(412, "LeaseIdMissing")
            if given != lease.lease_id:
                return _fail(412, "LeaseIdMismatchWithBlobOperation")
        elif given:
            return _fail(412, "LeaseNotPresentWithBlobOperation")
        return None

    def _lease(self, container: str, blob: str, request: Request) -> Reply:
        if blob not in self.blobs[container]:
            return _fail(404, "BlobNotFound")
        action = request.headers.get("x-ms-lease-action", "").lower()
        key, now = (container, blob), self.clock()
        lease = self.leases.get(key)
        active = lease is not None and lease.active(now)
        given = request.headers.get("x-ms-lease-id")
        if action == "acquire":
            try:
                duration = int(request.headers.get("x-ms-lease-duration", ""))
            except ValueError:
                return _fail(400, "InvalidHeaderValue")
            if duration != -1 and not 15 <= duration <= 60:
                return _fail(400, "InvalidHeaderValue")
            proposed = request.headers.get("x-ms-proposed-lease-id") or str(uuid.uuid4())
            if active and lease is not None and lease.lease_id != proposed:
                return _fail(409, "LeaseAlreadyPresent")
            expires = None if duration == -1 else now + duration
            self.leases[key] = Lease(proposed, duration, expires)
            return Reply(201, b"", {"x-ms-lease-id": proposed})
        if action in ("renew", "release"):
            if not given:
                return _fail(400, "MissingRequiredHeader")
            if lease is None or lease.released:
                return _fail(409, "LeaseNotPresentWithLeaseOperation")
            if lease.lease_id != given:
                return _fail(409, "LeaseIdMismatchWithLeaseOperation")
            if action == "release":
                lease.released = True
                return Reply(200, b"")
            # A renewal restarts the duration the lease was acquired with.
            lease.expires = None if lease.duration == -1 else now + lease.duration
            return Reply(200, b"", {"x-ms-lease-id": lease.lease_id})
        if action == "break":
            if lease is None or lease.released:
                return _fail(409, "LeaseNotPresentWithLeaseOperation")
            lease.released = True
            return Reply(202, b"", {"x-ms-lease-time": "0"})
        return _fail(400, "InvalidHeaderValue")
