"""Signed approval tokens for the Teams "Approve" link (pure).

``<payload>.<mac>``, both base64url without padding, read strictly: one spelling per token
(characters appended to the MAC, padding, or bits a lenient decoder ignores are refused).
The payload is ``v1|<eventId>|<vmName>|<expiry as Unix seconds>``; the MAC is HMAC-SHA256
over a purpose prefix plus the encoded payload, so a token can't be reused for anything but
approving that one event on that one VM before it expires. About 120 characters: fits in any URL.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sebridge.contract.commands import CommandError, canonical_event_id

VERSION = "v1"
_PURPOSE = b"sebridge-approve-v1."
MAX_TOKEN_LENGTH = 512


class TokenError(ValueError):
    """The token is malformed, tampered with, expired or for another event."""


@dataclass(frozen=True)
class ApprovalClaims:
    event_id: str  # canonical lower-case GUID
    vm_name: str  # the observer whose forwarder gets the command
    expires_at: datetime


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


_B64URL = re.compile(r"[A-Za-z0-9_-]+")
MAC_LENGTH = 43  # a SHA-256 digest in base64url without padding


def _b64decode(text: str) -> bytes:
    """Strict: only the base64url alphabet, no padding, and the one canonical spelling of its
    bytes (so nothing can be appended to or changed in a token that still decodes the same)."""
    if not _B64URL.fullmatch(text):
        raise TokenError("token is not base64url")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise TokenError("token is not base64url") from exc
    if _b64encode(raw) != text:
        raise TokenError("token is not in canonical base64url")
    return raw


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, _PURPOSE + payload.encode("ascii"), hashlib.sha256).digest()


def sign(key: bytes, claims: ApprovalClaims) -> str:
    if not key:
        raise ValueError("an empty signing key")
    if "|" in claims.vm_name or not claims.vm_name:
        raise ValueError("a VM name must be non-empty and must not contain '|'")
    expiry = int(claims.expires_at.timestamp())
    payload = _b64encode(
        f"{VERSION}|{canonical_event_id(claims.event_id)}|{claims.vm_name}|{expiry}".encode()
    )
    return f"{payload}.{_b64encode(_mac(key, payload))}"


def verify(
    key: bytes, token: str, now: datetime, *, expected_event_id: str | None = None
) -> ApprovalClaims:
    """The claims of a genuine, unexpired token; :class:`TokenError` says why not."""
    if not token or len(token) > MAX_TOKEN_LENGTH or token.count(".") != 1:
        raise TokenError("token is malformed")
    payload, mac = token.split(".")
    if len(mac) != MAC_LENGTH or not _B64URL.fullmatch(payload):
        raise TokenError("token is malformed")
    # The MAC first, in constant time: nothing in an unauthenticated payload is trusted.
    if not hmac.compare_digest(_b64decode(mac), _mac(key, payload)):
        raise TokenError("token signature does not match")
    try:
        version, event_id, vm_name, expiry = _b64decode(payload).decode("utf-8").split("|")
        expires_at = datetime.fromtimestamp(int(expiry), tz=UTC)
        event_id = canonical_event_id(event_id)
    except (UnicodeDecodeError, ValueError, CommandError, OverflowError) as exc:
        raise TokenError("token payload is malformed") from exc
    if version != VERSION:
        raise TokenError(f"token version {version!r} is not supported")
    if expires_at <= now:
        raise TokenError("token has expired")
    if expected_event_id is not None:
        try:
            expected = canonical_event_id(expected_event_id)
        except CommandError as exc:
            raise TokenError("eventId is not a GUID") from exc
        if expected != event_id:
            raise TokenError("token was issued for another event")
    return ApprovalClaims(event_id=event_id, vm_name=vm_name, expires_at=expires_at)
