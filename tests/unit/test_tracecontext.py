"""One trace per event: the W3C trace context every message about an event carries
(sebridge/contract/tracecontext.py), checked against OpenTelemetry's own propagator."""

from __future__ import annotations

import string
from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sebridge import servicebus
from sebridge.contract import tracecontext
from sebridge.contract.commands import approve_command
from sebridge.contract.events import Transition, event_message
from sebridge.imds import Document
from tests.fixtures import golden

# printf %s 8b95c271-2b77-4243-ad1a-585faa9cd908 | sha256sum | cut -c1-32 (the README's recipe)
GOLDEN_TRACE_ID = "21c4f74798af482d41e76a8393873ccd"
PROPAGATOR = TraceContextTextMapPropagator()


def extracted(traceparent: str) -> trace.SpanContext:
    """What OpenTelemetry reads from ``traceparent`` (invalid: INVALID_SPAN_CONTEXT)."""
    context = PROPAGATOR.extract({"traceparent": traceparent})
    return trace.get_current_span(context).get_span_context()


def test_the_trace_id_is_the_documented_digest_of_the_event_id_in_any_case() -> None:
    assert tracecontext.trace_id(golden.EVENT_ID) == GOLDEN_TRACE_ID
    assert tracecontext.trace_id(golden.EVENT_ID.lower()) == GOLDEN_TRACE_ID
    assert tracecontext.trace_id(f" {golden.EVENT_ID} ") == GOLDEN_TRACE_ID
    other = "0e7d4b6a-0000-4000-8000-000000000001"
    assert tracecontext.trace_id(other) != GOLDEN_TRACE_ID


def test_every_message_about_the_event_is_in_its_trace_and_parses_with_the_propagator() -> None:
    messages = golden.build()
    spans = set()
    for name, envelope in messages.items():
        props = envelope.application_properties
        if name == "heartbeat":  # not about an event: carries none
            assert tracecontext.TRACEPARENT not in props
            continue
        value = props[tracecontext.TRACEPARENT]
        assert isinstance(value, str)
        assert props[tracecontext.DIAGNOSTIC_ID] == value
        read = extracted(value)
        assert read.is_valid, (name, value)
        assert trace.format_trace_id(read.trace_id) == GOLDEN_TRACE_ID
        assert trace.format_span_id(read.span_id) == tracecontext.span_id(envelope.message_id)
        assert read.trace_flags.sampled
        spans.add(read.span_id)
    assert len(spans) == len(messages) - 1  # one span id per message


def test_a_replayed_message_carries_the_same_parent() -> None:
    event = Document.from_imds({"Events": [golden.SCHEDULED]}).events[0]
    first = event_message(Transition.SCHEDULED, event, golden.OBSERVER, 11, golden.OBSERVED_AT)
    later = golden.OBSERVED_AT + timedelta(seconds=30)  # another VM, later, another incarnation
    again = event_message(Transition.SCHEDULED, event, golden.OBSERVER, 12, later)
    assert first.application_properties == again.application_properties


def test_an_approve_command_carries_the_events_trace_back() -> None:
    command = approve_command(golden.EVENT_ID, "approval-gate", "policy", golden.OBSERVED_AT)
    sent = servicebus.command_message(command, "web-1")
    props = sent.application_properties or {}
    read = extracted(str(props["traceparent"]))
    assert trace.format_trace_id(read.trace_id) == GOLDEN_TRACE_ID
    assert props["Diagnostic-Id"] == props["traceparent"]
    # A sender with a span of its own (the gate's) makes the command its child.
    own = tracecontext.TraceContext(GOLDEN_TRACE_ID, "00f067aa0ba902b7")
    sent = servicebus.command_message(replace(command, trace=own), "web-1")
    assert (sent.application_properties or {})["traceparent"] == own.traceparent
    assert command.to_body() == replace(command, trace=own).to_body()  # not in the body


def test_properties_are_read_whether_keys_and_values_arrive_as_text_or_bytes() -> None:
    value = tracecontext.for_message(golden.EVENT_ID, "m").traceparent
    expected = tracecontext.parse(value)
    assert expected is not None
    assert tracecontext.from_properties({b"traceparent": value.encode()}) == expected
    assert tracecontext.from_properties({"Diagnostic-Id": value}) == expected
    assert tracecontext.from_properties({"traceparent": "junk", b"Diagnostic-Id": value}) == (
        expected
    )
    assert tracecontext.from_properties({"traceparent": "junk"}) is None
    assert tracecontext.from_properties(None) is None
    assert tracecontext.parse(b"\xff\xfe") is None


HEX = "0123456789abcdef"
_fields = st.tuples(
    st.sampled_from(["00", "01", "ff", "0g", "0", "000"]) | st.text(HEX, min_size=2, max_size=2),
    st.sampled_from(["0" * 32, GOLDEN_TRACE_ID, GOLDEN_TRACE_ID.upper(), GOLDEN_TRACE_ID[:31]])
    | st.text(HEX, min_size=32, max_size=32),
    st.sampled_from(["0" * 16, "00f067aa0ba902b7", "00F067AA0BA902B7"])
    | st.text(HEX, min_size=16, max_size=16),
    st.text(HEX, min_size=2, max_size=2) | st.sampled_from(["0", "1g", "001"]),
    st.sampled_from(["", "-", "-x", "-00", " ", "\t", "x"]),
    st.sampled_from(["", " ", "\t ", "  "]),
)
_ASCII = string.ascii_letters + string.digits + string.punctuation + " \t"


@given(_fields)
def test_parse_agrees_with_the_propagator_on_near_misses(
    parts: tuple[str, str, str, str, str, str],
) -> None:
    version, trace_id, span_id, flags, tail, pad = parts
    value = f"{pad}{version}-{trace_id}-{span_id}-{flags}{tail}{pad}"
    check(value)


@given(st.text(_ASCII, max_size=80))
def test_parse_agrees_with_the_propagator_on_any_text(value: str) -> None:
    check(value)


def check(value: str) -> None:
    ours = tracecontext.parse(value)
    theirs = extracted(value)
    assert (ours is not None) == theirs.is_valid, value
    if ours is not None:
        assert int(ours.trace_id, 16) == theirs.trace_id
        assert int(ours.span_id, 16) == theirs.span_id
        assert int(ours.flags, 16) == int(theirs.trace_flags)
