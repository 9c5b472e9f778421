"""Known answers for the message contract: literal message ids, envelopes and an HMAC seal.

The golden messages (tests/fixtures/golden.py, tests/fixtures/messages/) and the ids the other
tests expect are computed by the code under test, so a change there moves both sides at once
and no test notices. Here every expected value is written out by hand from README "Message
contract v1" (CloudEvents 1.0 structured JSON, the documented data fields, the Service Bus
properties and the id table), and every digest in an id and the seal are computed again in this
file with hashlib and hmac directly, from the documented scheme, not through sebridge.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from functions.shared.seal import app_key, seal, verify
from sebridge.contract.events import Envelope, parse_message
from tests.fixtures import golden

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "messages"

# -- the inputs of tests/fixtures/golden.py, typed out ------------------------------------------
REF = "8b95c271-2b77-4243-ad1a-585faa9cd908"  # the EventId in lower case
SUBSCRIPTION = "00000000-0000-4000-8000-000000000001"
VM_ID = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-web/providers/Microsoft.Compute/"
    "virtualMachines/web-1"
)
POOL = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-web/providers/Microsoft.Network/"
    "loadBalancers/lb-web/backendAddressPools/pool-a"
)
OBSERVER = {
    "location": "westeurope",
    "resourceGroup": "rg-web",
    "resourceId": VM_ID,
    "subscriptionId": SUBSCRIPTION,
    "vmId": "5c1a2c2a-79e3-4bd2-9a55-000000000001",
    "vmName": "web-1",
    "vmScaleSetName": "",
    "zone": "1",
}
IMDS_SCHEDULED = {  # verbatim, EventId in the upper case IMDS may send
    "Description": "Virtual machine is going to be restarted as requested by authorized user.",
    "DurationInSeconds": -1,
    "EventId": "8B95C271-2B77-4243-AD1A-585FAA9CD908",
    "EventSource": "Platform",
    "EventStatus": "Scheduled",
    "EventType": "Reboot",
    "NotBefore": "Sun, 22 Nov 2026 01:35:00 GMT",
    "ResourceType": "VirtualMachine",
    "Resources": ["web-1", "web-2"],
}
IMDS_UPDATED = {**IMDS_SCHEDULED, "NotBefore": "Sun, 22 Nov 2026 01:45:00 GMT"}
IMDS_STARTED = {**IMDS_UPDATED, "EventStatus": "Started", "NotBefore": ""}
# The content digest of IMDS_UPDATED and the causes of Prepared and Held, recomputed below.
UPDATED_DIGEST = "617c841c82e8"
PREPARED_CAUSE_DIGEST = "bc1c3259b7545fa3"
HELD_CAUSE_DIGEST = "f3a7c7575422b473"

MESSAGE_IDS = {
    "scheduled": f"{REF}:Scheduled:1",
    "updated": f"{REF}:Updated:1:{UPDATED_DIGEST}:1",
    "started": f"{REF}:Started:1",
    "completed": f"{REF}:Completed:1",
    "cancelled": f"{REF}:Cancelled:1",
    "approved": f"{REF}:Approved:1",
    # the cause's appearance (1), then the digest of its id
    "prepared": f"{REF}:Prepared:1:{PREPARED_CAUSE_DIGEST}",
    "held": f"{REF}:Held:1:{HELD_CAUSE_DIGEST}",
    "heartbeat": "heartbeat:web-1:20261122T012000Z",
}


def _properties(transition: str, status: str, *, with_place: bool = True) -> dict[str, Any]:
    """application_properties of an event's message, as README lists them."""
    place = {"resourceGroup": "rg-web", "subscriptionId": SUBSCRIPTION} if with_place else {}
    return {
        "durationInSeconds": -1,
        "eventSource": "Platform",
        "eventStatus": status,
        "eventType": "Reboot",
        "resources": "web-1,web-2",
        "schemaVersion": 1,
        "transition": transition,
        "vmName": "web-1",
        **place,
    }


# README "Message contract v1": printf %s <ref> | sha256sum | cut -c1-32
TRACE_ID = "21c4f74798af482d41e76a8393873ccd"


