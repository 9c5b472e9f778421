"""The drain probe (``--drain-probe-port``): an HTTP health endpoint for the load balancer that
turns unhealthy while an impactful event of this VM is on, so the balancer drains the VM
itself, with no ARM write and whatever the VM belongs to (a Uniform or Flexible scale set, a
standalone VM; Azure Load Balancer, Application Gateway, anything that probes over HTTP).

- ``200`` normally; with ``--drain-probe-upstream URL`` the application's own health check is
  asked instead (any 2xx or 3xx is healthy; anything else, a timeout or a refused connection
  is ``503``), so this endpoint can replace an existing probe.
- ``503`` while the current IMDS document holds an event that affects this VM and is
  impactful by lb-pools' rules (:mod:`sebridge.impact`: ``--drain-impactful-event-types``,
  ``--drain-freeze-threshold-seconds``), from the event's drain moment (``NotBefore`` minus
  its ``--drain-lead``, at first sight for short notices, Preempt and Terminate:
  :mod:`sebridge.timing`; the local actions say when, :meth:`DrainProbe.follow`) until it is
  gone; an Updated that makes the event harmless, or drops this VM from its Resources, ends
  the drain early. The probe follows the document, not the transitions the forwarder manages to
  record, so a full disk or a broker outage never keeps it healthy; after a restart it drains
  from the local actions' journal until the first poll.
- **Bounded** for events that have not started: a run of 503 lasts at most
  ``--drain-probe-max-unhealthy-seconds`` (below the 10 minutes of the shortest grace period
  of a scale set's automatic instance repairs, which may watch the same probe), and begins no
  earlier than ``NotBefore`` minus that bound. A run that reaches the bound ends: the probe
  answers 200 for the drains that began in it until their event starts
  (:class:`sebridge.timing.UnhealthyRuns`). A Started event drains regardless.
- ``--drain-seconds`` after the run of 503 began (probe interval x unhealthy threshold + the
  connection drain time: the balancer has stopped sending new connections and the open ones
  had their time), the drain counts as done, and :class:`~sebridge.forwarder.local.preparation.
  Preparations` publishes ``Prepared`` once the other preparations are done too (a drain that
  reached the bound is not done: the VM takes traffic again).

The port answers the health status and nothing else: every GET or HEAD, whatever its path,
gets ``ok`` or ``unavailable`` (the same word while draining and while the upstream is down),
never an event detail. It binds ``--drain-probe-address`` (default ``0.0.0.0``: the load
balancer probes the VM's own address from 168.63.129.16; let only that source in, e.g. an NSG
rule for the ``AzureLoadBalancer`` service tag). At most :data:`MAX_CONNECTIONS` requests are
served at once and each has :data:`REQUEST_TIMEOUT` seconds, so a slow or hostile client
cannot hold it.

The state follows the document on the poller's thread as soon as a poll has read it, before
anything is written, and the answer is worked out from the clock when asked, so it changes
within one poll interval of IMDS, and at the drain moment itself
(``benchmarks/drain_probe_flip.py``).
"""

from __future__ import annotations

import http.client
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from sebridge.contract.events import Observer
from sebridge.forwarder.local.hooks_file import affects
from sebridge.forwarder.local.preparation import Preparations
from sebridge.forwarder.net.server import BoundedHTTPServer
from sebridge.imds import ScheduledEvent, isoformat_utc
from sebridge.impact import ImpactRules
from sebridge.timing import DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS, UnhealthyRuns, check_probe_bound

log = logging.getLogger("forwarder.drain-probe")

MAX_CONNECTIONS = 8  # a load balancer probes once per interval; the forwarder has a TasksMax
REQUEST_TIMEOUT = 5.0  # seconds a client has to send its request
UPSTREAM_TIMEOUT = 3.0  # seconds the application's health check has to answer
HEALTHY = (200, b"ok\n")
UNHEALTHY = (503, b"unavailable\n")


class ProbeError(ValueError):
    """A drain-probe setting is wrong, or its port cannot be bound."""


