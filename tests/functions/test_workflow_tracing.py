"""One trace per event through the workflows: spans read with OpenTelemetry's in-memory
exporter (functions/shared/tracing.py).

The event's message is the one the forwarder puts on the topic (the golden Scheduled): its
``traceparent`` names the event's trace. lb-pools drains through the real ARM adapter against
the loopback ARM fake and publishes Prepared; the gate reads ARM and sends the approve command:
every span is in the forwarder's trace, each a child of the one before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from emulators.fakes.arm import FakeArm
from functions.adapters.retry import TransientHttpError
from functions.shared import tracing
from sebridge import servicebus
from sebridge.contract import tracecontext
from sebridge.contract.events import Envelope
from tests.fixtures import golden
from tests.functions.support import SUB, App, envelope, sb_message, web_vm
from tests.support.tracing import collected

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from collected()


@pytest.fixture
def world(arm_fake: FakeArm) -> dict[str, str]:
    lb = arm_fake.add_load_balancer(SUB, "rg-web", "lb-web", ["pool-a"])
    pool = f"{lb}/backendAddressPools/pool-a"
    web_vm(arm_fake, "web-3", [pool])  # a spare member: draining web-1 and web-2 leaves one
    return {"web-1": web_vm(arm_fake, "web-1", [pool]), "web-2": web_vm(arm_fake, "web-2", [pool])}


def carried(envelope: Envelope) -> tracecontext.TraceContext:
    found = tracecontext.from_properties(envelope.application_properties)
    assert found is not None
    return found


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return trace.format_span_id(span.context.span_id)


def parent_id(span: ReadableSpan) -> str | None:
    return trace.format_span_id(span.parent.span_id) if span.parent else None


def one(found: list[ReadableSpan], name: str) -> ReadableSpan:
    (span,) = [s for s in found if s.name == name]
    return span


def test_one_event_through_lb_pools_and_the_gate_is_one_trace(
    app: App, world: dict[str, str], spans: InMemorySpanExporter
) -> None:
    scheduled = golden.build()["scheduled"]  # as the forwarder sent it
    sent = carried(scheduled)
    app.deliver("approval_gate", scheduled)  # still in pools: waits
    app.deliver("lb_pools", scheduled)  # drains, publishes Prepared
    (prepared,) = app.publisher.published
    app.deliver("approval_gate", prepared)  # approves
    ((command, session),) = app.commands.sent

    found = list(spans.get_finished_spans())
    assert {trace.format_trace_id(s.context.trace_id) for s in found if s.context} == {
        sent.trace_id
    }
    invocations = [s for s in found if s.kind is SpanKind.CONSUMER]
    assert [s.name for s in invocations] == ["approval_gate", "lb_pools", "approval_gate"]
    waited, drained, approved = invocations
    assert parent_id(waited) == parent_id(drained) == sent.span_id  # the forwarder's message
    assert drained.attributes is not None
    assert drained.attributes["messaging.message.id"] == scheduled.message_id

    # Every ARM call is a span of the invocation that made it; the drain wrote the NICs.
    arm = [s for s in found if s.name.startswith("ARM ")]
    assert {parent_id(s) for s in arm} <= {span_id(s) for s in invocations}
    writes = [s for s in arm if s.attributes and s.attributes["http.request.method"] == "PUT"]
    assert writes and {parent_id(s) for s in writes} == {span_id(drained)}
    assert all(s.kind is SpanKind.CLIENT for s in arm)

    # Prepared is sent in a span of lb-pools' invocation and carries it to the gate.
    publish = one(found, "publish Prepared")
    assert parent_id(publish) == span_id(drained)
    assert carried(prepared).span_id == span_id(publish)
    assert parent_id(approved) == span_id(publish)

    # The approve command: a span of the gate's invocation, carried to the forwarder.
    send = one(found, "send approve")
    assert parent_id(send) == span_id(approved) and send.kind is SpanKind.PRODUCER
    assert command.trace is not None and command.trace.span_id == span_id(send)
    wire = servicebus.command_message(command, session).application_properties or {}
    assert wire["traceparent"] == wire["Diagnostic-Id"] == command.trace.traceparent


def with_properties(envelope: Envelope, **properties: str) -> Envelope:
    return replace(
        envelope, application_properties={**envelope.application_properties, **properties}
    )


@pytest.mark.parametrize(
    "value",
    [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # another trace
        "not a traceparent",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    ],
)
def test_a_message_cannot_move_an_event_out_of_its_trace(
    app: App, world: dict[str, str], spans: InMemorySpanExporter, value: str
) -> None:
    """A foreign or broken traceparent (and Diagnostic-Id) does not split the event's trace:
    the invocation stays in it, a child of the message's own span, and links the foreign one."""
    scheduled = golden.build()["scheduled"]
    app.deliver(
        "approval_gate", with_properties(scheduled, traceparent=value, **{"Diagnostic-Id": value})
    )
    invocation = one(list(spans.get_finished_spans()), "approval_gate")
    assert invocation.context is not None
    assert trace.format_trace_id(invocation.context.trace_id) == tracecontext.trace_id(
        golden.EVENT_ID
    )
    assert parent_id(invocation) == tracecontext.span_id(scheduled.message_id)
    foreign = tracecontext.parse(value)
    links = [trace.format_trace_id(link.context.trace_id) for link in invocation.links]
    assert links == ([foreign.trace_id] if foreign else [])