def _trace(message_id: str) -> dict[str, str]:
    """traceparent and Diagnostic-Id of a message about the event: the event's trace, the
    span named by the first 8 bytes of SHA-256 of the message id."""
    assert hashlib.sha256(REF.encode()).hexdigest()[:32] == TRACE_ID
    span = hashlib.sha256(message_id.encode()).hexdigest()[:16]
    value = f"00-{TRACE_ID}-{span}-01"
    return {"traceparent": value, "Diagnostic-Id": value}


def _envelope(
    name: str,
    transition: str,
    data: dict[str, Any],
    properties: dict[str, Any],
    *,
    source: str = VM_ID,
    session: str = REF,
    subject: str | None = REF,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "data": data,
        "datacontenttype": "application/json",
        "dataschema": "urn:sebridge:schema:scheduled-event-data:v1",
        "id": MESSAGE_IDS[name],
        "source": source,
        "specversion": "1.0",
        "time": "2026-11-22T01:20:00Z",
        "type": f"Azure.VM.ScheduledEvent.{transition}",
    }
    if subject is not None:
        body["subject"] = subject
        properties = {**properties, **_trace(MESSAGE_IDS[name])}
    return {
        "application_properties": properties,
        "body": body,
        "message_id": MESSAGE_IDS[name],
        "session_id": session,
        "subject": transition,
    }


def _event_data(
    imds: dict[str, Any], incarnation: int, not_before: str | None, **more: Any
) -> dict[str, Any]:
    return {
        **imds,
        "documentIncarnation": incarnation,
        "notBefore": not_before,
        "observer": OBSERVER,
        "schemaVersion": 1,
        **more,
    }


ENVELOPES: dict[str, dict[str, Any]] = {
    "scheduled": _envelope(
        "scheduled",
        "Scheduled",
        _event_data(IMDS_SCHEDULED, 11, "2026-11-22T01:35:00Z"),
        _properties("Scheduled", "Scheduled"),
    ),
    "updated": _envelope(
        "updated",
        "Updated",
        _event_data(
            IMDS_UPDATED,
            12,
            "2026-11-22T01:45:00Z",
            changes={
                "NotBefore": {
                    "from": "Sun, 22 Nov 2026 01:35:00 GMT",
                    "to": "Sun, 22 Nov 2026 01:45:00 GMT",
                }
            },
        ),
        _properties("Updated", "Scheduled"),
    ),
    "started": _envelope(
        "started",
        "Started",
        _event_data(IMDS_STARTED, 13, None),
        _properties("Started", "Started"),
    ),
    "completed": _envelope(
        "completed",
        "Completed",
        _event_data(IMDS_STARTED, 14, None),  # the event as last seen: Started
        _properties("Completed", "Started"),
    ),
    "cancelled": _envelope(
        "cancelled",
        "Cancelled",
        _event_data(IMDS_UPDATED, 14, "2026-11-22T01:45:00Z"),  # last seen Scheduled
        _properties("Cancelled", "Scheduled"),
    ),
    "approved": _envelope(
        "approved",
        "Approved",
        _event_data(
            IMDS_UPDATED,
            12,
            "2026-11-22T01:45:00Z",
            approval={"reason": "policy: approve-when-prepared", "requestedBy": "approval-gate"},
        ),
        _properties("Approved", "Scheduled"),
    ),
    "prepared": _envelope(
        "prepared",
        "Prepared",
        _event_data(
            IMDS_UPDATED,
            12,
            "2026-11-22T01:45:00Z",
            prepared={"preparedBy": "lb-pools", "vms": ["web-1", "web-2"]},
        ),
        _properties("Prepared", "Scheduled"),
        source="urn:sebridge:function:lb-pools",
    ),
    "held": _envelope(
        "held",
        "Held",
        _event_data(
            IMDS_UPDATED,
            12,
            "2026-11-22T01:45:00Z",
            held={"healthy": 0, "minimum": 1, "pool": POOL, "vms": ["web-1"]},
        ),
        _properties("Held", "Scheduled"),
        source="urn:sebridge:function:lb-pools",
    ),
    "heartbeat": _envelope(
        "heartbeat",
        "Heartbeat",
        {
            "heartbeat": {
                "forwarderVersion": "0.2.0",
                "lastIncarnation": 14,
                "lastSuccessfulPoll": "2026-11-22T01:20:00Z",
                "outboxDepth": 0,
            },
            "observer": OBSERVER,
            "schemaVersion": 1,
        },
        {
            "resourceGroup": "rg-web",
            "schemaVersion": 1,
            "subscriptionId": SUBSCRIPTION,
            "transition": "Heartbeat",
            "vmName": "web-1",
        },
        session="web-1",  # a Heartbeat is the VM's, not an event's
        subject=None,
    ),
}


