"""Spans in memory: the OpenTelemetry SDK with an in-memory exporter, as the Function App's
tracing sees it locally (no APPLICATIONINSIGHTS_CONNECTION_STRING: nothing is exported)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_lock = threading.Lock()
_installed = False


def exporter() -> InMemorySpanExporter:
    """The process's exporter (OpenTelemetry takes one global tracer provider per process)."""
    global _installed
    with _lock:
        if not _installed:
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
            trace.set_tracer_provider(provider)
            _installed = True
    return _EXPORTER


def collected() -> Iterator[InMemorySpanExporter]:
    """The body of a test module's ``spans`` fixture: the spans its test finished."""
    found = exporter()
    found.clear()
    yield found
    found.clear()
