"""Blob storage with ETags and conditional writes, in memory: for the Event Grid ingestion's
per-event records (and anything the plain blob fake serves: it is a superset of it).

Why it stays beside Azurite (emulators/azurite, which the demo and the storage integration tests
use, ETags included): the ingestion's tests need what Azurite cannot give, faults on demand
(``fail``: 503, 429 with Retry-After) and every request recorded (the end-to-end test reads the
envelopes each write held as pending, to prove which source published them).

What the Blob REST API does and the ingestion relies on:
- ``PUT /<container>?restype=container``: 201, or 409 ContainerAlreadyExists;
- ``PUT /<container>/<blob>`` (``x-ms-blob-type: BlockBlob``): 201 with a new ``ETag`` and
  ``Last-Modified``; ``If-Match: <etag>`` (or ``*``) fails with 412 ConditionNotMet when the blob
  is another version or missing, ``If-None-Match: *`` with 409 BlobAlreadyExists when it exists;
- ``GET``: 200 with ``ETag``; ``DELETE``: 202; 404 BlobNotFound / ContainerNotFound;
- ``Authorization: Bearer`` and ``x-ms-version`` required (401 / 400 otherwise).
Every request is handled under the server's lock, so conditional writes are atomic as in Azure.
``fail(status, times)`` answers the next requests with that status (e.g. 503 or 429 with
``Retry-After``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from email.utils import formatdate

from emulators.fakes._server import LoopbackServer, Reply, Request


@dataclass
class _Fault:
    status: int
    times: int
    method: str | None
    retry_after: str | None


class FakeConditionalBlobStorage(LoopbackServer):
    def __init__(self, containers: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.blobs: dict[str, dict[str, tuple[bytes, str]]] = {name: {} for name in containers}
        self._versions = itertools.count(1)
        self._faults: list[_Fault] = []

    def container_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    def fail(
        self, status: int, *, times: int = 1, method: str | None = None, retry_after: str = ""
    ) -> None:
        with self.lock:
            self._faults.append(_Fault(status, times, method, retry_after or None))

    def read(self, container: str, blob: str) -> bytes | None:
        with self.lock:
            stored = self.blobs.get(container, {}).get(blob)
            return None if stored is None else stored[0]

    def _etag(self) -> str:
        return f'"0x8DC{next(self._versions):013X}"'

    def handle(self, request: Request) -> Reply:
        if not request.headers.get("authorization", "").startswith("Bearer "):
            return Reply(401, b"", {"x-ms-error-code": "NoAuthenticationInformation"})
        if "x-ms-version" not in request.headers:
            return Reply(400, b"", {"x-ms-error-code": "MissingRequiredHeader"})
        for fault in self._faults:
            if fault.times > 0 and fault.method in (None, request.method):
                fault.times -= 1
                headers = {"x-ms-error-code": "ServerBusy" if fault.status == 503 else "Injected"}
                if fault.retry_after:
                    headers["Retry-After"] = fault.retry_after
                return Reply(fault.status, b"", headers)
        container, _, blob = request.path.strip("/").partition("/")
        if request.method == "PUT" and request.query.get("restype") == "container":
            if container in self.blobs:
                return Reply(409, b"", {"x-ms-error-code": "ContainerAlreadyExists"})
            self.blobs[container] = {}
            return Reply(201, b"")
        if container not in self.blobs:
            return Reply(404, b"", {"x-ms-error-code": "ContainerNotFound"})
        blobs = self.blobs[container]
        current = blobs.get(blob) if blob else None
        if request.method == "PUT" and blob:
            if request.headers.get("x-ms-blob-type") != "BlockBlob":
                return Reply(400, b"", {"x-ms-error-code": "InvalidHeaderValue"})
            if_match = request.headers.get("if-match")
            if_none_match = request.headers.get("if-none-match")
            if if_none_match == "*" and current is not None:
                return Reply(409, b"", {"x-ms-error-code": "BlobAlreadyExists"})
            if if_match is not None and (
                current is None or (if_match != "*" and if_match != current[1])
            ):
                return Reply(412, b"", {"x-ms-error-code": "ConditionNotMet"})
            etag = self._etag()
            blobs[blob] = (request.body, etag)
            return Reply(201, b"", {"ETag": etag, "Last-Modified": formatdate(usegmt=True)})
        if request.method == "GET" and blob:
            if current is None:
                return Reply(404, b"", {"x-ms-error-code": "BlobNotFound"})
            return Reply(200, current[0], {"ETag": current[1]})
        if request.method == "DELETE" and blob:
            if current is None:
                return Reply(404, b"", {"x-ms-error-code": "BlobNotFound"})
            del blobs[blob]
            return Reply(202, b"")
        return Reply(405, b"")
