"""``--metrics-port``: ``/metrics`` (Prometheus text format) and ``/healthz``, off by default.

The metrics are prometheus-client objects in a registry of their own. Every label set is a
fixed enum (poll results, transition types, publish results, command outcomes): no EventId,
no VM name. The idle path costs one counter increment and one histogram observation per poll;
the gauges (outbox depth, set aside, last poll and send times, health) are read from
:class:`~sebridge.forwarder.observability.observations.Observations` when scraped, not kept
up to date.

``/healthz`` answers 200 ``{"status": "ok"}`` while
:func:`~sebridge.forwarder.observability.observations.assess` finds nothing wrong, else 503
``{"status": "unhealthy", "reasons": [...]}``.

The server binds ``--metrics-address`` (default 127.0.0.1); any other address is allowed and
logged at WARNING (the endpoints have no authentication). It is bound before the loop starts,
so a port in use stops the start with a clear message (exit 2).
"""

from __future__ import annotations

import json
import logging
import math
import platform
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from sebridge import __version__
from sebridge.contract.events import Transition
from sebridge.forwarder.imds.impact import METHODS
from sebridge.forwarder.net.server import ERROR_REASONS, HttpServer, Request, Response
from sebridge.forwarder.observability.errors import MetricsError
from sebridge.forwarder.observability.health import Health
from sebridge.forwarder.observability.observations import (
    COMMAND_OUTCOMES,
    POLL_RESULTS,
    PUBLISH_RESULTS,
    Observations,
)
from sebridge.values import is_loopback

if TYPE_CHECKING:
    from sebridge.forwarder.local.drain_probe import DrainProbe
    from sebridge.forwarder.local.worker import HookWorker

log = logging.getLogger("forwarder.metrics")

PREFIX = "sebridge_forwarder"
# IMDS answers in a few milliseconds; the first call can take up to 2 minutes.
IMDS_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 125.0)
# The forwarder's own transitions (Approved is counted with the approval commands).
POLLED_TRANSITIONS = tuple(
    t.value
    for t in (
        Transition.SCHEDULED,
        Transition.UPDATED,
        Transition.STARTED,
        Transition.COMPLETED,
        Transition.CANCELLED,
    )
)
# How a hook run can end (hook_runner.Outcome, and "skipped": a prepare hook whose event had
# started or ended before its turn); every hook has a series for each from the start.
HOOK_OUTCOMES = ("succeeded", "failed", "timed-out", "not-started", "interrupted", "skipped")
# The forwarder's HTTP servers, each with a series for every error reason from the start.
HTTP_SERVERS = ("metrics", "drain-probe")
# Measured impact (forwarder/imds/impact.py): a freeze lasts seconds, a reboot minutes.
IMPACT_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


def _seconds(moment: Any) -> float:
    return float(moment.timestamp()) if moment is not None else math.nan


