"""One trace per scheduled event through every workflow (OpenTelemetry; docs/monitoring.md).

The trace of an event is derived from its EventId (:mod:`sebridge.contract.tracecontext`), so the
forwarder, Event Grid ingestion and every workflow agree on it without coordination. Here:

- :func:`configure`, once at start: Azure Monitor's OpenTelemetry distribution exports spans
  to Application Insights when ``APPLICATIONINSIGHTS_CONNECTION_STRING`` is set; without it
  nothing is configured and every span below is OpenTelemetry's no-op (tests install an SDK
  ``TracerProvider`` with an in-memory exporter instead).
- :func:`invocation_span`: the span of one invocation, a child of the message's
  ``traceparent`` (the trigger layer opens it for every Service Bus function; Event Grid
  ingestion for each notification).
- :func:`client_span`: a call to a peer (every ARM request, functions/adapters/arm.py).
- :class:`TracingPublisher` and :class:`TracingCommands`: every message the app sends (Prepared,
  Held, the Event Grid transitions, approve commands) is sent in a span of its own whose context
  it carries (``traceparent`` and ``Diagnostic-Id``), so the next hop (a workflow, the
  forwarder's IMDS POST) is its child.

Whatever the message says, a span about an event stays in that event's trace: a ``traceparent``
from another trace (a foreign or forged one) becomes a link, not the parent. Heartbeats have no
event: their invocation starts a trace of its own. And only a verified message joins its event's
trace: the trigger layer verifies first, with the ARM calls' spans held back
(:func:`deferred`), then opens the invocation span (in the event's trace, or for a refused
message in a new trace of its own, ``sebridge.refused=true`` with the reason) and replays them
under it with their own times (hostile review of issue 23c, break 5).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from opentelemetry.util import types

from functions.shared.ports import CommandSender, TopicPublisher
from sebridge.contract import tracecontext
from sebridge.contract.commands import ApproveCommand
from sebridge.contract.events import Envelope
from sebridge.contract.tracecontext import TraceContext

log = logging.getLogger("sebridge.functions")

CONNECTION_SETTING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
AUTHENTICATION_SETTING = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
TRACER_NAME = "sebridge.functions"

_configured = False


def entra_client_id(authentication: str | None) -> tuple[bool, str | None]:
    """Whether ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` asks for an Entra token
    (``Authorization=AAD``) and for which user-assigned identity (``ClientId=...``; None: the
    system-assigned one). Application Insights with local auth disabled (infra/modules/
    monitoring.bicep) accepts nothing else; the Functions host reads the same setting."""
    fields: dict[str, str] = {}
    for part in (authentication or "").split(";"):
        name, _, value = part.partition("=")
        fields[name.strip().lower()] = value.strip()
    entra = fields.get("authorization", "").lower() == "aad"
    return entra, (fields.get("clientid") or None) if entra else None


def configure(environ: Mapping[str, str]) -> bool:
    """Export spans to Application Insights if ``APPLICATIONINSIGHTS_CONNECTION_STRING`` is set
    (once per process); True if this call configured it. With an Entra token (managed
    identity) when ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` says ``Authorization=AAD``.
    Logs stay with the Functions host's own pipeline (``disable_logging``): exported twice,
    every line would count twice in the queries of the README."""
    global _configured
    if _configured or not environ.get(CONNECTION_SETTING):
        return False
    from azure.monitor.opentelemetry import configure_azure_monitor

    options: dict[str, Any] = {"disable_logging": True}
    entra, client_id = entra_client_id(environ.get(AUTHENTICATION_SETTING))
    if entra:
        from azure.identity import ManagedIdentityCredential

        options["credential"] = ManagedIdentityCredential(client_id=client_id)
    configure_azure_monitor(**options)
    _configured = True
    log.info(
        "OpenTelemetry: exporting spans to Application Insights (%s)",
        "Entra token" if entra else "connection string only",
    )
    return True


def _tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def _remote(context: TraceContext) -> trace.SpanContext:
    return trace.SpanContext(
        trace_id=int(context.trace_id, 16),
        span_id=int(context.span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(context.flags, 16)),
    )


def _as_context(span_context: trace.SpanContext) -> TraceContext:
    return TraceContext(
        trace.format_trace_id(span_context.trace_id),
        trace.format_span_id(span_context.span_id),
        f"{int(span_context.trace_flags):02x}",
    )


def _parent(
    event_id: str | None, carried: TraceContext | None, fallback_span: str
) -> tuple[TraceContext | None, list[trace.Link]]:
    """The parent of a span about ``event_id`` given what a message carried: the carried
    context when it is in the event's trace; else the event's trace with a span named by
    ``fallback_span`` (and the carried context as a link). Without an event: what was carried."""
    if event_id is None:
        return carried, []
    expected = tracecontext.trace_id(event_id)
    if carried is not None and carried.trace_id == expected:
        return carried, []
    links = [trace.Link(_remote(carried))] if carried is not None else []
    return TraceContext(expected, tracecontext.span_id(fallback_span)), links


@contextmanager
def invocation_span(
    function: str,
    *,
    properties: Mapping[Any, Any] | None,
    event_id: str | None,
    message_id: str | None,
    attributes: Mapping[str, str | int] | None = None,
    refused: str | None = None,
    start_time: int | None = None,
) -> Iterator[trace.Span]:
    """The span of one invocation of ``function`` for a message (``properties``: its
    application properties) about ``event_id``. An exception is recorded and re-raised.
    ``refused``: why the message failed the seal or scope check; its span is then the root of a
    new trace (nothing it carries or names is trusted: it joins no event's trace), with
    ``sebridge.refused`` and ``sebridge.refusal``. ``start_time``: when the invocation began
    (ns since the epoch), if before the span opens (verification, :func:`deferred`)."""
    fields: dict[str, str | int] = {"faas.trigger": "pubsub", "sebridge.function": function}
    if message_id:
        fields["messaging.message.id"] = message_id
    links: list[trace.Link] = []
    if refused is not None:
        context = otel_context.Context()
        fields["sebridge.refused"] = "true"
        fields["sebridge.refusal"] = refused[:256]
        if event_id:
            fields["sebridge.claimed_event_id"] = event_id.strip().lower()[:64]
    else:
        carried = tracecontext.from_properties(properties)
        parent, links = _parent(event_id, carried, message_id or f"{function}:{event_id}")
        context = (
            trace.set_span_in_context(trace.NonRecordingSpan(_remote(parent)))
            if parent is not None
            else otel_context.Context()  # a root: not a child of whatever ran before
        )
        if event_id:
            fields["sebridge.event_id"] = event_id.strip().lower()
    fields.update(attributes or {})
    with _tracer().start_as_current_span(
        function,
        context=context,
        kind=trace.SpanKind.CONSUMER,
        attributes=fields,
        links=links,
        start_time=start_time,
    ) as span:
        yield span


@dataclass
class _Held:
    """A client span held back while its parent is not known yet (:func:`deferred`)."""

    name: str
    attributes: dict[str, types.AttributeValue]
    start: int
    end: int = 0
    error: BaseException | None = None


@dataclass
class Deferred:
    """The client spans held back by :func:`deferred`, and when it began."""

    started: int
    held: list[_Held] = field(default_factory=list)

    def replay(self) -> None:
        """Emit the held spans as children of the current span, with their own times."""
        for held in self.held:
            span = _tracer().start_span(
                held.name,
                kind=trace.SpanKind.CLIENT,
                attributes=held.attributes,
                start_time=held.start,
            )
            if held.error is not None:
                span.record_exception(held.error)
                span.set_status(
                    Status(StatusCode.ERROR, f"{type(held.error).__name__}: {held.error}")
                )
            span.end(end_time=held.end or held.start)
        self.held.clear()


_deferred: ContextVar[Deferred | None] = ContextVar("sebridge_deferred_spans", default=None)


@contextmanager
def deferred() -> Iterator[Deferred]:
    """Hold back the client spans started in this block (in this thread), to be replayed under
    a parent decided afterwards (:meth:`Deferred.replay`): the trigger layer verifies a message
    before it knows which trace its invocation belongs to."""
    pending = Deferred(time.time_ns())
    token = _deferred.set(pending)
    try:
        yield pending
    finally:
        _deferred.reset(token)


class _HeldSpan(trace.NonRecordingSpan):
    """What :func:`client_span` yields while spans are held back: its attributes are kept."""

    def __init__(self, held: _Held) -> None:
        super().__init__(trace.INVALID_SPAN_CONTEXT)
        self._held = held

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        self._held.attributes[key] = value


@contextmanager
def client_span(name: str, **attributes: str | int) -> Iterator[trace.Span]:
    """A call to a peer (ARM), a child of the current span (held back inside
    :func:`deferred`)."""
    pending = _deferred.get()
    if pending is not None:
        held = _Held(name, dict(attributes), time.time_ns())
        pending.held.append(held)
        try:
            yield _HeldSpan(held)
        except BaseException as exc:
            held.error = exc
            raise
        finally:
            held.end = time.time_ns()
        return
    with _tracer().start_as_current_span(
        name, kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield span


@contextmanager
def _send_span(name: str, own: TraceContext, attributes: dict[str, str]) -> Iterator[TraceContext]:
    """A PRODUCER span for one message whose event trace is ``own``'s: a child of the current
    span if that is in the same trace (the usual case), else of ``own`` (a message sent from
    another event's invocation, as batched sends are). Yields the context the message carries."""
    current = trace.get_current_span().get_span_context()
    same_trace = current.is_valid and trace.format_trace_id(current.trace_id) == own.trace_id
    context = (
        None if same_trace else trace.set_span_in_context(trace.NonRecordingSpan(_remote(own)))
    )
    with _tracer().start_as_current_span(
        name, context=context, kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        sent = span.get_span_context()
        yield _as_context(sent) if sent.is_valid else own


class TracingPublisher:
    """Publishes each message in a span of its own and makes the message carry it."""

    def __init__(self, inner: TopicPublisher) -> None:
        self.inner = inner

    def publish(self, envelope: Envelope) -> None:
        own = tracecontext.from_properties(envelope.application_properties)
        if own is None:  # a Heartbeat (the app sends none): nothing to carry
            self.inner.publish(envelope)
            return
        attributes = {
            "messaging.message.id": envelope.message_id,
            "sebridge.transition": envelope.subject,
        }
        with _send_span(f"publish {envelope.subject}", own, attributes) as sent:
            properties = {**envelope.application_properties, **sent.properties()}
            self.inner.publish(replace(envelope, application_properties=properties))


class TracingCommands:
    """Sends each approve command in a span of its own; the forwarder logs it with the POST."""

    def __init__(self, inner: CommandSender) -> None:
        self.inner = inner

    def send(self, command: ApproveCommand, session_id: str) -> None:
        attributes = {"messaging.message.id": command.message_id, "sebridge.vm": session_id}
        own = for_event = tracecontext.for_message(command.event_id, command.message_id)
        if command.trace is not None and command.trace.trace_id == for_event.trace_id:
            own = command.trace
        with _send_span("send approve", own, attributes) as sent:
            self.inner.send(replace(command, trace=sent), session_id)
