"""The App Service / Functions managed-identity endpoint, on loopback.

azure-identity (through MSAL) uses it when IDENTITY_ENDPOINT and IDENTITY_HEADER are set:
``GET {IDENTITY_ENDPOINT}?api-version=2019-08-01&resource=<resource>`` with header
``X-IDENTITY-HEADER: {IDENTITY_HEADER}``; the answer is JSON with ``access_token``,
``expires_on`` (Unix seconds), ``resource`` and ``token_type``. Set ``environ()`` in the
process and ManagedIdentityCredential / DefaultAzureCredential work unchanged.
"""

from __future__ import annotations

import secrets
import time

from emulators.fakes._server import LoopbackServer, Reply, Request

TOKEN_PATH = "/msi/token"  # noqa: S105 - a URL path, not a password


class FakeIdentity(LoopbackServer):
    def __init__(self, lifetime: int = 3600, header: str | None = None) -> None:
        super().__init__()
        self.header = header or secrets.token_hex(16)
        self.lifetime = lifetime
        self.issued: dict[str, str] = {}  # token -> resource

    def environ(self) -> dict[str, str]:
        return {"IDENTITY_ENDPOINT": self.url + TOKEN_PATH, "IDENTITY_HEADER": self.header}

    def handle(self, request: Request) -> Reply:
        if request.method != "GET" or request.path != TOKEN_PATH:
            return Reply(404, {"statusCode": 404, "message": "not found"})
        if request.headers.get("x-identity-header") != self.header:
            return Reply(401, {"statusCode": 401, "message": "X-IDENTITY-HEADER is wrong"})
        resource = request.query.get("resource", "")
        if request.query.get("api-version") != "2019-08-01" or not resource:
            return Reply(400, {"statusCode": 400, "message": "api-version or resource missing"})
        token = "fake-" + secrets.token_urlsafe(24)
        self.issued[token] = resource
        return Reply(
            200,
            {
                "access_token": token,
                "expires_on": str(int(time.time()) + self.lifetime),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": "00000000-0000-0000-0000-00000000f00d",
            },
        )
