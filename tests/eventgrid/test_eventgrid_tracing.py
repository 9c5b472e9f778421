"""The same event through Event Grid is in the same trace as through a forwarder: the trace id
is derived from the EventId by both (sebridge/contract/tracecontext.py), with no coordination.
Spans read with OpenTelemetry's in-memory exporter."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from emulators.fakes.blob_etags import FakeConditionalBlobStorage
from emulators.functions_host.eventgrid import to_function_event
from functions.shared.invocations import INVOCATION_PREFIX, LOGGER_NAME
from sebridge.contract import tracecontext
from tests.eventgrid.conftest import STATE_CONTAINER
from tests.eventgrid.support import event_json
from tests.fixtures import golden
from tests.functions.support import App
from tests.support.tracing import collected

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from collected()


@pytest.fixture
def ingest_app(make_app: Callable[..., App], state_storage: FakeConditionalBlobStorage) -> App:
    return make_app(
        EVENTGRID_INGEST_ENABLED="true",
        EVENTGRID_STATE_URL=state_storage.container_url(STATE_CONTAINER),
    )


def test_an_event_seen_through_event_grid_is_in_the_forwarders_trace(
    ingest_app: App, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    forwarder = tracecontext.from_properties(golden.build()["scheduled"].application_properties)
    assert forwarder is not None
    ingest_app.call(
        "eventgrid_ingest", to_function_event(event_json("Scheduled"), "eventgrid_ingest")
    )
    (published,) = ingest_app.publisher.published
    assert published.message_id == golden.build()["scheduled"].message_id  # one message

    found = list(spans.get_finished_spans())
    assert {trace.format_trace_id(s.context.trace_id) for s in found if s.context} == {
        forwarder.trace_id
    }
    (ingest,) = [s for s in found if s.kind is SpanKind.CONSUMER]
    assert ingest.name == "eventgrid_ingest" and ingest.context is not None
    (publish,) = [s for s in found if s.name == "publish Scheduled"]
    assert publish.parent is not None and publish.parent.span_id == ingest.context.span_id
    # The message it publishes carries the publish span: a workflow is its child.
    sent = tracecontext.from_properties(published.application_properties)
    assert sent is not None and publish.context is not None
    assert sent.trace_id == forwarder.trace_id
    assert sent.span_id == trace.format_span_id(publish.context.span_id)

    # The invocation line names the trace: from the logs to the spans.
    (line,) = [
        json.loads(r.getMessage().removeprefix(INVOCATION_PREFIX))
        for r in caplog.records
        if r.name == LOGGER_NAME
    ]
    assert line["function"] == "eventgrid_ingest" and line["traceId"] == forwarder.trace_id

    ingest_app.deliver("lb_pools", published)
    (drained,) = [s for s in spans.get_finished_spans() if s.name == "lb_pools"]
    assert drained.context is not None and drained.parent is not None
    assert trace.format_trace_id(drained.context.trace_id) == forwarder.trace_id
    assert drained.parent.span_id == publish.context.span_id


def test_a_notification_that_cannot_be_read_starts_a_trace_of_its_own(
    ingest_app: App, spans: InMemorySpanExporter
) -> None:
    body = event_json("Scheduled")
    body["data"]["resourceInfo"].pop("id")  # no event to derive a trace from
    ingest_app.call("eventgrid_ingest", to_function_event(body, "eventgrid_ingest"))
    assert not ingest_app.publisher.published
    (ingest,) = spans.get_finished_spans()
    assert ingest.name == "eventgrid_ingest" and ingest.context is not None
    assert trace.format_trace_id(ingest.context.trace_id) != tracecontext.trace_id(golden.EVENT_ID)
