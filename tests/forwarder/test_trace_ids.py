"""The forwarder carries and logs each event's trace (it exports no spans: it stays small).

Its transition lines and the lines about an approve command (the IMDS POST's above all) name
the event's trace (``trace_id``, ``span_id`` in the JSON log format), the one every message about
the event carries (sebridge/contract/tracecontext.py).
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sebridge.contract import tracecontext
from sebridge.contract.commands import approve_command
from sebridge.contract.events import Envelope, Observer
from sebridge.forwarder.approvals.handler import CommandHandler
from sebridge.forwarder.imds.client import ImdsClient
from sebridge.logs import JsonFormatter
from tests.support.forwarder_fakes import World, scheduled
from tests.support.imds_stub import ImdsStub

pytestmark = pytest.mark.timeout(60)


def test_a_transition_line_names_the_trace_its_message_carries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    event_id = str(uuid.uuid4()).upper()
    world = World()
    world.imds.set([scheduled(event_id)])
    with caplog.at_level(logging.INFO, logger="forwarder"):
        assert world.forwarder.tick() is None
        world.forwarder.send_pending()
    (sent,) = world.broker.transitions()
    carrier = {"traceparent": str(sent.application_properties["traceparent"])}
    context = TraceContextTextMapPropagator().extract(carrier)
    span = trace.get_current_span(context).get_span_context()
    assert span.is_valid
    trace_id = trace.format_trace_id(span.trace_id)
    assert trace_id == tracecontext.trace_id(event_id)
    (record,) = [r for r in caplog.records if getattr(r, "messageId", None) == sent.message_id]
    line = json.loads(JsonFormatter().format(record))
    assert line["trace_id"] == trace_id
    assert line["span_id"] == trace.format_span_id(span.span_id)


class _Sink:
    observer = Observer(vm_name="vm1")

    def __init__(self) -> None:
        self.enqueued: list[Envelope] = []

    def enqueue(self, envelope: Envelope) -> None:
        self.enqueued.append(envelope)

    def life_of(self, key: str) -> None:
        return None


def test_the_approval_post_is_logged_with_the_commands_trace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    event_id = str(uuid.uuid4())
    gate_span = tracecontext.TraceContext(tracecontext.trace_id(event_id), "00f067aa0ba902b7")
    command = approve_command(
        event_id, "approval-gate", "policy", datetime.now(UTC) + timedelta(minutes=5)
    )
    sink = _Sink()
    with ImdsStub() as imds, caplog.at_level(logging.INFO, logger="forwarder.approvals"):
        imds.set_events([scheduled(event_id)])
        handler = CommandHandler(sink, ImdsClient(imds.url))
        outcome = handler.handle(command.body_bytes(), command.message_id, gate_span)
        posts = imds.posts()
    assert outcome.action == "complete" and outcome.description == "approved"
    assert len(posts) == 1 and event_id in posts[0].body.decode()
    (line,) = [r for r in caplog.records if "approved" in r.getMessage()]
    assert vars(line)["trace_id"] == gate_span.trace_id
    assert vars(line)["span_id"] == gate_span.span_id
    # The Approved transition it publishes is in the same trace.
    (approved,) = sink.enqueued
    carried = tracecontext.from_properties(approved.application_properties)
    assert carried is not None and carried.trace_id == gate_span.trace_id
