"""What the forwarder does with a valid approve command, given a fresh IMDS document."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sebridge.contract import commands
from sebridge.forwarder.approvals.decision import Action, decide
from sebridge.imds import Document

GUID = "8b95c271-2b77-4243-ad1a-585faa9cd908"
COMMAND = commands.approve_command(GUID, "gate", "policy", datetime(2026, 11, 23, tzinfo=UTC))


def document(status: str | None, resources: tuple[str, ...] = ("vm1", "vm2")) -> Document:
    events = []
    if status is not None:
        events.append(
            {
                "EventId": GUID.upper(),
                "EventType": "Reboot",
                "ResourceType": "VirtualMachine",
                "Resources": list(resources),
                "EventStatus": status,
                "NotBefore": "",
            }
        )
    return Document.from_imds({"DocumentIncarnation": 3, "Events": events})


@pytest.mark.parametrize(
    ("status", "kwargs", "action", "reason"),
    [
        ("Scheduled", {}, Action.APPROVE, ""),
        ("Started", {}, Action.COMPLETE, ""),
        (None, {}, Action.DEAD_LETTER, commands.EVENT_NOT_FOUND),
        ("Scheduled", {"already_approved": True}, Action.COMPLETE, ""),
        ("Started", {"already_approved": True}, Action.COMPLETE, ""),
        ("Scheduled", {"require_listed": True}, Action.APPROVE, ""),
        ("Scheduled", {"require_listed": True, "vm_name": "VM2"}, Action.APPROVE, ""),
        (
            "Scheduled",
            {"require_listed": True, "vm_name": "vm9"},
            Action.DEAD_LETTER,
            commands.NOT_LISTED,
        ),
        ("Scheduled", {"vm_name": "vm9"}, Action.APPROVE, ""),  # off by default
    ],
)
def test_decide(status: str | None, kwargs: dict, action: Action, reason: str) -> None:
    options = {"vm_name": "vm1", **kwargs}
    decision = decide(COMMAND, document(status), **options)
    assert decision.action is action
    assert decision.reason == reason
    if action is Action.APPROVE:
        assert decision.event is not None
        assert decision.event.event_id == GUID.upper()  # POSTed exactly as IMDS spells it


@pytest.mark.parametrize(
    ("status", "already_approved", "description"),
    [
        ("Scheduled", True, "already approved by this forwarder"),
        ("Started", True, "already approved by this forwarder (now Started)"),
        ("Started", False, "already Started: nothing to do"),
    ],
)
def test_a_duplicate_says_why_nothing_is_done(
    status: str, already_approved: bool, description: str
) -> None:
    decision = decide(COMMAND, document(status), vm_name="vm1", already_approved=already_approved)
    assert (decision.action, decision.description) == (Action.COMPLETE, description)
