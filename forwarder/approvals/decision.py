"""What to do with a valid approve command, given a fresh IMDS document. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sebridge.contract import commands as contract
from sebridge.imds import Document, ScheduledEvent


class Action(Enum):
    APPROVE = "approve"  # POST StartRequests, then complete
    COMPLETE = "complete"  # nothing to do (already started or already approved by us)
    DEAD_LETTER = "dead-letter"


@dataclass(frozen=True)
class Decision:
    action: Action
    event: ScheduledEvent | None = None
    reason: str = ""
    description: str = ""


def decide(
    command: contract.ApproveCommand,
    document: Document,
    *,
    vm_name: str,
    require_listed: bool = False,
    already_approved: bool = False,
) -> Decision:
    """Approve only an event that is present and Scheduled (DESIGN.md, command contract)."""
    event = next((e for e in document.events if e.key == command.event_id), None)
    if event is None:
        return Decision(
            Action.DEAD_LETTER,
            reason=contract.EVENT_NOT_FOUND,
            description=f"event {command.event_id} is not in the IMDS document "
            f"(incarnation {document.incarnation}): finished, cancelled or never seen here",
        )
    if already_approved:  # first: the more telling answer to a duplicate command
        now = " (now Started)" if event.is_started else ""
        return Decision(
            Action.COMPLETE, event, description=f"already approved by this forwarder{now}"
        )
    if event.is_started:
        return Decision(Action.COMPLETE, event, description="already Started: nothing to do")
    if require_listed and vm_name.lower() not in {r.lower() for r in event.resources}:
        return Decision(
            Action.DEAD_LETTER,
            event,
            reason=contract.NOT_LISTED,
            description=f"{vm_name} is not in the event's Resources {list(event.resources)}",
        )
    return Decision(Action.APPROVE, event)