class Metrics:
    """The forwarder's metrics; a LoopListener and a watcher of IMDS reads, publish attempts
    and approval commands (see :mod:`sebridge.forwarder.observability.observed`)."""

    def __init__(self, observations: Observations) -> None:
        self.observations = observations
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: half the exposition, no use here
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        polls = Counter(f"{PREFIX}_polls", "IMDS polls by result", ["result"], registry=r)
        self._polls = {result: polls.labels(result) for result in POLL_RESULTS}
        self._imds_seconds = Histogram(
            f"{PREFIX}_imds_request_seconds",
            "Duration of the poller's scheduled events reads (every result)",
            buckets=IMDS_BUCKETS,
            registry=r,
        )
        transitions = Counter(
            f"{PREFIX}_transitions",
            "Lifecycle transitions derived from IMDS documents, by type",
            ["transition"],
            registry=r,
        )
        self._transitions = {t: transitions.labels(t) for t in POLLED_TRANSITIONS}
        impact = Histogram(
            f"{PREFIX}_measured_impact_seconds",
            "Measured impact carried by Completed transitions of this VM's events, by method",
            ["method"],
            buckets=IMPACT_BUCKETS,
            registry=r,
        )
        self._impact = {method: impact.labels(method) for method in METHODS}
        attempts = Counter(
            f"{PREFIX}_publish_attempts",
            "Service Bus send calls by result (ok, refused: set aside, failed: retried)",
            ["result"],
            registry=r,
        )
        self._attempts = {result: attempts.labels(result) for result in PUBLISH_RESULTS}
        self._sent = Counter(f"{PREFIX}_messages_sent", "Messages Service Bus accepted", registry=r)
        commands = Counter(
            f"{PREFIX}_approval_commands",
            "Approval commands settled, by outcome",
            ["outcome"],
            registry=r,
        )
        self._commands = {outcome: commands.labels(outcome) for outcome in COMMAND_OUTCOMES}

        def health() -> Health:
            return observations.health

        Gauge(f"{PREFIX}_outbox_depth", "Messages waiting in the outbox", registry=r).set_function(
            lambda: _depth(health())
        )
        Gauge(
            f"{PREFIX}_messages_set_aside",
            "Messages set aside (kept in the outbox's aside table, never sent)",
            registry=r,
        ).set_function(lambda: float(health().set_aside))
        Gauge(
            f"{PREFIX}_last_successful_poll_timestamp_seconds",
            "Unix time of the last successful IMDS poll",
            registry=r,
        ).set_function(lambda: _seconds(health().last_successful_poll))
        Gauge(
            f"{PREFIX}_last_successful_send_timestamp_seconds",
            "Unix time of the last send Service Bus accepted",
            registry=r,
        ).set_function(lambda: _seconds(observations.last_successful_send))
        Gauge(f"{PREFIX}_healthy", "1 while /healthz answers 200, else 0", registry=r).set_function(
            lambda: 0.0 if observations.assess() else 1.0
        )
        Info(f"{PREFIX}_build", "The forwarder's version", registry=r).info(
            {"version": __version__, "python": platform.python_version()}
        )
        self._http_errors = _HttpErrors()
        r.register(self._http_errors)

    def watch_http(self, server: str, errors: Callable[[], dict[str, int]]) -> None:
        """Count ``server``'s errors (one of :data:`HTTP_SERVERS`), read when scraped."""
        self._http_errors.sources[server] = errors

    def watch_local(self, hooks: HookWorker | None, probe: DrainProbe | None) -> None:
        """The local actions' metrics (``--hooks-file``, ``--drain-probe-port``), read when
        scraped: hook runs by hook and outcome (hook names come from the hooks file, a fixed
        set), hooks queued or running, and whether the drain probe answers 503."""
        r = self.registry
        if hooks is not None:
            r.register(_HookRuns(hooks))
            Gauge(
                f"{PREFIX}_hooks_pending",
                "Hook runs queued or running",
                registry=r,
            ).set_function(lambda: float(hooks.pending()))
        if probe is not None:
            Gauge(
                f"{PREFIX}_drain_probe_draining",
                "1 while the drain probe answers 503 for an impactful event, else 0",
                registry=r,
            ).set_function(lambda: 1.0 if probe.draining else 0.0)
            r.register(_ProbeAnswers(probe))
            self.watch_http("drain-probe", probe.http_errors)

    # -- LoopListener -----------------------------------------------------------------------
    def transitions_recorded(self, envelopes: Any) -> None:
        for envelope in envelopes:
            counter = self._transitions.get(envelope.subject)
            if counter is not None:
                counter.inc()
            impact = envelope.body.get("data", {}).get("impact")
            if envelope.subject == "Completed" and isinstance(impact, dict):
                histogram = self._impact.get(str(impact.get("method")))
                seconds = impact.get("measuredSeconds")
                if histogram is not None and isinstance(seconds, int | float):
                    histogram.observe(float(seconds))

    def polled(self, health: Health) -> None:
        return None

    # -- watchers ---------------------------------------------------------------------------
    def imds_read(self, seconds: float, result: str) -> None:
        self._imds_seconds.observe(seconds)
        counter = self._polls.get(result)
        if counter is not None:
            counter.inc()

    def publish_attempt(self, result: str, count: int) -> None:
        counter = self._attempts.get(result)
        if counter is not None:
            counter.inc()
        if count:
            self._sent.inc(count)

    def command_settled(self, message_id: str | None, action: str, reason: str) -> None:
        counter = self._commands.get(action)
        if counter is not None:
            counter.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _HookRuns(Collector):
    def __init__(self, hooks: HookWorker) -> None:
        self.hooks = hooks
        self.names = [hook.name for hook in hooks.hooks.hooks]

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            f"{PREFIX}_hook_runs",
            "Hook runs ended, by hook and outcome",
            labels=["hook", "outcome"],
        )
        counts = self.hooks.outcome_counts()
        names = self.names + sorted({hook for hook, _ in counts} - set(self.names))
        for name in names:
            for outcome in HOOK_OUTCOMES:
                family.add_metric([name, outcome], float(counts.get((name, outcome), 0)))
        yield family


class _ProbeAnswers(Collector):
    def __init__(self, probe: DrainProbe) -> None:
        self.probe = probe

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            f"{PREFIX}_drain_probe_answers", "Drain probe answers, by status", labels=["status"]
        )
        for status, count in sorted(self.probe.answer_counts().items()):
            family.add_metric([str(status)], float(count))
        yield family


class _HttpErrors(Collector):
    def __init__(self) -> None:
        self.sources: dict[str, Callable[[], dict[str, int]]] = {}

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            f"{PREFIX}_http_errors",
            "Errors of the forwarder's HTTP servers (slow, idle, evicted or resetting clients, "
            "requests that are not HTTP, answers not computed in time), by server and reason",
            labels=["server", "reason"],
        )
        for server in HTTP_SERVERS:
            source = self.sources.get(server)
            if source is None:
                continue
            counts = source()
            for reason in ERROR_REASONS:
                family.add_metric([server, reason], float(counts.get(reason, 0)))
        yield family


def _depth(health: Health) -> float:
    return math.nan if health.outbox_depth is None else float(health.outbox_depth)


class MetricsServer:
    """``/metrics`` and ``/healthz`` on one loopback port (see the module)."""

    def __init__(self, metrics: Metrics, address: str, port: int) -> None:
        self.metrics = metrics
        if not is_loopback(address):
            log.warning(
                "metrics endpoint on %s: not a loopback address, reachable from the network "
                "without authentication",
                address,
            )
        try:
            self.server = HttpServer("metrics", address, port, self._handle, logger=log)
        except (OSError, ValueError) as exc:
            raise MetricsError(
                f"metrics endpoint cannot listen on {address}:{port}: {exc}"
            ) from exc
        self.address = self.server.address
        metrics.watch_http("metrics", self.server.error_counts)

    def healthz(self) -> tuple[int, bytes]:
        reasons = self.metrics.observations.assess()
        body: dict[str, Any] = {"status": "unhealthy" if reasons else "ok"}
        if reasons:
            body["reasons"] = reasons
        return (503 if reasons else 200), json.dumps(body).encode("utf-8")

    def _handle(self, request: Request) -> Response:
        if request.path == "/metrics":
            return Response(200, self.metrics.exposition(), CONTENT_TYPE_LATEST)
        if request.path == "/healthz":
            status, body = self.healthz()
            return Response(status, body, "application/json")
        return Response(404, b"not found\n")

    def serve(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set (a worker of :meth:`Forwarder.run`)."""
        self.server.serve(stop)

    def close(self) -> None:
        self.server.close()
