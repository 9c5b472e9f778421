"""The three presets: Slack incoming webhooks, PagerDuty Events API v2, generic JSON (pure).

A preset fixes what a template cannot: the payload's shape and escaping, which transitions make
sense, and (PagerDuty) when to trigger and when to resolve. Each returns the body to POST, or
a :class:`Skip` saying why this message is not for the endpoint.

* **slack**: the template is the message payload (an object with ``text`` and optionally
  ``blocks``); every value is escaped for Slack (``&`` ``<`` ``>`` become entities), so text
  from IMDS can neither mention (``<!channel>``, ``<@U123>``) nor make links (``<url|text>``),
  and is cut to :data:`SLACK_MAX_VALUE` characters. An unverified message's ``text`` starts
  with :data:`UNVERIFIED_PREFIX` and the reason.
* **pagerduty**: Events API v2 (``POST https://events.pagerduty.com/v2/enqueue``). Scheduled,
  Updated and Started of an *impactful* event (the rules lb-pools drains by) send ``trigger``;
  Completed and Cancelled send ``resolve``; all with the same ``dedup_key``, made from the
  EventId and the verified scope (the observer's availability set, scale set or VM), so
  PagerDuty keeps one alert per event, a redelivery changes nothing, and no message of one
  scope can resolve another's alert. Resolve is sent for every event the filter passes,
  impactful or not: an Updated can change an event's impact, and resolving an alert that was
  never opened is a no-op for PagerDuty. Only verified messages get here: an unverified one
  never triggers or resolves an alert. The template, if given, is the alert's summary text
  (cut to 1,024 characters, PagerDuty's limit).
* **generic**: the template is the JSON body; by default every contract field, typed
  (``verified`` among them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from functions.shared.verified import UnverifiedMessage, VerifiedMessage
from functions.webhooks.templates import (
    FIELDS,
    CompiledTemplate,
    FieldValue,
    clean,
    compile_template,
    render,
)
from sebridge import lifecycle
from sebridge.contract.events import Transition

SLACK, PAGERDUTY, GENERIC = "slack", "pagerduty", "generic"
PAGERDUTY_ENQUEUE_URL = "https://events.pagerduty.com/v2/enqueue"
PAGERDUTY_MAX_SUMMARY = 1024
PAGERDUTY_MAX_SOURCE = 255
PAGERDUTY_MAX_DETAIL = 1000
SLACK_MAX_VALUE = 1000
CLIENT = "Scheduled Events Bridge"
UNVERIFIED_PREFIX = (
    ":warning: *Unverified*: this message failed the scope check and nothing acted on it:"
)

# Reports (Heartbeat, Measured) are no event transition an endpoint could be told about.
EVENT_TRANSITIONS = frozenset(t for t in Transition if not t.is_report)
TRIGGERS = frozenset({Transition.SCHEDULED, Transition.UPDATED, Transition.STARTED})
RESOLVES = frozenset({Transition.COMPLETED, Transition.CANCELLED})
VM_LOSS = frozenset({"terminate", "preempt"})


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class Preset:
    name: str
    transitions: frozenset[Transition]  # allowed, and the default when none are configured
    template_kinds: tuple[type, ...]  # what a configured template must be
    template_shape: str  # the same, in words
    default_template: CompiledTemplate
    needs_url: bool  # else default_url
    default_url: str = ""
    needs_routing_key: bool = False


def slack_escape(text: str) -> str:
    """Slack's three control characters as entities (and nothing else, as Slack asks)."""
    if len(text) > SLACK_MAX_VALUE:
        text = text[: SLACK_MAX_VALUE - 1] + "\u2026"
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _verbatim(text: str) -> str:
    return text


SLACK_TEMPLATE = compile_template(
    {
        "text": "*${eventType} ${transition}*: ${affected}\n"
        "Not before (UTC): ${notBeforeText} | duration: ${durationText} | source: ${eventSource}\n"
        "${description}\n"
        "Event ${eventId}, observed by ${vmName} (${resourceGroup})"
    }
)
PAGERDUTY_TEMPLATE = compile_template("${summary}")
GENERIC_TEMPLATE = compile_template({name: f"${{{name}}}" for name in FIELDS})

