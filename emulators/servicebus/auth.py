"""Check the tokens a client puts on ``$cbs``, and what each may do (pure: no I/O).

SAS tokens (``SharedAccessSignature sr=...&sig=...&se=...&skn=...``) are verified against the
configured key name and key, like Microsoft's emulator (RootManageSharedAccessKey /
SAS_KEY_VALUE), and may do everything (the root key). JWTs are accepted without a signature
check: there is no Entra ID here to issue or verify them.

What a JWT may do is what :class:`Rights` says, when the emulator is given role assignments
(``--rights FILE``): like Azure RBAC on a namespace with local auth off, the token's ``oid``
claim (the principal) gets the claims of the data roles assigned to it at a scope covering the
entity (Data Sender: Send; Data Receiver: Listen; Data Owner: Send, Listen, Manage). Without
role assignments every JWT may do everything, as before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote_plus

SAS_TOKEN_TYPE = "servicebus.windows.net:sastoken"  # noqa: S105 - a type name, not a secret
JWT_TOKEN_TYPE = "jwt"  # noqa: S105 - a type name, not a secret


@dataclass(frozen=True)
class TokenVerdict:
    ok: bool
    status: int
    description: str


@dataclass(frozen=True)
class SasPolicy:
    key_name: str
    key: str


def check_token(
    token_type: str, token: str, audience: str, policy: SasPolicy | None, now: float
) -> TokenVerdict:
    """Whether a put-token request is accepted (202) or refused (401 / 400).

    The SDK's pure-Python transport puts SAS tokens with type ``jwt`` too, and Service Bus
    accepts that, so the token's form decides, not the declared type.
    """
    if token.startswith("SharedAccessSignature "):
        return _check_sas(token, policy, now)
    if token_type in (JWT_TOKEN_TYPE, SAS_TOKEN_TYPE):
        if not token or token.count(".") != 2:
            return TokenVerdict(False, 401, "malformed JWT: expected header.payload.signature")
        return TokenVerdict(True, 202, "Accepted (JWT signature not checked by the emulator)")
    return TokenVerdict(False, 400, f"unsupported token type {token_type!r}")


def _check_sas(token: str, policy: SasPolicy | None, now: float) -> TokenVerdict:
    prefix = "SharedAccessSignature "
    if not token.startswith(prefix):
        return TokenVerdict(False, 401, "SAS token must start with 'SharedAccessSignature '")
    fields = {k: v[0] for k, v in parse_qs(token[len(prefix) :], keep_blank_values=True).items()}
    missing = [k for k in ("sr", "sig", "se") if k not in fields]
    if missing:
        return TokenVerdict(False, 401, f"SAS token lacks {missing}")
    try:
        expiry = int(fields["se"])
    except ValueError:
        return TokenVerdict(False, 401, "SAS token expiry 'se' is not an integer")
    if expiry <= now:
        return TokenVerdict(False, 401, "SAS token has expired")
    if policy is None:
        return TokenVerdict(True, 202, "Accepted (no key configured)")
    if fields.get("skn") != policy.key_name:
        return TokenVerdict(False, 401, "unknown SAS key name")
    signed = f"{quote_plus(fields['sr'])}\n{expiry}".encode()
    expected = base64.b64encode(hmac.new(policy.key.encode(), signed, hashlib.sha256).digest())
    if not hmac.compare_digest(expected, fields["sig"].encode()):
        return TokenVerdict(False, 401, "InvalidSignature: the token has an invalid signature")
    return TokenVerdict(True, 202, "Accepted")


def check_plain(username: str, password: str, policy: SasPolicy | None) -> bool:
    """SASL PLAIN: the key name and key as user name and password."""
    if policy is None:
        return True
    # compare bytes: compare_digest refuses str holding anything but ASCII
    name_ok = hmac.compare_digest(username.encode(), policy.key_name.encode())
    return hmac.compare_digest(password.encode(), policy.key.encode()) and name_ok


# The built-in data roles of Service Bus and the claims each grants.
ROLE_CLAIMS: Mapping[str, frozenset[str]] = {
    "Azure Service Bus Data Sender": frozenset({"Send"}),
    "Azure Service Bus Data Receiver": frozenset({"Listen"}),
    "Azure Service Bus Data Owner": frozenset({"Send", "Listen", "Manage"}),
}


def jwt_claims(token: str) -> dict[str, Any] | None:
    """The payload of a JWT (``header.payload.signature``), unverified; None if it is not one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError, RecursionError):
        return None
    return claims if isinstance(claims, dict) else None


def _segments(path: str) -> tuple[str, ...]:
    """An entity path as lower-case segments, without a ``$management`` node."""
    parts = [p.lower() for p in path.strip("/").split("/") if p]
    if parts and parts[-1] == "$management":
        parts.pop()
    return tuple(parts)


@dataclass(frozen=True)
class RoleAssignment:
    principal_id: str  # the token's oid claim
    role: str  # one of ROLE_CLAIMS
    scope: str  # "" (the namespace), "topic", "topic/subscriptions/name" or "queue"

    def covers(self, entity: str) -> bool:
        scope = _segments(self.scope)
        return _segments(entity)[: len(scope)] == scope


class RightsError(ValueError):
    """The role assignments cannot be used; the message says why."""


class Rights:
    """Role assignments: which claims a principal has on an entity."""

    def __init__(self, assignments: Iterable[RoleAssignment]) -> None:
        self.assignments = tuple(assignments)

    @classmethod
    def from_json(cls, document: object) -> Rights:
        """``{"roleAssignments": [{"principalId", "role", "scope"}, ...]}``."""
        items = document.get("roleAssignments") if isinstance(document, dict) else None
        if not isinstance(items, list):
            raise RightsError('expected {"roleAssignments": [...]}')
        found = []
        for index, item in enumerate(items):
            if not isinstance(item, dict) or set(item) != {"principalId", "role", "scope"}:
                raise RightsError(f"roleAssignments[{index}]: principalId, role and scope")
            if not all(isinstance(item[k], str) for k in item) or not item["principalId"]:
                raise RightsError(f"roleAssignments[{index}]: strings, principalId not empty")
            if item["role"] not in ROLE_CLAIMS:
                raise RightsError(
                    f"roleAssignments[{index}]: role {item['role']!r} is not one of "
                    f"{sorted(ROLE_CLAIMS)}"
                )
            found.append(RoleAssignment(item["principalId"].lower(), item["role"], item["scope"]))
        return cls(found)

    def claims(self, principal_id: str, entity: str) -> frozenset[str]:
        granted: set[str] = set()
        for assignment in self.assignments:
            if assignment.principal_id == principal_id.lower() and assignment.covers(entity):
                granted |= ROLE_CLAIMS[assignment.role]
        return frozenset(granted)


def unauthorized_description(claim: str, namespace: str, entity: str) -> str:
    """What Service Bus says when a link or an operation lacks a claim."""
    return (
        f"Unauthorized access. '{claim}' claim(s) are required to perform this operation. "
        f"Resource: 'sb://{namespace}/{entity.strip('/').lower()}'."
    )
