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
  (:class:`sebridge.timing.UnhealthyRuns`). A Started event drains regardless. As the balancer
  sees it: between two runs (and after a started event's 503) the probe answers 200 for at
  least ``--drain-probe-min-healthy-seconds``; a run whose event comes back within that gap
  (left out of one document) goes on; runs are measured on the monotonic clock.
- ``--drain-seconds`` after the run of 503 began (probe interval x unhealthy threshold + the
  connection drain time: the balancer has stopped sending new connections and the open ones
  had their time), the drain counts as done, and :class:`~sebridge.forwarder.local.preparation.
  Preparations` publishes ``Prepared`` once the other preparations are done too (a drain that
  reached the bound is not done: the VM takes traffic again).

The port answers the health status and nothing else: every GET or HEAD, whatever its path,
gets ``ok`` or ``unavailable`` (the same word while draining and while the upstream is down),
never an event detail. It binds ``--drain-probe-address`` (default ``0.0.0.0``: the load
balancer probes the VM's own address from 168.63.129.16; let only that source in, e.g. an NSG
rule for the ``AzureLoadBalancer`` service tag). Any local user can reach it all the same, so it
is served by :class:`~sebridge.forwarder.net.server.HttpServer`: slow, idle and resetting
clients cannot keep the load balancer's probe from its answer.

The answer comes from state, never from a call in progress: the application's health check
(``--drain-probe-upstream``) is asked by a worker of its own every :data:`UPSTREAM_EVERY` s,
each time within :data:`UPSTREAM_TIMEOUT` s however its answer trickles in
(:class:`~sebridge.forwarder.net.client.DeadlineHttp`), and the probe answers with the last
verdict (503 until the first, or when the last is older than :data:`UPSTREAM_MAX_AGE` s).

The state follows the document on the poller's thread as soon as a poll has read it, before
anything is written, and the answer is worked out from the clock when asked, so it changes
within one poll interval of IMDS, and at the drain moment itself
(``benchmarks/drain_probe_flip.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sebridge.contract.events import Observer
from sebridge.forwarder.local.hooks_file import affects
from sebridge.forwarder.local.preparation import Preparations
from sebridge.forwarder.net.client import (
    BodyTooLarge,
    DeadlineExceeded,
    DeadlineHttp,
    RequestCancelled,
    TransportError,
    check_url,
)
from sebridge.imds import ScheduledEvent, isoformat_utc
from sebridge.impact import ImpactRules
from sebridge.times import shifted
from sebridge.timing import (
    DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS,
    DEFAULT_PROBE_MIN_HEALTHY_SECONDS,
    UnhealthyRuns,
    check_min_healthy,
    check_probe_bound,
)

if TYPE_CHECKING:
    # asyncio and a thread pool: imported when the probe is bound, not by every forwarder.
    from sebridge.forwarder.net.server import HttpServer, Request, Response

log = logging.getLogger("forwarder.drain-probe")

UPSTREAM_TIMEOUT = 3.0  # seconds the application's health check has to answer, all of it
UPSTREAM_EVERY = 1.0  # seconds between two checks of the application's health
UPSTREAM_MAX_BODY = 1024 * 1024
HEALTHY = (200, b"ok\n")
UNHEALTHY = (503, b"unavailable\n")


class ProbeError(ValueError):
    """A drain-probe setting is wrong, or its port cannot be bound."""


def check_upstream(url: str) -> str:
    """``url`` if the upstream's health can be asked there (the client's own check, at start:
    a URL it could not send to would read as "unhealthy" at every check, draining the VM)."""
    try:
        parts = check_url(url)
    except ValueError as exc:
        raise ProbeError(f"--drain-probe-upstream cannot be asked: {exc}") from None
    if parts.username or parts.password:
        raise ProbeError("--drain-probe-upstream must not carry credentials")
    return url


class Upstream:
    """The application's own health check, asked by :meth:`run` every ``every`` seconds; the
    probe reads the last verdict (:meth:`healthy`), so a slow application never slows the
    probe's answer. 2xx and 3xx are healthy (redirects not followed); anything else, a timeout
    (of the whole exchange), a refused connection or a body over 1 MiB is not."""

    def __init__(
        self,
        url: str,
        timeout: float = UPSTREAM_TIMEOUT,
        every: float = UPSTREAM_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(check_upstream(url))
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self.every = every
        self.max_age = every + timeout + 1.0
        self.clock = clock
        self._verdict: tuple[bool, float] | None = None  # (healthy, when)
        self._lock = threading.Lock()

    def healthy(self) -> bool:
        """The last verdict, if it is recent; False before the first and when it is stale."""
        with self._lock:
            verdict = self._verdict
        return verdict is not None and verdict[0] and self.clock() - verdict[1] <= self.max_age

    def check(self, http: DeadlineHttp) -> bool:
        try:
            answer = http.request(
                "GET",
                self.target,
                timeout=self.timeout,
                headers={"User-Agent": "sebridge-drain-probe"},
            )
        except (DeadlineExceeded, RequestCancelled, BodyTooLarge, TransportError) as exc:
            log.debug("upstream health check failed: %s", exc)
            return False
        return 200 <= answer.status < 400

    def run(self, stop: threading.Event) -> None:
        """Check every ``every`` seconds until ``stop`` (which also ends a check at once)."""
        http = DeadlineHttp(
            self.base,
            max_body=UPSTREAM_MAX_BODY,
            connect_timeout=min(2.0, self.timeout),
            cancel=stop,
        )
        last: bool | None = None
        try:
            while not stop.is_set():
                started = self.clock()
                try:
                    healthy = self.check(http)
                except Exception:  # a bug, not the application's health: say so, go on
                    log.exception("upstream health check failed unexpectedly")
                    healthy = False
                with self._lock:
                    self._verdict = (healthy, self.clock())
                if healthy != last:
                    log.info("upstream %s is %s", self.base, "healthy" if healthy else "unhealthy")
                    last = healthy
                stop.wait(max(0.0, started + self.every - self.clock()))
        finally:
            http.close()


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
        min_healthy: float = DEFAULT_PROBE_MIN_HEALTHY_SECONDS,
        now: Callable[[], datetime] = _utc_now,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.rules = rules
        self.drain_seconds = drain_seconds
        self.preparations = preparations
        self.upstream = Upstream(upstream, upstream_timeout) if upstream else None
        self.max_unhealthy = check_probe_bound(max_unhealthy)
        self.min_healthy = check_min_healthy(min_healthy)
        self.now = now
        # Runs are measured on the monotonic clock (a test that moves its own wall clock and
        # gives no monotonic one measures on that wall clock).
        self.monotonic = monotonic or (time.monotonic if now is _utc_now else None)
        self._runs = UnhealthyRuns(
            timedelta(seconds=max_unhealthy), timedelta(seconds=self.min_healthy)
        )
        self._drains: dict[str, _Drain] = {}
        self._cond = threading.Condition()
        self._server: HttpServer | None = None
        self._unhealthy = False  # the level last logged
        self.healthy_since: datetime | None = None  # when the probe last stopped answering 503
        self._followed = False  # follow ran once
        self.unhealthy_since: datetime | None = None  # when the probe last began answering 503
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
            if self._followed:
                self._evaluate(now)  # what the probe answered until this document (for the gap)
            # (The first time, at start, it answered nothing yet: evaluated with no drains, a
            # run the restart replayed would look cut short, and its drain time start again.)
            self._followed = True
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

    def wall_moved(self, step: timedelta) -> None:
        """The wall clock stepped by ``step`` (beyond the time that passed): the wall times the
        probe keeps of what happened move with it (runs are on the monotonic clock and stay);
        a begin still to come is NotBefore's doing (Azure's clock) and stays."""
        with self._cond:
            before = shifted(self.now(), -step)  # now, on the clock before the step
            if self.healthy_since is not None:
                self.healthy_since = shifted(self.healthy_since, step)
            if self.unhealthy_since is not None:
                self.unhealthy_since = shifted(self.unhealthy_since, step)
            for drain in self._drains.values():
                if drain.begins <= before:
                    drain.begins = shifted(drain.begins, step)

    def came_up(self, dark_since: datetime | None, dark_mono: float | None = None) -> None:
        """At start, before anything else: since when the balancer may not have seen the probe
        healthy for the gap, on the wall clock and, in the same boot, on the monotonic one
        (UnhealthyRuns.came_up)."""
        with self._cond:
            mono = self.monotonic() if self.monotonic is not None else None
            self._runs.came_up(dark_since, self.now(), mono, dark_mono=dark_mono)

    @property
    def in_the_dark(self) -> bool:
        """Whether the balancer may not have seen the probe healthy for the gap since the
        forwarder came up (and the starts in a row before)."""
        with self._cond:
            return self._runs.in_the_dark

    def restarted(
        self,
        begins: Mapping[str, datetime],
        started: bool,
        healthy_since: datetime | None,
        gone: Mapping[str, datetime] | None = None,
        unhealthy_since: datetime | None = None,
    ) -> None:
        """After a restart, before the probe follows the journal's view: replay in one history
        the begins of the drains (not started) the view holds and of those whose events IMDS
        left out of a document lately, each of these until it went (``gone``), so a run they
        were in goes on, a bound they spent stays spent, and a run they were cut out of is
        cut there, not held to now; ``started``: a started event of this VM holds the probe at
        503 anyway; ``healthy_since``: when the probe last stopped answering 503 before the
        restart (from the journal): a new run waits the healthy gap from it
        (UnhealthyRuns.restarted); ``unhealthy_since``: when it last began answering 503
        (from the journal), which a drain's time (Prepared) counts from at the earliest."""
        with self._cond:
            now = self.now()
            mono = self.monotonic() if self.monotonic is not None else None
            went = {key: min(at, now) for key, at in (gone or {}).items() if key in begins}
            for at in sorted(set(went.values())):
                # At ``at``: every drain that had not gone yet held as it did then, then those
                # that went at ``at`` went (a run they alone held is cut there).
                placed = None if mono is None else mono - (now - at).total_seconds()
                for still in (True, False):
                    shown = {
                        key: begin
                        for key, begin in begins.items()
                        if key not in went or went[key] > at or (still and went[key] == at)
                    }
                    self._runs.holding(shown, at, placed, forced=started)
            self._runs.holding(
                {key: b for key, b in begins.items() if key not in went}, now, mono, forced=started
            )
            if healthy_since is not None:
                self._runs.restarted(healthy_since)
            if unhealthy_since is not None and (
                healthy_since is None or unhealthy_since > healthy_since
            ):
                # The probe answered 503 without a break since then (as journaled): a run the
                # replay shows going on has held it only since then, whatever its start.
                self._runs.held_at_least_since(unhealthy_since)
            self.healthy_since = self.healthy_since or healthy_since
            self.unhealthy_since = self.unhealthy_since or unhealthy_since

    def _evaluate(self, now: datetime) -> set[str]:
        """(Under the lock.) The not-started drains holding the probe at 503 now; logs when
        the level changes and when a run reaches the bound."""
        pending = {key: d.begins for key, d in self._drains.items() if not d.started}
        forced = any(d.started for d in self._drains.values())
        mono = self.monotonic() if self.monotonic is not None else None
        holding = self._runs.holding(pending, now, mono, forced=forced)
        unhealthy = bool(holding) or forced
        lapsed = (self._runs.spent & self._drains.keys()) - self._lapsed
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
            if not unhealthy:
                self.healthy_since = now
            else:
                self.unhealthy_since = now
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
        elif event_key in holding and (held := self._runs.held_since) is not None:
            since = held
        else:
            return "pending"
        return "succeeded" if (now - since).total_seconds() >= self.drain_seconds else "pending"

    def answer(self) -> tuple[int, bytes]:
        if self.draining:
            status = UNHEALTHY
        elif self.upstream is not None:
            status = HEALTHY if self.upstream.healthy() else UNHEALTHY
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
        from sebridge.forwarder.net.server import HttpServer

        try:
            self._server = HttpServer("drain-probe", address, port, self._handle, logger=log)
        except OSError as exc:
            raise ProbeError(f"drain probe cannot listen on {address}:{port}: {exc}") from exc
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        """The address and port bound (call :meth:`bind` first)."""
        if self._server is None:
            raise ProbeError("the drain probe is not bound")
        return self._server.address

    def http_errors(self) -> dict[str, int]:
        """The probe server's errors by reason (for the metrics); empty until bound."""
        return self._server.error_counts() if self._server is not None else {}

    def _handle(self, request: Request) -> Response:
        from sebridge.forwarder.net.server import Response

        status, text = self.answer()
        return Response(status, text)

    def serve(self, stop: threading.Event) -> None:
        """Serve the probe, keep the upstream's verdict fresh and run the drain timer until
        ``stop`` (call :meth:`bind` first)."""
        server = self._server
        if server is None:
            raise ProbeError("bind() the drain probe before serving it")
        threads = []
        if self.upstream is not None:
            threads.append(
                threading.Thread(
                    target=self.upstream.run, args=(stop,), name="drain-probe-upstream", daemon=True
                )
            )
        for thread in threads:
            thread.start()
        server.start()
        try:
            self.run_timer(stop)
        finally:
            server.close()
            for thread in threads:
                thread.join(timeout=2.0)
            with self._cond:
                self._cond.notify_all()