def check_upstream(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProbeError(f"--drain-probe-upstream must be an http(s) URL, not {url!r}")
    if parts.username or parts.password:
        raise ProbeError("--drain-probe-upstream must not carry credentials")
    return url


def upstream_healthy(url: str, timeout: float = UPSTREAM_TIMEOUT) -> bool:
    """GET the application's health check: 2xx and 3xx are healthy (redirects not followed),
    anything else, a timeout or an error is not."""
    parts = urlsplit(url)
    connection_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    connection = connection_type(parts.hostname or "", parts.port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"User-Agent": "sebridge-drain-probe"})
        response = connection.getresponse()
        response.read(64 * 1024)
        return 200 <= response.status < 400
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Drain:
    event_id: str
    begins: datetime  # when its 503 begins; fixed once it has begun
    started: bool = False  # the event has started: drained regardless of the bound
    reported: bool = False  # drained, and told to the preparations


class DrainProbe:
    name = "drain-probe"

    def __init__(
        self,
        rules: ImpactRules,
        drain_seconds: float,
        *,
        preparations: Preparations | None = None,
        upstream: str | None = None,
        upstream_timeout: float = UPSTREAM_TIMEOUT,
        max_unhealthy: float = DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS,
        now: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.rules = rules
        self.drain_seconds = drain_seconds
        self.preparations = preparations
        self.upstream = check_upstream(upstream) if upstream else None
        self.upstream_timeout = upstream_timeout
        self.max_unhealthy = check_probe_bound(max_unhealthy)
        self.now = now
        self._runs = UnhealthyRuns(timedelta(seconds=max_unhealthy))
        self._drains: dict[str, _Drain] = {}
        self._cond = threading.Condition()
        self._server: _Server | None = None
        self._unhealthy = False  # the level last logged
        self._lapsed: set[str] = set()  # drains logged as having reached the bound
        self.answers = {200: 0, 503: 0}

    @property
    def bound(self) -> timedelta:
        return self._runs.bound

    # -- state ------------------------------------------------------------------------------
    def applies(self, event: ScheduledEvent, observer: Observer) -> bool:
        """The event takes this VM out of service: drain while it is in the document."""
        return affects(event.resources, observer.vm_name) and self.rules.is_impactful(event)

    def follow(
        self,
        events: Iterable[ScheduledEvent],
        observer: Observer,
        begins: Mapping[str, datetime] | None = None,
    ) -> None:
        """Drain for the events of the current document that apply (on the poller's thread, at
        every successful poll, before anything is written anywhere): the level IMDS shows,
        whatever the disk, the outbox or the broker do. ``begins`` says, by event key, when the
        503 of an event that has not started begins (:func:`sebridge.timing.probe_begins` of
        its drain moment); an event it leaves out drains at once. A drain that goes on keeps
        its begin once it has begun; one whose event is gone, or no longer applies (an Updated
        made it harmless or dropped this VM), ends."""
        now = self.now()
        wanted = {event.key: event for event in events if self.applies(event, observer)}
        with self._cond:
            for key in [key for key in self._drains if key not in wanted]:
                ended = self._drains.pop(key)
                self._lapsed.discard(key)
                log.info(
                    "drain for %s over: its event is gone or no longer applies", ended.event_id
                )
            for key, event in wanted.items():
                drain = self._drains.get(key)
                given = begins.get(key) if begins is not None else None
                if drain is None:
                    start = given if given is not None else now
                    self._drains[key] = _Drain(event.event_id, start, event.is_started)
                    log.info(
                        "drain for %s (%s, %s): the probe answers 503 %s",
                        event.event_id,
                        event.event_type,
                        event.status or "status unknown",
                        "now"
                        if event.is_started or start <= now
                        else f"from {isoformat_utc(start)} (its drain moment)",
                    )
                    continue
                if given is not None and drain.begins > now:
                    drain.begins = given  # not begun yet: an Updated may move it
                if event.is_started and not drain.started:
                    drain.started = True
                    drain.begins = min(drain.begins, now)
            self._evaluate(now)
            self._cond.notify_all()

    def _evaluate(self, now: datetime) -> set[str]:
        """(Under the lock.) The not-started drains holding the probe at 503 now; logs when
        the level changes and when a run reaches the bound."""
        pending = {key: d.begins for key, d in self._drains.items() if not d.started}
        holding = self._runs.holding(pending, now)
        unhealthy = bool(holding) or any(d.started for d in self._drains.values())
        lapsed = self._runs.spent - self._lapsed
        if lapsed:
            self._lapsed |= lapsed
            log.warning(
                "drain for %s: the probe answered 503 for %g s and the event has not started: "
                "200 again until it starts, so that automatic repairs never see the instance "
                "unhealthy for long (--drain-probe-max-unhealthy-seconds)",
                ", ".join(sorted(self._drains[key].event_id for key in lapsed)),
                self.max_unhealthy,
            )
        if unhealthy != self._unhealthy:
            self._unhealthy = unhealthy
            log.info("drain probe: %s", "503 (draining)" if unhealthy else "200 (healthy)")
        return holding

    @property
    def draining(self) -> bool:
        """The probe answers 503 now (whatever the upstream says)."""
        with self._cond:
            return self._unhealthy_at(self.now())

    def _unhealthy_at(self, now: datetime) -> bool:
        holding = self._evaluate(now)
        return bool(holding) or any(d.started for d in self._drains.values())

    def answer_counts(self) -> dict[int, int]:
        """How many times the probe answered 200 and 503 so far (for the metrics)."""
        with self._cond:
            return dict(self.answers)

    def preparation_status(self, event_key: str) -> str | None:
        with self._cond:
            return self._status(event_key, self.now())

    def _status(self, event_key: str, now: datetime) -> str | None:
        """(Under the lock.) None: nothing to drain for the event; ``succeeded`` once the run of
        503 that holds it has lasted ``--drain-seconds``; ``pending`` before, and for a drain
        that reached the bound (the VM takes traffic again)."""
        drain = self._drains.get(event_key)
        if drain is None:
            return None
        holding = self._evaluate(now)
        if drain.started:
            since = drain.begins
        elif event_key in holding and self._runs.run_start is not None:
            since = self._runs.run_start
        else:
            return "pending"
        return "succeeded" if (now - since).total_seconds() >= self.drain_seconds else "pending"

    def answer(self) -> tuple[int, bytes]:
        if self.draining:
            status = UNHEALTHY
        elif self.upstream is not None:
            healthy = upstream_healthy(self.upstream, self.upstream_timeout)
            status = HEALTHY if healthy else UNHEALTHY
        else:
            status = HEALTHY
        with self._cond:
            self.answers[status[0]] += 1
        return status

    # -- the drain timer --------------------------------------------------------------------
    def _due(self) -> list[str]:
        """(Under the lock.) Drains that became done since the last call (marked reported)."""
        now = self.now()
        due = []
        for key, drain in self._drains.items():
            if not drain.reported and self._status(key, now) == "succeeded":
                drain.reported = True
                due.append(key)
        return due

    def run_timer(self, stop: threading.Event) -> None:
        """Report each drain to the preparations when it is done, and log the probe's level
        when a drain moment or the bound changes it, until ``stop``."""
        while not stop.is_set():
            with self._cond:
                due = self._due()
                if not due:
                    self._cond.wait(0.5)
                    continue
            for key in due:
                log.info("drain time of %g s over for %s", self.drain_seconds, key)
                if self.preparations is not None:
                    self.preparations.check(key)

    # -- the HTTP endpoint ------------------------------------------------------------------
    def bind(self, address: str, port: int) -> tuple[str, int]:
        """Open the listening socket now (so that a port in use fails the start, clearly);
        returns the address and port bound."""
        try:
            self._server = _Server(address, port, self)
        except OSError as exc:
            raise ProbeError(f"drain probe cannot listen on {address}:{port}: {exc}") from exc
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        """The address and port bound (call :meth:`bind` first)."""
        if self._server is None:
            raise ProbeError("the drain probe is not bound")
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    def serve(self, stop: threading.Event) -> None:
        """Serve the probe and run the drain timer until ``stop`` (call :meth:`bind` first)."""
        server = self._server
        if server is None:
            raise ProbeError("bind() the drain probe before serving it")
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="drain-probe-http"
        )
        thread.daemon = True
        thread.start()
        try:
            self.run_timer(stop)
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=2.0)
            with self._cond:
                self._cond.notify_all()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "sebridge-drain-probe"
    sys_version = ""
    timeout = REQUEST_TIMEOUT

    def _reply(self, body: bool) -> None:
        status, text = self.server.probe.answer()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(text)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(text)

    def do_GET(self) -> None:
        self._reply(body=True)

    def do_HEAD(self) -> None:
        self._reply(body=False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("probe %s: " + format, self.client_address[0], *args)


class _Server(BoundedHTTPServer):
    def __init__(self, address: str, port: int, probe: DrainProbe) -> None:
        self.probe = probe
        super().__init__(address, port, _Handler, max_connections=MAX_CONNECTIONS)