@pytest.mark.parametrize("name", sorted(MESSAGE_IDS))
def test_the_message_id_is_the_documented_one(name: str) -> None:
    assert golden.build()[name].message_id == MESSAGE_IDS[name]


def test_the_digests_in_the_ids_follow_the_documented_scheme() -> None:
    """Updated: a SHA-256 of the resulting content (NotBefore as an instant, Resources as a set
    of lower-case names, DurationInSeconds, Description, EventType and EventSource in lower
    case), as compact JSON, first 12 hex digits. Prepared and Held: a SHA-256 of the id of the
    message that caused them, first 16 hex digits, after the appearance that id names."""
    content = [
        "2026-11-22T01:45:00+00:00",
        ["web-1", "web-2"],
        -1,
        IMDS_UPDATED["Description"],
        "reboot",
        "platform",
    ]
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    assert hashlib.sha256(canonical).hexdigest()[:12] == UPDATED_DIGEST
    prepared_cause = f"{REF}:Updated:1:0123456789ab:1"  # golden.py's cause of Prepared
    assert hashlib.sha256(prepared_cause.encode()).hexdigest()[:16] == PREPARED_CAUSE_DIGEST
    assert hashlib.sha256(f"{REF}:Scheduled:1".encode()).hexdigest()[:16] == HELD_CAUSE_DIGEST


@pytest.mark.parametrize("name", sorted(ENVELOPES))
def test_the_envelope_is_the_literal_one(name: str) -> None:
    built = golden.build()[name].to_dict()
    assert built == ENVELOPES[name]
    # and the files the workflow tests feed to the functions hold the same
    assert json.loads((FIXTURES / f"{name}.json").read_text()) == ENVELOPES[name]


@pytest.mark.parametrize("name", sorted(ENVELOPES))
def test_the_literal_body_reads_as_its_transition(name: str) -> None:
    literal = ENVELOPES[name]
    message = parse_message(json.dumps(literal["body"]), literal["message_id"])
    assert message.transition.value == literal["subject"]
    assert message.source == literal["body"]["source"]


SIGNING_KEY = b"known-answer-signing-key-0123456789abcdef"
# HMAC-SHA256 keyed with HMAC-SHA256(APPROVAL_SIGNING_KEY, "sebridge-app-seal-v1"), over the
# compact, key-sorted, ASCII JSON of [message id, transition, source, data without the seal];
# base64url without padding. Computed once with the lines of test_the_seal_... below.
PREPARED_SEAL = "CkeUxfCWI8zr2FfZn-OmYvzRQCs_hUxmL6-aSV0XLUA"


def _independent_seal(envelope: dict[str, Any], signing_key: bytes) -> str:
    key = hmac.new(signing_key, b"sebridge-app-seal-v1", hashlib.sha256).digest()
    body = envelope["body"]
    data = {k: v for k, v in body["data"].items() if k != "seal"}
    canonical = json.dumps(
        [envelope["message_id"], envelope["subject"], body["source"], data],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    digest = hmac.new(key, canonical.encode("ascii"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def test_the_seal_of_a_prepared_is_the_known_hmac() -> None:
    assert _independent_seal(ENVELOPES["prepared"], SIGNING_KEY) == PREPARED_SEAL
    sealed = seal(Envelope.from_dict(ENVELOPES["prepared"]), app_key(SIGNING_KEY))
    assert sealed.body["data"]["seal"] == PREPARED_SEAL
    expected = copy.deepcopy(ENVELOPES["prepared"])
    expected["body"]["data"]["seal"] = PREPARED_SEAL
    assert sealed.to_dict() == expected  # the seal is all that changes
    message = parse_message(json.dumps(sealed.body), sealed.message_id)
    assert verify(message, app_key(SIGNING_KEY))
    assert not verify(message, app_key(SIGNING_KEY + b"x"))
    tampered = copy.deepcopy(sealed.body)
    tampered["data"]["prepared"]["vms"] = ["web-1"]
    assert not verify(parse_message(json.dumps(tampered), sealed.message_id), app_key(SIGNING_KEY))
