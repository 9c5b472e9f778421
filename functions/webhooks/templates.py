"""Payload templates over the contract's fields: ``string.Template`` inside parsed JSON (pure).

Why ``string.Template`` and not Jinja2: a template here only places values, it never decides
anything. What to send and when (trigger or resolve, which transitions, which event types,
impactful or not) is the preset's and the filter's job, so there is no logic left for a
template language to carry, and no template can run code, loop or read attributes: there is
nothing to sandbox. What a template needs is what ``string.Template`` has:

* placeholders ``${eventId}`` / ``$eventId``, ``$$`` for a literal dollar sign;
* ``get_identifiers()`` and ``is_valid()`` (Python 3.11), so that a template naming a field the
  contract does not have, or holding a malformed placeholder, fails when the app starts
  (:class:`TemplateError`, turned into a SettingsError naming the endpoint), never at a message.

Escaping is structural. A template is a JSON value (an object for Slack and generic JSON, a
string for PagerDuty's summary); it is parsed once, at start, and placeholders are substituted
only inside its string leaves, never in keys and never by pasting text into JSON text. The
result is serialised with ``json.dumps``, so no value (quotes, backslashes, newlines, ``"}``)
can change the payload's structure. On top of that each preset escapes values for its target
(Slack: ``&``, ``<``, ``>``, so ``<!channel>`` or ``<https://x|text>`` from IMDS stays text).
A string leaf that is exactly one placeholder may keep the value's JSON type (generic preset:
``"${resources}"`` becomes a list, ``"${durationInSeconds}"`` a number or null).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from string import Template
from typing import Any

from functions.shared.impact import ImpactRules
from sebridge.contract.events import TransitionMessage
from sebridge.imds import isoformat_utc

FieldValue = str | int | bool | list[str] | None

# Every field a template may name, with what it holds (docs/workflows.md, "Webhooks").
FIELDS: dict[str, str] = {
    "messageId": "the Service Bus message id",
    "transition": "Scheduled, Updated, Started, Completed, Cancelled, Approved, Prepared or Held",
    "eventId": "the EventId, lower case",
    "eventType": "Freeze, Reboot, Redeploy, Preempt or Terminate",
    "eventStatus": "Scheduled or Started",
    "resourceType": "VirtualMachine",
    "resources": "the affected VMs (a list; joined with ', ' inside text)",
    "affected": "the affected VMs as text (the observer when Resources is empty)",
    "notBefore": "NotBefore in ISO 8601 UTC, or empty/null",
    "notBeforeText": "NotBefore in UTC, 'now (started)' once Started, else '-'",
    "durationInSeconds": "DurationInSeconds (a number, -1 or null when unknown)",
    "durationText": "the duration as text: '30 s', '5 min' or 'unknown'",
    "description": "Description, or empty/null",
    "eventSource": "EventSource (Platform or User), or empty/null",
    "documentIncarnation": "DocumentIncarnation the observer saw",
    "observedAt": "when the observer saw it, ISO 8601 UTC",
    "vmName": "the observing VM",
    "vmId": "the observing VM's id",
    "resourceId": "the observing VM's ARM id",
    "subscriptionId": "the observer's subscription",
    "resourceGroup": "the observer's resource group",
    "location": "the observer's region",
    "zone": "the observer's availability zone",
    "vmScaleSetName": "the observer's scale set, or empty",
    "impactful": "true when lb-pools drains the VMs for this event (LB_IMPACTFUL_EVENT_TYPES)",
    "drainText": "Scheduled and Updated of an impactful event: when lb-pools takes the VMs out "
    "of their pools ('now', 'at 01:30 UTC', or 'drained at 01:30 UTC' once done); else "
    "empty/null",
    "approvedBy": "who approved (Approved only), or empty/null",
    "approvalReason": "why (Approved only), or empty/null",
    "summary": "one line: '<eventType> <transition>: <affected>, not before <notBefore>'",
    "verified": "false for a message that failed the scope check (sent only to endpoints with "
    "unverified: true; nothing acted on it), else true",
    "unverifiedReason": "why the message failed the scope check, or empty/null",
}

MAX_TEMPLATE_DEPTH = 16


class TemplateError(ValueError):
    """A template that cannot be used; the message says where and why (no secret in it)."""


def _duration_text(seconds: int | None) -> str:
    if seconds is None or seconds < 0:
        return "unknown"
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"


def message_fields(
    message: TransitionMessage,
    impact: ImpactRules,
    *,
    unverified: str | None = None,
    drain: str | None = None,
) -> dict[str, FieldValue]:
    """The values a template sees for one message (an event's transition, not a Heartbeat);
    ``unverified``: why it failed the scope check (None: it passed); ``drain``: when lb-pools
    drains (functions.shared.drain_plan)."""
    event = message.event
    if event is None:
        raise ValueError("webhook payloads are built for events (Heartbeat has none)")
    observer = message.observer
    affected = ", ".join(event.resources) or observer.vm_name
    not_before = isoformat_utc(event.not_before) if event.not_before else None
    not_before_text = not_before or ("now (started)" if event.is_started else "-")
    approval = message.data.get("approval")
    approval = approval if isinstance(approval, dict) else {}
    incarnation = message.incarnation
    summary = f"{event.event_type} {message.transition.value.lower()}: {affected}"
    if not_before:
        summary += f", not before {not_before}"
    return {
        "messageId": message.message_id,
        "transition": message.transition.value,
        "eventId": event.key,
        "eventType": event.event_type,
        "eventStatus": event.status,
        "resourceType": event.resource_type,
        "resources": list(event.resources),
        "affected": affected,
        "notBefore": not_before,
        "notBeforeText": not_before_text,
        "durationInSeconds": event.duration_in_seconds,
        "durationText": _duration_text(event.duration_in_seconds),
        "description": event.description,
        "eventSource": event.event_source,
        "documentIncarnation": incarnation,
        "observedAt": isoformat_utc(message.time) if message.time else None,
        "vmName": observer.vm_name,
        "vmId": observer.vm_id,
        "resourceId": observer.resource_id,
        "subscriptionId": observer.subscription_id,
        "resourceGroup": observer.resource_group,
        "location": observer.location,
        "zone": observer.zone,
        "vmScaleSetName": observer.vm_scale_set_name,
        "impactful": impact.is_impactful(event),
        "drainText": drain,
        "approvedBy": _str_or_none(approval.get("requestedBy")),
        "approvalReason": _str_or_none(approval.get("reason")),
        "summary": summary,
        "verified": unverified is None,
        "unverifiedReason": unverified,
    }


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def clean(text: str) -> str:
    """A string every JSON encoder and receiver takes: lone surrogates replaced."""
    return text.encode("utf-8", "replace").decode("utf-8")


def as_text(value: FieldValue) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(value)
    return str(value)


@dataclass(frozen=True)
class CompiledTemplate:
    """A parsed template: a JSON value whose string leaves are ``string.Template`` texts."""

    value: Any
    identifiers: frozenset[str]


def _leaves(value: Any, depth: int = 0) -> list[str]:
    if depth > MAX_TEMPLATE_DEPTH:
        raise TemplateError(f"nested deeper than {MAX_TEMPLATE_DEPTH} levels")
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        found: list[str] = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise TemplateError("object keys must be strings")
            found.extend(_leaves(item, depth + 1))
        return found
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item, depth + 1)]
    if value is None or isinstance(value, bool | int | float):
        return []
    raise TemplateError(f"a {type(value).__name__} is not a JSON value")


def compile_template(value: Any) -> CompiledTemplate:
    """Check every placeholder now: malformed ones and unknown fields raise TemplateError."""
    identifiers: set[str] = set()
    for leaf in _leaves(value):
        template = Template(leaf)
        if not template.is_valid():
            snippet = leaf if len(leaf) <= 60 else leaf[:57] + "..."
            raise TemplateError(
                f"invalid placeholder in {snippet!r} (write ${{field}}, and $$ for a dollar sign)"
            )
        identifiers.update(template.get_identifiers())
    unknown = sorted(identifiers - set(FIELDS))
    if unknown:
        raise TemplateError(
            f"references fields the contract does not have: {unknown} (known: {', '.join(FIELDS)})"
        )
    return CompiledTemplate(value, frozenset(identifiers))


def _sole_placeholder(text: str) -> str | None:
    identifiers = Template(text).get_identifiers()
    if len(identifiers) == 1 and text in (f"${identifiers[0]}", f"${{{identifiers[0]}}}"):
        return identifiers[0]
    return None


def render(
    template: CompiledTemplate,
    fields: Mapping[str, FieldValue],
    *,
    escape: Callable[[str], str],
    typed: bool,
) -> Any:
    """The payload: the template's structure with each string leaf substituted.

    ``escape`` is applied to every value placed (never to the template's own text), after
    lone surrogates are replaced. With ``typed``, a leaf that is only one placeholder takes
    the value itself (a list, a number, a boolean or null; strings still escaped).
    """
    text = {name: escape(clean(as_text(value))) for name, value in fields.items()}

    def typed_value(value: FieldValue) -> Any:
        if isinstance(value, str):
            return escape(clean(value))
        if isinstance(value, list):
            return [escape(clean(item)) for item in value]
        return value

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            if typed:
                name = _sole_placeholder(node)
                if name is not None:
                    return typed_value(fields[name])
            return Template(node).substitute(text)
        if isinstance(node, dict):
            return {key: walk(item) for key, item in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(template.value)
