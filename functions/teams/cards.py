"""One Adaptive Card 1.5 per transition, and the Teams Workflows payload around it (pure).

Teams Workflows ("Post to a channel when a webhook request is received") takes a message with
one attachment of content type ``application/vnd.microsoft.card.adaptive``. Teams renders
Adaptive Cards up to 1.5, so the card says 1.5 and uses nothing newer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sebridge.contract.events import Transition, TransitionMessage
from sebridge.imds import isoformat_utc

CARD_VERSION = "1.5"
CARD_SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"
ATTACHMENT_TYPE = "application/vnd.microsoft.card.adaptive"


def teams_payload(card: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "message",
        "attachments": [{"contentType": ATTACHMENT_TYPE, "contentUrl": None, "content": card}],
    }


def severity(message: TransitionMessage) -> tuple[str, str]:
    """(container style, icon): red for VM loss, amber for downtime, green when it is over."""
    if message.transition in (Transition.COMPLETED, Transition.CANCELLED, Transition.APPROVED):
        return "good", "✅"
    if message.transition is Transition.PREPARED:
        return "accent", "🧹"
    kind = message.event.event_type.lower() if message.event else ""
    if kind in {"terminate", "preempt"}:
        return "attention", "🛑"
    if kind in {"reboot", "redeploy"}:
        return "warning", "⚠️"
    return "accent", "ℹ️"  # noqa: RUF001 - the information sign is the icon we want


def relative(moment: datetime, now: datetime) -> str:
    """ "in 14 min", "3 min ago", "in 2 h 5 min", "in 3 d 4 h"."""
    seconds = int((moment - now).total_seconds())
    past = seconds < 0
    seconds = abs(seconds)
    if seconds < 60:
        text = f"{seconds} s"
    elif seconds < 3600:
        text = f"{seconds // 60} min"
    elif seconds < 86_400:
        hours, minutes = divmod(seconds // 60, 60)
        text = f"{hours} h {minutes} min" if minutes else f"{hours} h"
    else:
        days, hours = divmod(seconds // 3600, 24)
        text = f"{days} d {hours} h" if hours else f"{days} d"
    return f"{text} ago" if past else f"in {text}"


def duration_text(seconds: int | None) -> str:
    if seconds is None or seconds < 0:
        return "unknown"
    if seconds < 120:
        return f"{seconds} s"
    return f"{seconds // 60} min"


def build_card(
    message: TransitionMessage, now: datetime, *, approve_url: str | None = None
) -> dict[str, Any]:
    event = message.event
    if event is None:
        raise ValueError("a card needs an event (Heartbeat messages have none)")
    style, icon = severity(message)
    vms = ", ".join(event.resources) or message.observer.vm_name
    title = f"{icon} {event.event_type} {message.transition.value.lower()}: {vms}"
    if event.not_before is not None:
        not_before = f"{isoformat_utc(event.not_before)} ({relative(event.not_before, now)})"
    else:
        not_before = "now (started)" if event.is_started else "-"
    observer = message.observer
    where = "/".join(p for p in (observer.subscription_id, observer.resource_group) if p)
    facts = [
        ("Affected VMs", vms),
        ("Event", f"{event.event_type} ({event.status})"),
        ("Transition", message.transition.value),
        ("Not before (UTC)", not_before),
        ("Duration", duration_text(event.duration_in_seconds)),
        ("Source", event.event_source or "unknown"),
        ("Observed by", f"{observer.vm_name} ({where})" if where else observer.vm_name),
        ("Event id", event.key),
    ]
    body: list[dict[str, Any]] = [
        {
            "type": "Container",
            "style": style,
            "bleed": True,
            "items": [
                {
                    "type": "TextBlock",
                    "text": title,
                    "weight": "Bolder",
                    "size": "Medium",
                    "wrap": True,
                }
            ],
        },
        {
            "type": "FactSet",
            "facts": [{"title": k, "value": v} for k, v in facts],
        },
    ]
    if event.description:
        body.append({"type": "TextBlock", "text": event.description, "wrap": True})
    approval = message.data.get("approval")
    if message.transition is Transition.APPROVED and isinstance(approval, dict):
        body.append(
            {
                "type": "TextBlock",
                "text": f"Approved by {approval.get('requestedBy', '?')}: "
                f"{approval.get('reason', '')}",
                "wrap": True,
                "isSubtle": True,
            }
        )
    card: dict[str, Any] = {
        "type": "AdaptiveCard",
        "$schema": CARD_SCHEMA,
        "version": CARD_VERSION,
        "body": body,
    }
    if approve_url:
        body.append(
            {
                "type": "TextBlock",
                "text": "The approval policy asks a human: approve to start the maintenance "
                "early (Azure starts it at NotBefore anyway).",
                "wrap": True,
                "isSubtle": True,
            }
        )
        card["actions"] = [
            {"type": "Action.OpenUrl", "title": "Approve", "url": approve_url, "style": "positive"}
        ]
    return card
