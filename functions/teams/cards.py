"""One Adaptive Card 1.5 per transition, and the Teams Workflows payload around it (pure).

Teams Workflows ("Post to a channel when a webhook request is received") takes a message with
one attachment of content type ``application/vnd.microsoft.card.adaptive``. Teams renders
Adaptive Cards up to 1.5, so the card says 1.5 and uses nothing newer.

Untrusted text. Everything a message carries (Description, Resources, names, EventType, the
approval's reason...) is one VM's claim and must not become markup. Teams renders a Markdown
subset (bold, italic, lists, ``[links](url)``) in ``TextBlock.text`` and in ``Fact.title`` /
``Fact.value``; ``TextRun`` inside a ``RichTextBlock`` renders no Markdown at all (the schema:
"Markdown is not supported"). Escaping with backslashes depends on each client's Markdown
parser, and zero-width characters only break the patterns one thought of (and survive
copy-paste); so message text goes only into TextRuns, and TextBlocks carry only our own words.
On top of that, :func:`plain` makes the text inert wherever it lands: control and format
characters (bidi overrides, zero-width characters) removed, ``<``/``>`` replaced (no ``<at>``
mention or HTML; a mention needs ``msteams.entities`` too, which cards here never carry),
URLs and addresses defanged so that no client auto-links them (``https[:]//``, ``www[.]``,
``mailto[:]``, ``a[@]b``), ``{{`` split
(no DATE()/TIME() function) and the length bounded.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime
from typing import Any

from sebridge.contract.events import Transition, TransitionMessage
from sebridge.imds import isoformat_utc

CARD_VERSION = "1.5"
CARD_SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"
ATTACHMENT_TYPE = "application/vnd.microsoft.card.adaptive"
MAX_TEXT = 1000  # characters of one piece of message text on a card
FACT_PREFIX = "fact-"

_SCHEME = re.compile(
    r"([A-Za-z][A-Za-z0-9+.\-]*):(?=//)"
    r"|\b(mailto|tel|callto|sip|sips|im|javascript|vbscript|data|file|msteams|ms-[a-z-]+):",
    re.IGNORECASE,
)
_WWW = re.compile(r"\b(www)\.", re.IGNORECASE)


def plain(value: object, limit: int = MAX_TEXT) -> str:
    """Untrusted text made inert for a card (see the module docstring)."""
    text = value if isinstance(value, str) else str(value)
    text = "".join(
        " " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c
        for c in text
        if unicodedata.category(c) not in ("Cf", "Co", "Cs", "Cn")
    )
    text = " ".join(text.split())
    text = text.replace("<", "\u2039").replace(">", "\u203a").replace("{{", "{ {")
    text = _SCHEME.sub(lambda m: f"{m.group(1) or m.group(2)}[:]", text).replace("@", "[@]")
    text = _WWW.sub(r"\1[.]", text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def run(text: object, **style: Any) -> dict[str, Any]:
    return {"type": "TextRun", "text": plain(text), **style}


def rich(*inlines: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A RichTextBlock: the only place message text goes (TextRuns render no Markdown)."""
    return {"type": "RichTextBlock", "inlines": list(inlines), **extra}


def fact(title: str, value: object) -> dict[str, Any]:
    key = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return rich(
        {"type": "TextRun", "text": f"{title}: ", "weight": "Bolder"},
        run(value),
        id=FACT_PREFIX + key,
        spacing="None",
    )


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
    if message.transition is Transition.HELD:
        return "warning", "⏸️"
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


def held_text(message: TransitionMessage) -> str | None:
    """Why lb-pools held the drain (the ``held`` details of a Held transition)."""
    details = message.data.get("held")
    if message.transition is not Transition.HELD or not isinstance(details, dict):
        return None
    vms = details.get("vms")
    names = ", ".join(v for v in vms if isinstance(v, str)) if isinstance(vms, list) else ""
    pool = details.get("pool")
    pool_name = (
        pool.split("/")[-3] + "/" + pool.split("/")[-1]
        if isinstance(pool, str) and pool.count("/") >= 2
        else pool
    )
    return (
        f"Held: {names or 'the VMs'} stay in their pools. Taking them out would leave "
        f"{pool_name} with {details.get('healthy')} healthy member(s), fewer than the minimum "
        f"{details.get('minimum')}. The gate does not approve early; lb-pools drains them when "
        "another event on the pool completes, or Azure starts the event at NotBefore."
    )


