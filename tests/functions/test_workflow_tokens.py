"""Approval tokens: signing, and every way a token is refused (pure)."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest

from functions.approval_gate.tokens import ApprovalClaims, TokenError, sign, verify
from tests.functions.support import EVENT_ID, NOW

KEY = b"k" * 32
CLAIMS = ApprovalClaims(EVENT_ID.upper(), "web-1", NOW + timedelta(minutes=14))


def test_round_trip_is_compact_and_url_safe() -> None:
    token = sign(KEY, CLAIMS)
    assert len(token) < 160
    assert all(c.isalnum() or c in "-_." for c in token)
    claims = verify(KEY, token, NOW, expected_event_id=EVENT_ID)
    assert claims.event_id == EVENT_ID  # canonical lower case
    assert claims.vm_name == "web-1"
    assert claims.expires_at == CLAIMS.expires_at.replace(microsecond=0)


def _tamper_payload(token: str) -> str:
    payload, mac = token.split(".")
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).replace(b"web-1", b"db-01")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode() + "." + mac


OTHER_EVENT = "11111111-2222-4333-8444-555555555555"


@pytest.mark.parametrize(
    ("mutate", "now", "expected", "reason"),
    [
        (lambda t: t, NOW + timedelta(minutes=14), None, "expired"),
        (lambda t: t, NOW + timedelta(hours=1), None, "expired"),
        (_tamper_payload, NOW, None, "signature"),
        (lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"), NOW, None, "signature"),
        (lambda t: t + ".x", NOW, None, "malformed"),
        (lambda t: "", NOW, None, "malformed"),
        (lambda t: t, NOW, OTHER_EVENT, "another event"),
        (lambda t: t, NOW, "not-a-guid", "not a GUID"),
    ],
)
def test_refused(mutate, now, expected, reason) -> None:  # type: ignore[no-untyped-def]
    token = mutate(sign(KEY, CLAIMS))
    with pytest.raises(TokenError, match=reason):
        verify(KEY, token, now, expected_event_id=expected)


def test_another_key_is_refused() -> None:
    with pytest.raises(TokenError, match="signature"):
        verify(b"x" * 32, sign(KEY, CLAIMS), NOW)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda t: t + "!!", id="bangs-after-mac"),
        pytest.param(lambda t: t + "==", id="padding-after-mac"),
        pytest.param(lambda t: t + "=", id="one-pad"),
        pytest.param(lambda t: t + "A", id="one-more-char"),
        pytest.param(lambda t: t.replace(".", "=.", 1), id="padding-after-payload"),
        pytest.param(lambda t: t.replace(".", "!.", 1), id="junk-after-payload"),
        pytest.param(lambda t: " " + t, id="leading-space"),
        pytest.param(lambda t: t + "\n", id="trailing-newline"),
        pytest.param(lambda t: t.replace("-", "+").replace("_", "/"), id="standard-alphabet"),
    ],
)
def test_only_the_canonical_spelling_is_accepted(mutate) -> None:  # type: ignore[no-untyped-def]
    """A lenient base64 decoder drops characters outside its alphabet and padding, so `!!` or
    `==` appended to the MAC used to approve just the same."""
    token = sign(KEY, CLAIMS)
    changed = mutate(token)
    if changed == token:
        pytest.skip("this token has no character the mutation changes")
    with pytest.raises(TokenError):
        verify(KEY, changed, NOW)


def test_bits_a_lenient_decoder_ignores_are_refused() -> None:
    """The MAC's last base64 character carries 2 unused bits: another character with the same
    used bits decodes to the same digest, and must still be refused."""
    token = sign(KEY, CLAIMS)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(token[-1])
    twin = alphabet[last ^ 1]  # differs in an unused low bit
    forged = token[:-1] + twin
    assert base64.urlsafe_b64decode(forged.split(".")[1] + "=") == base64.urlsafe_b64decode(
        token.split(".")[1] + "="
    )
    with pytest.raises(TokenError, match="canonical"):
        verify(KEY, forged, NOW)
