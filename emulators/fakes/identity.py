"""Managed-identity token endpoints on loopback, in both of azure-identity's flavours.

- App Service / Functions: azure-identity (through MSAL) uses it when IDENTITY_ENDPOINT and
  IDENTITY_HEADER are set: ``GET {IDENTITY_ENDPOINT}?api-version=2019-08-01&resource=<resource>
  [&client_id=<id>]`` with header ``X-IDENTITY-HEADER: {IDENTITY_HEADER}``; the answer is JSON
  with ``access_token``, ``expires_on`` (Unix seconds), ``resource`` and ``token_type``. Set
  ``environ()`` in the process and ManagedIdentityCredential / DefaultAzureCredential work
  unchanged.
- A VM's: IMDS at ``/metadata/identity/oauth2/token?api-version=2018-02-01&resource=...`` with
  ``Metadata: true``, as on 169.254.169.254; azure-identity asks there (and skips its probe)
  when AZURE_POD_IDENTITY_AUTHORITY_HOST names this server: ``vm_environ()``.

The access token is shaped like Entra ID's, a JWT whose claims say who it is for: ``aud`` the
resource, ``iss`` an Entra issuer, ``iat``/``nbf``/``exp``, ``appid`` the client id asked for,
``oid`` that identity's object id (:meth:`FakeIdentity.object_id`), ``tid``. It is signed with a
key of this process that nobody verifies. The Service Bus emulator's role assignments
(``--rights``) read ``oid``, so a test can give one identity a role and not another; Azurite's
``--oauth basic`` reads exactly these claims (and checks no signature), so the same token works
against the fakes and against Azurite.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid

from emulators.fakes._server import LoopbackServer, Reply, Request

TOKEN_PATH = "/msi/token"  # noqa: S105 - a URL path, not a password
IMDS_TOKEN_PATH = "/metadata/identity/oauth2/token"  # noqa: S105 - a URL path
SYSTEM_ASSIGNED_CLIENT_ID = "00000000-0000-0000-0000-00000000f00d"
_TENANT = "00000000-0000-0000-0000-0000000000aa"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unsigned_jwt(claims: dict[str, object]) -> str:
    """``header.payload.`` with ``alg: none``: a token anyone can make (tests of refusals)."""
    header = {"alg": "none", "typ": "JWT"}
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}."


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

    def _signed(self, claims: dict[str, object]) -> str:
        header = {"alg": "HS256", "typ": "JWT"}
        signing_input = ".".join(
            _b64(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
        )
        signature = hmac.new(self._signing_key, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(signature)}"

    @staticmethod
    def object_id(client_id: str | None = None) -> str:
        """The object id (``oid``) of the identity with this client id (None or "": the
        system-assigned one), the same in every run."""
        name = f"sebridge-fake-identity:{(client_id or SYSTEM_ASSIGNED_CLIENT_ID).lower()}"
        return str(uuid.uuid5(uuid.NAMESPACE_URL, name))

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
        client_id = request.query.get("client_id") or SYSTEM_ASSIGNED_CLIENT_ID
        now = int(time.time())
        oid = self.object_id(client_id)
        token = self._signed(
            {
                "aud": resource,
                "iss": f"https://sts.windows.net/{_TENANT}/",
                "iat": now,
                "nbf": now - 60,
                "exp": now + self.lifetime,
                "appid": client_id,
                "oid": oid,
                "sub": oid,
                "tid": _TENANT,
                "jti": secrets.token_urlsafe(12),
            }
        )
        self.issued[token] = resource
        return Reply(
            200,
            {
                "access_token": token,
                "expires_on": str(now + self.lifetime),
                "expires_in": str(self.lifetime),
                "not_before": str(now),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": client_id,
            },
        )
