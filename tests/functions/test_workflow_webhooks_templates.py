"""webhooks templates and presets (pure): whatever IMDS sends, the payload keeps its structure,
Slack text cannot mention or link, and PagerDuty would accept every body."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulators.fakes.webhooks import pagerduty_errors
from functions.shared.impact import DEFAULT_RULES
from functions.webhooks.presets import (
    GENERIC_TEMPLATE,
    PAGERDUTY,
    PAGERDUTY_TEMPLATE,
    SLACK,
    SLACK_MAX_VALUE,
    SLACK_TEMPLATE,
    Skip,
    build_body,
    slack_escape,
)
from functions.webhooks.templates import (
    FIELDS,
    TemplateError,
    compile_template,
    message_fields,
    render,
)
from sebridge.contract.events import Transition, TransitionMessage, event_message, parse_message
from sebridge.imds import Document
from tests.fixtures import golden
from tests.functions.support import as_verified
from tests.support.budget import examples

ROUTING_KEY = "0123456789abcdef0123456789ABCDEF"


def message(transition: str = "Scheduled", **fields: Any) -> TransitionMessage:
    raw = {**golden.SCHEDULED, **fields}
    event = Document.from_imds({"DocumentIncarnation": 3, "Events": [raw]}).events[0]
    kind = Transition(transition)
    envelope = event_message(
        kind,
        event,
        golden.OBSERVER,
        3,
        golden.OBSERVED_AT,
        changes={"NotBefore": {"from": "a", "to": "b"}} if kind is Transition.UPDATED else None,
        approval={"requestedBy": "gate", "reason": "policy"}
        if kind is Transition.APPROVED
        else None,
    )
    # Through the wire format, as the function sees it.
    return parse_message(envelope.body_bytes(), envelope.message_id)


def unescape_slack(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def test_every_field_is_documented_and_given() -> None:
    for transition in ("Scheduled", "Approved", "Started"):
        assert set(message_fields(message(transition), DEFAULT_RULES)) == set(FIELDS)
    approved = message_fields(message("Approved"), DEFAULT_RULES)
    assert (approved["approvedBy"], approved["approvalReason"]) == ("gate", "policy")


def test_derived_fields() -> None:
    fields = message_fields(message("Started", EventStatus="Started", NotBefore=""), DEFAULT_RULES)
    assert (fields["notBefore"], fields["notBeforeText"]) == (None, "now (started)")
    assert fields["summary"] == "Reboot started: web-1, web-2"
    fields = message_fields(message(Resources=[], DurationInSeconds=300), DEFAULT_RULES)
    assert (fields["affected"], fields["durationText"]) == ("web-1", "5 min")


def test_placeholders_only_in_values_and_dollar_escapes() -> None:
    template = compile_template({"${eventId}": "$$${eventType} costs $$5 ($transition)"})
    body = render(template, message_fields(message(), DEFAULT_RULES), escape=str, typed=True)
    assert body == {"${eventId}": "$Reboot costs $5 (Scheduled)"}
    assert template.identifiers == {"eventType", "transition"}


def test_typed_leaves_keep_the_values_type_only_when_alone() -> None:
    template = compile_template(
        {
            "r": "${resources}",
            "d": "$durationInSeconds",
            "n": "${description}",
            "t": "${resources} ",
        }
    )
    fields = message_fields(message(Description=None), DEFAULT_RULES)
    assert render(template, fields, escape=str, typed=True) == {
        "r": ["web-1", "web-2"],
        "d": -1,
        "n": None,
        "t": "web-1, web-2 ",
    }
    assert render(template, fields, escape=str, typed=False)["r"] == "web-1, web-2"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"a": {"b": ["${nope}"]}}, "does not have: ['nope']"),
        ("$", "invalid placeholder"),
        ("${event Id}", "invalid placeholder"),
        ({"a": {1, 2}}, "a set is not a JSON value"),
        (json.loads("[" * 20 + "]" * 20), "nested deeper than 16"),
    ],
)
def test_bad_templates_are_refused(value: Any, reason: str) -> None:
    with pytest.raises(TemplateError, match=reason.replace("[", r"\[").replace("(", r"\(")):
        compile_template(value)


def test_the_presets_own_templates_are_valid() -> None:
    for template in (SLACK_TEMPLATE, PAGERDUTY_TEMPLATE, GENERIC_TEMPLATE):
        assert template.identifiers <= set(FIELDS)


# --- attacks: what IMDS (or a forwarder claiming to be one) may put into text fields -------

hostile_text = st.text(
    alphabet=st.characters(codec="utf-8")
    | st.sampled_from(['"', "\\", "<", ">", "&", "$", "{", "}", "\n", "\ud800"]),
    max_size=300,
)
names = st.text(alphabet=string.ascii_letters + string.digits + "-_<>&|!@", min_size=1, max_size=30)
event_types = st.sampled_from(["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate", "<!here>"])
transitions = st.sampled_from(["Scheduled", "Updated", "Started", "Completed", "Cancelled"])


@settings(max_examples=examples(150), deadline=None)
@given(description=hostile_text, source=hostile_text, vms=st.lists(names, max_size=5))
def test_generic_json_keeps_its_structure_and_values(
    description: str, source: str, vms: list[str]
) -> None:
    template = compile_template(
        {"text": "on ${affected}: ${description}", "d": "${description}", "s": ["${eventSource}"]}
    )
    msg = message(Description=description, EventSource=source, Resources=vms)
    body = json.loads(
        json.dumps(build_body("generic", msg, message_fields(msg, DEFAULT_RULES), template))
    )
    clean = description.encode("utf-8", "replace").decode("utf-8")
    affected = ", ".join(vms) or "web-1"
    assert body == {
        "text": f"on {affected}: {clean}".encode("utf-8", "replace").decode("utf-8"),
        "d": clean,
        "s": [source.encode("utf-8", "replace").decode("utf-8")],
    }


@settings(max_examples=examples(150), deadline=None)
@given(description=hostile_text, vms=st.lists(names, max_size=5), kind=event_types)
def test_slack_text_never_carries_a_control_character_from_imds(
    description: str, vms: list[str], kind: str
) -> None:
    msg = message(Description=description, Resources=vms, EventType=kind)
    body = build_body(SLACK, msg, message_fields(msg, DEFAULT_RULES), SLACK_TEMPLATE)
    text = body["text"]
    # The default template has no control characters of its own, so none may appear at all.
    assert "<" not in text and ">" not in text
    assert "&" not in text.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "")
    clean = description.encode("utf-8", "replace").decode("utf-8")
    if clean and len(clean) <= SLACK_MAX_VALUE:
        assert clean in unescape_slack(text)


@given(st.text(max_size=SLACK_MAX_VALUE))
def test_slack_escaping_is_lossless(text: str) -> None:
    assert unescape_slack(slack_escape(text)) == text


@settings(max_examples=examples(200), deadline=None)
@given(
    transition=transitions,
    kind=event_types,
    duration=st.one_of(st.none(), st.integers(-5, 10**10)),
    description=hostile_text,
    vms=st.lists(names, max_size=300),
    event_id=st.one_of(st.uuids().map(str), st.text(min_size=1, max_size=400).filter(str.strip)),
)
def test_pagerduty_would_accept_every_body(
    transition: str,
    kind: str,
    duration: int | None,
    description: str,
    vms: list[str],
    event_id: str,
) -> None:
    status = "Started" if transition in ("Started", "Completed") else "Scheduled"
    msg = message(
        transition,
        EventId=event_id,
        EventType=kind,
        EventStatus=status,
        DurationInSeconds=duration,
        Description=description,
        Resources=vms,
    )
    fields = message_fields(msg, DEFAULT_RULES)
    body = build_body(PAGERDUTY, as_verified(msg), fields, PAGERDUTY_TEMPLATE, ROUTING_KEY)
    if isinstance(body, Skip):
        assert transition in ("Scheduled", "Updated", "Started") and not fields["impactful"]
        return
    assert pagerduty_errors(json.loads(json.dumps(body))) == []
    assert body["event_action"] == (
        "resolve" if transition in ("Completed", "Cancelled") else "trigger"
    )
    assert len(body["dedup_key"]) <= 255 and body["dedup_key"].startswith("sebridge:")
