"""Signed approval tokens for the Teams "Approve" link (pure).

``<payload>.<mac>``, both base64url without padding, read strictly: one spelling per token
(characters appended to the MAC, padding, or bits a lenient decoder ignores are refused).
The payload is ``v3|<eventId>|<vmName>|<expiry as Unix seconds>|<ARM id to acknowledge on, or
empty>|<subscription>|<resource group>|<scale set, or empty>|<affected VM,...>``: the last four
say which VMs approving takes down, so the link can ask the capacity decision again in ARM when
it is used (functions.lb_pools.guard). Links signed before that are ``v1|<eventId>|<vmName>|
<expiry>`` or, for an event approved through ARM (agentless VMs, scale sets, availability sets:
no forwarder takes the command), ``v2|<eventId>|<vmName>|<expiry>|<ARM id>``; they are still
read. The MAC is HMAC-SHA256 over a purpose prefix plus the encoded payload, so a token can't be
reused for anything but approving that one event on that one target before it expires. Every
name in it is checked against Azure's rules (functions.shared.names) when it is signed and when
it is read. At most :data:`MAX_TOKEN_LENGTH` characters (a few dozen VMs).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from functions.shared import names
from sebridge.contract.commands import CommandError, canonical_event_id

VERSION = "v1"
VERSION_ACKNOWLEDGE = "v2"
VERSION_SCOPED = "v3"
_PURPOSE = b"sebridge-approve-v1."
MAX_TOKEN_LENGTH = 4096


class TokenError(ValueError):
    """The token is malformed, tampered with, expired or for another event."""


@dataclass(frozen=True)
class ApprovalClaims:
    event_id: str  # canonical lower-case GUID
    vm_name: str  # the observer whose forwarder gets the command
    expires_at: datetime
    acknowledge_on: str = ""  # an ARM id: approve through the acknowledge API, not a command
    # Where the affected VMs are (v3): the observer's subscription, resource group and scale
    # set, and the VMs' names. Empty in links signed before links carried them.
    subscription: str = ""
    resource_group: str = ""
    scale_set: str = ""
    vms: tuple[str, ...] = ()

    @property
    def scoped(self) -> bool:
        return bool(self.vms)


def _check_scope(claims: ApprovalClaims) -> None:
    """Raises InvalidName for a name Azure would not have (never signed, never read)."""
    names.subscription_id(claims.subscription, "subscription")
    names.resource_group(claims.resource_group, "resourceGroup")
    if claims.scale_set:
        names.SCALE_SET.check(claims.scale_set, "scaleSet")
    for vm in claims.vms:
        names.VIRTUAL_MACHINE.check(vm, "vms[]")


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
    if "|" in claims.acknowledge_on:
        raise ValueError("an ARM id must not contain '|'")
    expiry = int(claims.expires_at.timestamp())
    fields = [canonical_event_id(claims.event_id), claims.vm_name, str(expiry)]
    if claims.scoped:
        _check_scope(claims)
        fields = [
            VERSION_SCOPED,
            *fields,
            claims.acknowledge_on,
            claims.subscription,
            claims.resource_group,
            claims.scale_set,
            ",".join(claims.vms),
        ]
    elif claims.acknowledge_on:
        fields = [VERSION_ACKNOWLEDGE, *fields, claims.acknowledge_on]
    else:
        fields = [VERSION, *fields]
    payload = _b64encode("|".join(fields).encode())
    token = f"{payload}.{_b64encode(_mac(key, payload))}"
    if len(token) > MAX_TOKEN_LENGTH:
        raise ValueError(f"the token would be longer than {MAX_TOKEN_LENGTH} characters")
    return token


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
        parts = _b64decode(payload).decode("utf-8").split("|")
        version = parts[0]
        subscription = group = scale_set = ""
        vms: tuple[str, ...] = ()
        if version == VERSION and len(parts) == 4:
            _, event_id, vm_name, expiry = parts
            acknowledge_on = ""
        elif version == VERSION_ACKNOWLEDGE and len(parts) == 5:
            _, event_id, vm_name, expiry, acknowledge_on = parts
            if not acknowledge_on:
                raise ValueError("no ARM id")
        elif version == VERSION_SCOPED and len(parts) == 9:
            _, event_id, vm_name, expiry, acknowledge_on, subscription, group, scale_set, listed = (
                parts
            )
            vms = tuple(listed.split(","))
        else:
            raise TokenError(f"token version {version[:8]!r} is not supported")
        expires_at = datetime.fromtimestamp(int(expiry), tz=UTC)
        event_id = canonical_event_id(event_id)
        claims = ApprovalClaims(
            event_id, vm_name, expires_at, acknowledge_on, subscription, group, scale_set, vms
        )
        if claims.scoped:
            _check_scope(claims)
    except TokenError:
        raise
    except (
        UnicodeDecodeError,
        ValueError,
        CommandError,
        OverflowError,
        IndexError,
        names.InvalidName,
    ) as exc:
        raise TokenError("token payload is malformed") from exc
    if expires_at <= now:
        raise TokenError("token has expired")
    if expected_event_id is not None:
        try:
            expected = canonical_event_id(expected_event_id)
        except CommandError as exc:
            raise TokenError("eventId is not a GUID") from exc
        if expected != event_id:
            raise TokenError("token was issued for another event")
    return claims