def build_card(
    message: TransitionMessage,
    now: datetime,
    *,
    approve_url: str | None = None,
    unverified: str | None = None,
    drain: str | None = None,
) -> dict[str, Any]:
    """``unverified``: why the message did not pass the scope check (marked, no Approve
    button). ``drain``: when lb-pools takes the VMs out of their pools ("now", "at 01:30
    UTC"; functions.shared.drain_plan), shown as a fact."""
    event = message.event
    if event is None:
        raise ValueError("a card needs an event (Heartbeat messages have none)")
    style, icon = severity(message)
    vms = ", ".join(event.resources) or message.observer.vm_name
    title = f"{event.event_type} {message.transition.value.lower()}: {vms}"
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
        *([("Drain from pools", drain)] if drain else []),
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
                rich(
                    {"type": "TextRun", "text": f"{icon} ", "weight": "Bolder", "size": "Medium"},
                    run(title, weight="Bolder", size="Medium"),
                )
            ],
        },
        *(fact(k, v) for k, v in facts),
    ]
    if event.description:
        body.append(rich(run(event.description), separator=True))
    reason = held_text(message)
    if reason:
        body.append(rich(run(reason, weight="Bolder", color="Warning"), separator=True))
    approval = message.data.get("approval")
    if message.transition is Transition.APPROVED and isinstance(approval, dict):
        body.append(
            rich(
                run(
                    f"Approved by {approval.get('requestedBy', '?')}: {approval.get('reason', '')}",
                    isSubtle=True,
                )
            )
        )
    if unverified:
        body.append(
            rich(
                run(
                    "Unverified: this message did not pass the scope check, so no workflow "
                    f"acted on it and this card has no Approve button: {unverified}",
                    color="Attention",
                ),
                separator=True,
            )
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


REMOVED_POOLS_TAG = "sebridge-removed-pools"  # functions.lb_pools.nic_pools.TAG


def not_restored_card(
    message: TransitionMessage,
    missing: list[tuple[str, str]],
    restored: list[str],
    vanished: list[tuple[str, str, str]] | None = None,
    refused: list[tuple[str, str, str]] | None = None,
) -> dict[str, Any]:
    """lb-pools could not put VMs back into pools that no longer exist (a load balancer or a
    pool deleted during the maintenance), or for ip configurations their NICs no longer have
    (replaced meanwhile): which, and what did go back. ``missing`` holds (VM, pool id) pairs;
    ``vanished`` (VM, ip configuration, pool id); ``restored`` the VMs that went back into
    their other pools; ``refused`` (VM, NIC id, ARM's error code): ARM refused the restore for
    good, and the NIC keeps its record for an operator to put it back by hand."""
    event = message.event
    assert event is not None
    vanished = vanished or []
    refused = refused or []

    def short(pool: str) -> str:
        return f"{pool.split('/')[-3]}/{pool.split('/')[-1]}"

    lines = [f"{vm}: {short(pool)}" for vm, pool in missing]
    replaced = [f"{vm}: {ipc} (for {short(pool)})" for vm, ipc, pool in vanished]
    replaced_text = ["; ".join(replaced)] if replaced else []
    affected = {vm for vm, _ in missing} | {vm for vm, _, _ in vanished}
    affected |= {vm for vm, _, _ in refused}
    refusals = [f"{vm}: {nic.split('/')[-1]} ({code})" for vm, nic, code in refused]
    body: list[dict[str, Any]] = [
        {
            "type": "Container",
            "style": "warning",
            "bleed": True,
            "items": [
                rich(
                    {"type": "TextRun", "text": "⚠️ ", "weight": "Bolder", "size": "Medium"},
                    run(
                        f"Not restored after {event.event_type} {message.transition.value.lower()}"
                        f": {', '.join(sorted(affected))}",
                        weight="Bolder",
                        size="Medium",
                    ),
                )
            ],
        },
        fact("Pools that no longer exist", "; ".join(lines) or "-"),
        *(
            [fact("ARM refused the restore (put it back by hand)", "; ".join(refusals))]
            if refusals
            else []
        ),
        *[fact("IP configurations that no longer exist", text) for text in replaced_text],
        fact("Put back into their other pools", ", ".join(restored) or "-"),
        fact("Event id", event.key),
        rich(
            run(
                "These pools (or their load balancers), or the VMs' ip configurations, were "
                "deleted or replaced while the VMs were out, so nothing can put them back; check "
                "whether they should join a pool that replaced them. The record of the removal "
                "is gone from their NICs."
                + (
                    f" ARM refused to put back the NICs named above: each keeps its record in the "
                    f"tag {REMOVED_POOLS_TAG} (the pools it was in); put them back by hand."
                    if refusals
                    else ""
                ),
                isSubtle=True,
            ),
            separator=True,
        ),
    ]
    return {"type": "AdaptiveCard", "$schema": CARD_SCHEMA, "version": CARD_VERSION, "body": body}
