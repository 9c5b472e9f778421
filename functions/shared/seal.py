"""The app's seal on what it publishes to the topic itself (pure: hmac).

Every forwarder may send to the topic, so a message is a VM's claim unless something proves
otherwise. The Function App publishes too: transitions it derives from Event Grid (agentless
mode), and ``Prepared`` and ``Held`` from lb-pools. Those are sealed: ``data.seal`` holds an
HMAC-SHA256 over the message id, the transition, the CloudEvent source and ``data`` (without
the seal), keyed with a key derived from ``APPROVAL_SIGNING_KEY``, which no VM holds.

The workflows trust a sealed message's observer as the app established it (a VM, scale set or
availability set named by Azure's own notification, or an observer lb-pools already checked),
and refuse, as a security event, a message that claims Event Grid as its source without a seal
that verifies: a VM cannot pass itself off as Azure. A forwarder cannot replay a sealed
message either: it may send to the topic but never receives from it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sebridge.contract.events import Envelope, TransitionMessage

SEAL_FIELD = "seal"
_PURPOSE = b"sebridge-app-seal-v1"


def app_key(signing_key: bytes) -> bytes:
    """The sealing key, derived from APPROVAL_SIGNING_KEY (never that key itself)."""
    if not signing_key:
        raise ValueError("an empty signing key")
    return hmac.new(signing_key, _PURPOSE, hashlib.sha256).digest()


def _mac(key: bytes, message_id: str, transition: str, source: str, data: Mapping[str, Any]) -> str:
    unsealed = {k: v for k, v in data.items() if k != SEAL_FIELD}
    canonical = json.dumps(
        [message_id, transition, source, unsealed],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        default=str,
    )
    digest = hmac.new(key, canonical.encode("ascii"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def seal(envelope: Envelope, key: bytes) -> Envelope:
    """The envelope with ``data.seal`` set."""
    body = dict(envelope.body)
    data = dict(body["data"])
    data[SEAL_FIELD] = _mac(key, envelope.message_id, envelope.subject, str(body["source"]), data)
    body["data"] = data
    return replace(envelope, body=body)


def is_sealed(message: TransitionMessage) -> bool:
    return SEAL_FIELD in message.data


def verify(message: TransitionMessage, key: bytes) -> bool:
    """Whether ``message`` carries this app's valid seal (compared in constant time)."""
    claimed = message.data.get(SEAL_FIELD)
    if not isinstance(claimed, str) or len(claimed) > 64 or message.message_id is None:
        return False
    try:
        base64.urlsafe_b64decode(claimed + "=" * (-len(claimed) % 4))
    except (binascii.Error, ValueError):
        return False
    expected = _mac(key, message.message_id, message.transition.value, message.source, message.data)
    return hmac.compare_digest(expected, claimed)


class SealingPublisher:
    """A TopicPublisher that seals everything the app publishes."""

    def __init__(self, inner: Any, key: bytes) -> None:
        self._inner = inner
        self._key = key

    def publish(self, envelope: Envelope) -> None:
        self._inner.publish(seal(envelope, self._key))
