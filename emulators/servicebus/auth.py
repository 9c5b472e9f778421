"""Check the tokens a client puts on ``$cbs`` (pure: no I/O).

SAS tokens (``SharedAccessSignature sr=...&sig=...&se=...&skn=...``) are verified against the
configured key name and key, like Microsoft's emulator (RootManageSharedAccessKey /
SAS_KEY_VALUE). JWTs are accepted without a signature check: there is no Entra ID here to
issue or verify them, so this only exercises the token path of the SDK, never authorization.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
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