PRESETS: dict[str, Preset] = {
    SLACK: Preset(
        SLACK, EVENT_TRANSITIONS, (dict,), "a JSON object", SLACK_TEMPLATE, needs_url=True
    ),
    PAGERDUTY: Preset(
        PAGERDUTY,
        TRIGGERS | RESOLVES,
        (str,),
        "a string (the alert summary)",
        PAGERDUTY_TEMPLATE,
        needs_url=False,
        default_url=PAGERDUTY_ENQUEUE_URL,
        needs_routing_key=True,
    ),
    GENERIC: Preset(
        GENERIC,
        EVENT_TRANSITIONS,
        (dict, list),
        "a JSON object or list",
        GENERIC_TEMPLATE,
        needs_url=True,
    ),
}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def dedup_key(verified: VerifiedMessage) -> str:
    """One PagerDuty alert per event and scope: the EventId as in message ids (lower case; a
    digest for an odd one) and a digest of the verified placement (availability set, scale set
    or VM), at most 54 characters (PagerDuty takes 255). Every observer of one event shares its
    placement, so they all name one alert; a message from another scope names another."""
    event = verified.message.event
    assert event is not None
    return f"sebridge:{lifecycle.event_ref(event.event_id)}:{verified.placement_digest}"


def pagerduty_body(
    verified: VerifiedMessage,
    fields: dict[str, FieldValue],
    template: CompiledTemplate,
    routing_key: str,
) -> dict[str, Any] | Skip:
    message = verified.message
    if message.transition in RESOLVES:
        return {
            "routing_key": routing_key,
            "event_action": "resolve",
            "dedup_key": dedup_key(verified),
        }
    if message.transition not in TRIGGERS:
        return Skip(f"PagerDuty does nothing on {message.transition.value}")
    if not fields["impactful"]:
        return Skip("not impactful (LB_IMPACTFUL_EVENT_TYPES, LB_FREEZE_THRESHOLD_SECONDS)")
    summary = render(template, fields, escape=_verbatim, typed=False)
    kind = str(fields["eventType"]).lower()
    details = {
        name: fields[name]
        for name in (
            "eventId",
            "eventType",
            "eventStatus",
            "transition",
            "resources",
            "notBefore",
            "durationInSeconds",
            "eventSource",
            "vmName",
            "subscriptionId",
            "resourceGroup",
            "messageId",
        )
    }
    description = fields["description"]
    if isinstance(description, str):
        details["description"] = _cut(clean(description), PAGERDUTY_MAX_DETAIL)
    payload: dict[str, Any] = {
        "summary": _cut(clean(str(summary)), PAGERDUTY_MAX_SUMMARY) or "scheduled event",
        "source": _cut(clean(str(fields["affected"])), PAGERDUTY_MAX_SOURCE),
        "severity": "critical" if kind in VM_LOSS else "warning",
        "class": clean(str(fields["eventType"])),
        "custom_details": details,
    }
    if fields["resourceGroup"]:
        payload["group"] = clean(str(fields["resourceGroup"]))
    if fields["observedAt"]:
        payload["timestamp"] = fields["observedAt"]
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key(verified),
        "client": CLIENT,
        "payload": payload,
    }


def _mark_unverified(body: Any, reason: str) -> Any:
    """A Slack payload that says, first, that nothing acted on it and why."""
    note = f"{UNVERIFIED_PREFIX} {slack_escape(clean(reason))}"
    if isinstance(body, dict):
        text = body.get("text")
        return {**body, "text": f"{note}\n{text}" if isinstance(text, str) and text else note}
    return body


def build_body(
    preset: str,
    checked: VerifiedMessage | UnverifiedMessage,
    fields: dict[str, FieldValue],
    template: CompiledTemplate,
    routing_key: str = "",
) -> Any | Skip:
    """The body to POST for the message (already past the endpoint's filter), or a Skip."""
    if preset == SLACK:
        body = render(template, fields, escape=slack_escape, typed=False)
        if isinstance(checked, UnverifiedMessage):
            body = _mark_unverified(body, checked.reason)
        return body
    if preset == PAGERDUTY:
        if isinstance(checked, UnverifiedMessage):
            return Skip("PagerDuty never gets unverified messages")
        return pagerduty_body(checked, fields, template, routing_key)
    if preset == GENERIC:
        return render(template, fields, escape=_verbatim, typed=True)
    raise ValueError(f"unknown preset {preset!r}")
