"""The App Service / Functions managed-identity endpoint, on loopback.

azure-identity (through MSAL) uses it when IDENTITY_ENDPOINT and IDENTITY_HEADER are set:
``GET {IDENTITY_ENDPOINT}?api-version=2019-08-01&resource=<resource>`` with header
``X-IDENTITY-HEADER: {IDENTITY_HEADER}``; the answer is JSON with ``access_token``,
``expires_on`` (Unix seconds), ``resource`` and ``token_type``. Set ``environ()`` in the
process and ManagedIdentityCredential / DefaultAzureCredential work unchanged.

Tokens are JWT-shaped, as Entra's are: ``aud`` the resource, ``iss`` an Entra issuer
(``https://sts.windows.net/<tenant>/``), ``iat``/``nbf``/``exp``, ``oid``/``tid``/``appid``, signed
with a key of this process that nobody verifies. Azurite's ``--oauth basic`` reads exactly those
claims (and checks no signature), so the same token works against the fakes and against Azurite.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time

from emulators.fakes._server import LoopbackServer, Reply, Request

TOKEN_PATH = "/msi/token"  # noqa: S105 - a URL path, not a password
TENANT_ID = "00000000-0000-4000-8000-00000000fa4e"
CLIENT_ID = "00000000-0000-0000-0000-00000000f00d"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def jwt_claims(token: str) -> dict[str, object]:
    """The claims of a token this fake issued (tests)."""
    payload = token.split(".")[1]
    claims: dict[str, object] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


class FakeIdentity(LoopbackServer):
    def __init__(self, lifetime: int = 3600, header: str | None = None) -> None:
        super().__init__()
        self.header = header or secrets.token_hex(16)
        self.lifetime = lifetime
        self.issued: dict[str, str] = {}  # token -> resource
        self._signing_key = secrets.token_bytes(32)

    def _token(self, resource: str, now: int) -> str:
        header = {"alg": "HS256", "typ": "JWT"}
        claims = {
            "aud": resource,
            "iss": f"https://sts.windows.net/{TENANT_ID}/",
            "iat": now,
            "nbf": now - 60,
            "exp": now + self.lifetime,
            "oid": "00000000-0000-0000-0000-0000000000a1",
            "sub": "00000000-0000-0000-0000-0000000000a1",
            "tid": TENANT_ID,
            "appid": CLIENT_ID,
            "jti": secrets.token_hex(8),
        }
        signing_input = ".".join(
            _b64(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        signature = hmac.new(self._signing_key, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(signature)}"

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
        now = int(time.time())
        token = self._token(resource, now)
        self.issued[token] = resource
        return Reply(
            200,
            {
                "access_token": token,
                "expires_on": str(now + self.lifetime),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": CLIENT_ID,
            },
        )
