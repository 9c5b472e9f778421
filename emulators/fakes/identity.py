"""Managed-identity token endpoints on loopback, in both of azure-identity's flavours.

- App Service / Functions: azure-identity (through MSAL) uses it when IDENTITY_ENDPOINT and
  IDENTITY_HEADER are set: ``GET {IDENTITY_ENDPOINT}?api-version=2019-08-01&resource=<resource>``
  with header ``X-IDENTITY-HEADER: {IDENTITY_HEADER}``; the answer is JSON with
  ``access_token``, ``expires_on`` (Unix seconds), ``resource`` and ``token_type``. Set
  ``environ()`` in the process and ManagedIdentityCredential / DefaultAzureCredential work
  unchanged.
- A VM's: IMDS at ``/metadata/identity/oauth2/token?api-version=2018-02-01&resource=...`` with
  ``Metadata: true``, as on 169.254.169.254; azure-identity asks there (and skips its probe)
  when AZURE_POD_IDENTITY_AUTHORITY_HOST names this server: ``vm_environ()``.

Tokens are shaped like Entra ID's (``header.payload.signature``, base64url JSON claims with the
audience, issue and expiry times), so a peer that takes JWTs, as Service Bus does and the
Service Bus emulator checks, takes them; nothing can verify the signature, which is random.
"""

from __future__ import annotations

import base64
import json
import secrets
import time

from emulators.fakes._server import LoopbackServer, Reply, Request

TOKEN_PATH = "/msi/token"  # noqa: S105 - a URL path, not a password
IMDS_TOKEN_PATH = "/metadata/identity/oauth2/token"  # noqa: S105 - a URL path
CLIENT_ID = "00000000-0000-0000-0000-00000000f00d"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def jwt_shaped(resource: str, issued_at: int, expires_on: int) -> str:
    """An unsigned-in-effect JWT: Entra ID's shape, a random signature."""
    header = {"typ": "JWT", "alg": "RS256", "kid": "sebridge-fake"}
    claims = {
        "aud": resource,
        "iss": "https://sts.windows.net/00000000-0000-0000-0000-000000000000/",
        "iat": issued_at,
        "nbf": issued_at,
        "exp": expires_on,
        "appid": CLIENT_ID,
        "oid": "00000000-0000-0000-0000-0000000000a1",
        "jti": secrets.token_hex(8),
    }
    parts = [json.dumps(part, separators=(",", ":")).encode() for part in (header, claims)]
    return ".".join([_b64(parts[0]), _b64(parts[1]), _b64(secrets.token_bytes(32))])


class FakeIdentity(LoopbackServer):
    def __init__(self, lifetime: int = 3600, header: str | None = None) -> None:
        super().__init__()
        self.header = header or secrets.token_hex(16)
        self.lifetime = lifetime
        self.issued: dict[str, str] = {}  # token -> resource

    def environ(self) -> dict[str, str]:
        """The App Service flavour's settings."""
        return {"IDENTITY_ENDPOINT": self.url + TOKEN_PATH, "IDENTITY_HEADER": self.header}

    def vm_environ(self) -> dict[str, str]:
        """A VM's: azure-identity asks "IMDS" here instead of 169.254.169.254."""
        return {"AZURE_POD_IDENTITY_AUTHORITY_HOST": self.url}

    def issued_token(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header carries a token this fake issued."""
        return authorization.removeprefix("Bearer ") in self.issued

    def handle(self, request: Request) -> Reply:
        if request.method == "GET" and request.path == TOKEN_PATH:
            if request.headers.get("x-identity-header") != self.header:
                return Reply(401, {"statusCode": 401, "message": "X-IDENTITY-HEADER is wrong"})
            if request.query.get("api-version") != "2019-08-01":
                return Reply(400, {"statusCode": 400, "message": "api-version missing"})
        elif request.method == "GET" and request.path == IMDS_TOKEN_PATH:
            if request.headers.get("metadata", "").lower() != "true":
                return Reply(400, {"error": "invalid_request", "error_description": "Metadata"})
            if request.query.get("api-version") != "2018-02-01":
                return Reply(400, {"error": "invalid_request", "error_description": "api-version"})
        else:
            return Reply(404, {"statusCode": 404, "message": "not found"})
        resource = request.query.get("resource", "")
        if not resource:
            return Reply(400, {"statusCode": 400, "message": "resource missing"})
        now = int(time.time())
        expires_on = now + self.lifetime
        token = jwt_shaped(resource, now, expires_on)
        self.issued[token] = resource
        return Reply(
            200,
            {
                "access_token": token,
                "expires_on": str(expires_on),
                "expires_in": str(self.lifetime),
                "not_before": str(now),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": CLIENT_ID,
            },
        )