def test_a_message_from_before_trace_context_joins_the_events_trace(
    app: App, world: dict[str, str], spans: InMemorySpanExporter
) -> None:
    """A forwarder of an earlier version sends no traceparent: the same trace all the same."""
    scheduled = golden.build()["scheduled"]
    props = {
        k: v
        for k, v in scheduled.application_properties.items()
        if k not in (tracecontext.TRACEPARENT, tracecontext.DIAGNOSTIC_ID)
    }
    app.deliver("lb_pools", replace(scheduled, application_properties=props))
    found = list(spans.get_finished_spans())
    assert found and {trace.format_trace_id(s.context.trace_id) for s in found if s.context} == {
        tracecontext.trace_id(golden.EVENT_ID)
    }


def test_a_failed_invocation_is_an_error_span(
    app: App, arm_fake: FakeArm, world: dict[str, str], spans: InMemorySpanExporter
) -> None:
    """An invocation that raises (Service Bus redelivers) ends as an error span; so does the
    ARM call that gave up."""
    arm_fake.fail(503, times=10, method="PUT", retry_after="0")
    with pytest.raises(TransientHttpError):
        app.deliver("lb_pools", golden.build()["scheduled"])
    found = list(spans.get_finished_spans())
    assert one(found, "lb_pools").status.status_code is StatusCode.ERROR
    assert one(found, "ARM put NIC").status.status_code is StatusCode.ERROR


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("Authorization=AAD", (True, None)),  # the Bicep's: the system-assigned identity
        ("Authorization=AAD;ClientId=1b2c", (True, "1b2c")),
        (" authorization = aad ; clientid = 1b2c ", (True, "1b2c")),
        ("", (False, None)),
        (None, (False, None)),
        ("ClientId=1b2c", (False, None)),
    ],
)
def test_the_exporter_signs_in_as_the_authentication_string_says(
    setting: str | None, expected: tuple[bool, str | None]
) -> None:
    assert tracing.entra_client_id(setting) == expected


def test_nothing_is_configured_without_a_connection_string() -> None:
    assert tracing.configure({}) is False
    assert tracing.configure(
        {"APPLICATIONINSIGHTS_AUTHENTICATION_STRING": "Authorization=AAD"}
    ) is (False)


def test_a_refused_message_never_joins_the_events_trace(
    app: App, world: dict[str, str], spans: InMemorySpanExporter
) -> None:
    """Hostile review of issue 23c, break 5: ghost-1 (no such VM) sends a Cancelled with a real
    event's EventId (and so that event's traceparent). Refused by the scope check, its
    invocations (and their ARM reads) landed in the event's trace, as children of its span. Now
    each refused invocation is the root of a trace of its own, says so and why, and its ARM
    reads are its children."""
    from tests.functions.test_workflow_webhooks_trust import GHOST

    forged = envelope("Cancelled", GHOST, EventType="Reboot")
    assert carried(forged).trace_id == tracecontext.trace_id(golden.EVENT_ID)
    for function in ("lb_pools", "approval_gate"):
        app.deliver(function, forged)
    found = list(spans.get_finished_spans())
    victim = tracecontext.trace_id(golden.EVENT_ID)
    inside = [
        s.name for s in found if s.context and trace.format_trace_id(s.context.trace_id) == victim
    ]
    assert not inside, f"spans of a refused message in the event's trace: {inside}"
    invocations = [s for s in found if s.kind is SpanKind.CONSUMER]
    assert [s.name for s in invocations] == ["lb_pools", "approval_gate"]
    for invocation in invocations:
        assert invocation.parent is None and not invocation.links
        assert invocation.attributes is not None
        assert invocation.attributes["sebridge.refused"] == "true"
        assert "ghost-1" in str(invocation.attributes["sebridge.refusal"])
        assert "sebridge.event_id" not in invocation.attributes
    reads = [s for s in found if s.name.startswith("ARM ")]
    assert reads and {parent_id(s) for s in reads} <= {span_id(s) for s in invocations}
    assert {s.context.trace_id for s in reads if s.context} <= {
        s.context.trace_id for s in invocations if s.context
    }


@pytest.mark.parametrize("body", [b"not json at all", b'{"specversion":"1.0"}', b"[]"])
def test_a_message_that_breaks_the_contract_never_joins_the_events_trace(
    app: App, world: dict[str, str], spans: InMemorySpanExporter, body: bytes
) -> None:
    """Hostile review 29, break 1: a body the contract reader refuses, sent with a real event's
    traceparent (its trace id is the EventId's digest: anyone can work it out), put its
    invocation spans into that event's trace, unmarked. A contract break proves nothing about
    the event it claims: its span is the root of a trace of its own, marked refused."""
    forged = envelope("Cancelled", EventType="Reboot")
    victim = tracecontext.trace_id(golden.EVENT_ID)
    assert carried(forged).trace_id == victim
    for function in ("lb_pools", "approval_gate"):
        app.call(function, sb_message(forged, body=body))
    found = list(spans.get_finished_spans())
    inside = [
        s.name for s in found if s.context and trace.format_trace_id(s.context.trace_id) == victim
    ]
    assert not inside, f"spans of a contract-breaking message in the event's trace: {inside}"
    invocations = [s for s in found if s.kind is SpanKind.CONSUMER]
    assert [s.name for s in invocations] == ["lb_pools", "approval_gate"]
    for invocation in invocations:
        assert invocation.parent is None and invocation.attributes is not None
        assert invocation.attributes["sebridge.refused"] == "true"
        assert invocation.attributes["sebridge.refusal"] == "breaks contract v1"
