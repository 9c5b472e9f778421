"""Blob storage, just enough for the heartbeat store: block blobs in containers, in memory.

PUT/GET a blob, PUT ``?restype=container``; requires ``Authorization: Bearer`` and
``x-ms-version``; answers 404 with ``x-ms-error-code`` BlobNotFound / ContainerNotFound.
"""

from __future__ import annotations

from emulators.fakes._server import LoopbackServer, Reply, Request


class FakeBlobStorage(LoopbackServer):
    def __init__(self, containers: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.blobs: dict[str, dict[str, bytes]] = {name: {} for name in containers}

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
        if request.method == "PUT" and blob:
            if request.headers.get("x-ms-blob-type") != "BlockBlob":
                return Reply(400, b"", {"x-ms-error-code": "InvalidHeaderValue"})
            self.blobs[container][blob] = request.body
            return Reply(201, b"")
        if request.method == "GET" and blob:
            if blob not in self.blobs[container]:
                return Reply(404, b"", {"x-ms-error-code": "BlobNotFound"})
            return Reply(200, self.blobs[container][blob])
        return Reply(405, b"")
