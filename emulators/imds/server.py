"""``sebridge imds-sim``: a loopback IMDS that replays scheduled-events scenarios.

Standard library only (``http.server`` with HTTP/1.1 keep-alive, one thread per connection).
It answers like real IMDS (see Microsoft's "Scheduled Events for
Linux VMs"):

``GET  /metadata/scheduledevents?api-version=V`` (header ``Metadata: true``)
    ``{"DocumentIncarnation": n, "Events": [...]}``; NotBefore in RFC 1123, ``""`` once Started.
``POST /metadata/scheduledevents?api-version=V`` body ``{"StartRequests": [{"EventId": ...}]}``
    200 and the event starts if it is present and Scheduled; 200 and nothing changes for an
    unknown or already-Started EventId (the docs: "The service always returns a 200 success
    code if it's passed a valid event ID, even if another VM already approved the event. A
    400 error code indicates that the request header or payload was malformed."). EventIds
    compare case-insensitively. Every POST is recorded.
``GET  /metadata/instance?api-version=V`` the instance document from the scenario's ``vm``
    (404 with ``--no-instance-metadata``).
``/vm/<name>/metadata/...`` the same timeline for a fleet; compute.name is ``<name>`` and
    POSTs are recorded with that VM name.

Without ``Metadata: true``: 400 ``{"error": "Bad request. Required metadata header not
specified"}``. Missing or unsupported api-version: 400 with ``newest-versions``.

Test control, never under /metadata (no Metadata header needed, JSON in and out):

``GET  /_sim/state``      scenario, elapsed scenario seconds, incarnation, document, pending
                          steps, request counters, fault rules
``GET  /_sim/requests``   ``{"posts": [...]}``: every scheduledevents POST (time, scenario
                          time, path, vm, headers subset, raw body, status answered)
``GET  /_sim/faults``     the fault rules and how often each fired
``POST /_sim/faults``     ``{"rules": [...], "append": false, "firstCallDelay": S}``
                          (rules: see :mod:`emulators.imds.faults`; ``[]`` clears)
``POST /_sim/reset``      restart: scenario time 0, faults and first-call delay from the
                          command line, records cleared
``POST /_sim/advance?seconds=N``  jump scenario time forward by N seconds
``POST /_sim/clock``      ``{"running": false}`` stops scenario time where it is (``true``
                          lets it run on): a test holds the scenario still while a process it
                          drives restarts, however long a loaded machine makes that take
``POST /_sim/event``      ``{"op": "add", "event": {IMDS fields}, "notBeforeIn": S,
                          "timeline": [steps, at = seconds from now]}``,
                          ``{"op": "update", "eventId": ..., "set": {...}, "notBeforeIn": S}``,
                          ``{"op": "start"|"remove", "eventId": ...}``; each bumps the incarnation
``POST /_sim/scenario``   ``{"name": "<name or path>", "speed": X}``: load it and restart

Convention: ``--host`` (127.0.0.1), ``--port`` (0 = any free port); prints exactly
``listening on http://127.0.0.1:<port>`` to stdout once bound; logs go to stderr; SIGTERM and
SIGINT stop it with exit code 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from emulators.imds.faults import FaultError, FaultRule, decide, parse_cli_rule, parse_rules
from emulators.imds.instance import instance_document, vm_settings
from emulators.imds.scenario import (
    DEFAULT_SCENARIO,
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_names,
)
from emulators.imds.simulation import ControlError, Simulation, event_ids_of
from sebridge.signals import StopSignals

log = logging.getLogger("sebridge.imds-sim")

# api-versions real IMDS accepts for scheduledevents (docs "Version and region availability";
# 2017-03-01 was a preview and is gone).
SCHEDULED_EVENTS_API_VERSIONS = (
    "2017-08-01",
    "2017-11-01",
    "2019-01-01",
    "2019-04-01",
    "2019-08-01",
    "2020-07-01",
)
# api-versions for /metadata/instance (IMDS docs "Supported API versions").
INSTANCE_API_VERSIONS = (
    "2017-03-01",
    "2017-04-02",
    "2017-08-01",
    "2017-10-01",
    "2017-12-01",
    "2018-02-01",
    "2018-04-02",
    "2018-10-01",
    "2019-02-01",
    "2019-03-11",
    "2019-04-30",
    "2019-06-01",
    "2019-06-04",
    "2019-08-01",
    "2019-08-15",
    "2019-11-01",
    "2020-06-01",
    "2020-07-15",
    "2020-09-01",
    "2020-10-01",
    "2020-12-01",
    "2021-01-01",
    "2021-02-01",
    "2021-03-01",
    "2021-05-01",
    "2021-10-01",
    "2021-11-01",
    "2021-11-15",
    "2021-12-13",
    "2023-07-01",
    "2023-11-15",
    "2024-03-15",
    "2024-07-17",
)
MAX_BODY = 64 * 1024
MAX_RECORDED = 10_000
_VM_PREFIX = re.compile(r"^/vm/([A-Za-z0-9][A-Za-z0-9_.-]{0,79})(/.*)$")
_RECORDED_HEADERS = ("Metadata", "Content-Type", "Content-Length", "User-Agent", "Connection")
_MISSING_HEADER = {"error": "Bad request. Required metadata header not specified"}


@dataclass
class SimConfig:
    scenario: str = DEFAULT_SCENARIO
    speed: float = 1.0
    faults: Sequence[FaultRule] = ()
    first_call_delay: float = 0.0
    instance_metadata: bool = True
    start_on_first_poll: bool = False


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    reset: bool = False  # abort the connection with a TCP RST instead of answering


def _json_reply(status: int, obj: object, **headers: str) -> Reply:
    body = json.dumps(obj).encode()
    return Reply(status, body, {"Content-Type": "application/json; charset=utf-8", **headers})


class SimulatorApp:
    """All mutable state behind one lock; the HTTP handler only translates."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self._restart(load_scenario(config.scenario), config.speed)

    # -- lifecycle and clock ------------------------------------------------------------------

    def _restart(self, scenario: Scenario, speed: float) -> None:
        with self.lock:
            self.sim = Simulation(scenario, speed=speed)
            self.speed = speed
            self.offset = 0.0
            self.paused = False
            self.clock_started = not self.config.start_on_first_poll
            self.t0 = time.monotonic()
            # Fresh copies so that fired counters start again from zero.
            self.rules = [parse_cli_rule_copy(r) for r in self.config.faults]
            self.first_call_delay = self.config.first_call_delay
            self.posts: list[dict[str, Any]] = []
            self.counters: dict[str, int] = {}
            log.info("scenario %s (%s) at speed %g", scenario.name, scenario.source, speed)

    def reset(self) -> None:
        self._restart(self.sim.scenario, self.speed)

    def load(self, name: str, speed: float | None) -> None:
        scenario = load_scenario(name)  # raises ScenarioError before anything changes
        self._restart(scenario, self.speed if speed is None else speed)

    def scenario_time(self) -> float:
        if not self.clock_started or self.paused:
            return self.offset
        return self.offset + (time.monotonic() - self.t0) * self.speed

    def _advance(self) -> float:
        t = self.scenario_time()
        for line in self.sim.advance_to(t, time.time()):
            log.info("%s", line)
        return t

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    # -- IMDS -----------------------------------------------------------------------------------

    def fault_for(self, target: str) -> tuple[float, FaultRule | None]:
        """(seconds to hold the request, failing rule or None), first-call delay included."""
        with self.lock:
            hang = 0.0
            if target == "get":
                if not self.clock_started:
                    self.clock_started = True
                    self.t0 = time.monotonic()
                if self.first_call_delay > 0:
                    hang, self.first_call_delay = self.first_call_delay, 0.0
            decision = decide(self.rules, target)
            return hang + decision.hang, decision.rule

    def document(self, vm: str | None) -> dict[str, Any]:
        with self.lock:
            self._advance()
            self._count(f"get:{vm}" if vm else "get")
            return self.sim.document()

    def approve(self, event_ids: Sequence[str], vm: str | None) -> list[str]:
        with self.lock:
            t = self.scenario_time()
            started = self.sim.approve(event_ids, t, time.time())
            for event_id in started:
                log.info(
                    "approved %s by %s (incarnation %d)", event_id, vm or "-", self.sim.incarnation
                )
            return started

    def instance(self, vm: str | None) -> dict[str, Any]:
        with self.lock:
            self._count("instance")
            return instance_document(vm_settings(self.sim.scenario.vm, vm))

    def record_post(
        self, handler: BaseHTTPRequestHandler, vm: str | None, body: bytes, status: int | str
    ) -> None:
        with self.lock:
            self._count(f"post:{vm}" if vm else "post")
            if len(self.posts) >= MAX_RECORDED:
                self.posts.pop(0)
            self.posts.append(
                {
                    "time": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                    "scenarioTime": round(self.scenario_time(), 3),
                    "path": handler.path,
                    "vm": vm,
                    "headers": {
                        h: handler.headers[h] for h in _RECORDED_HEADERS if h in handler.headers
                    },
                    "body": body.decode("utf-8", errors="replace"),
                    "status": status,
                }
            )

    # -- test control ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        with self.lock:
            self._advance()
            out = self.sim.state()
            out["clockStarted"] = self.clock_started
            out["clockHeld"] = self.paused
            out["requests"] = dict(self.counters)
            out["faults"] = [r.to_json() for r in self.rules]
            out["firstCallDelayPending"] = self.first_call_delay
            return out

    def set_faults(self, body: object) -> dict[str, Any]:
        if not isinstance(body, Mapping | list):
            raise FaultError('expected {"rules": [...], "append": false, "firstCallDelay": S}')
        extra: Mapping[str, Any] = body if isinstance(body, Mapping) else {}
        unknown = sorted(set(extra) - {"rules", "append", "firstCallDelay"})
        if unknown:
            raise FaultError(f"unknown key(s) {unknown}")
        rules = parse_rules(body if isinstance(body, list) else {"rules": extra.get("rules", [])})
        delay = extra.get("firstCallDelay")
        if delay is not None and (
            isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 120
        ):
            raise FaultError("firstCallDelay must be a number of seconds from 0 to 120")
        with self.lock:
            self.rules = [*self.rules, *rules] if extra.get("append") else rules
            if delay is not None:
                self.first_call_delay = float(delay)
            log.info("faults now %s", [r.to_json() for r in self.rules])
            return {
                "rules": [r.to_json() for r in self.rules],
                "firstCallDelay": self.first_call_delay,
            }

    def set_clock(self, running: bool) -> None:
        """Stop scenario time where it is, or let it run on from there."""
        with self.lock:
            if running == (not self.paused):
                return
            if running:
                self.paused = False
                self.t0 = time.monotonic()
            else:
                self.offset = self.scenario_time()
                self.paused = True
            log.info("scenario clock %s at %.3f s", "running" if running else "held", self.offset)

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.offset += seconds
            log.info("scenario time advanced by %g s", seconds)

    def control(self, command: Mapping[str, Any]) -> dict[str, Any]:
        with self.lock:
            t = self.scenario_time()
            event = self.sim.control(command, t, time.time())
            log.info(
                "control %s -> %s (incarnation %d)",
                command.get("op"),
                event.get("EventId"),
                self.sim.incarnation,
            )
            return {"event": event, "incarnation": self.sim.incarnation}


def parse_cli_rule_copy(rule: FaultRule) -> FaultRule:
    """A fresh rule with the same settings (counters at zero, RNG reseeded)."""
    copy = FaultRule(
        kind=rule.kind,
        target=rule.target,
        count=rule.count,
        probability=rule.probability,
        seed=rule.seed,
        retry_after=rule.retry_after,
        status=rule.status,
        seconds=rule.seconds,
        body=rule.body,
    )
    return copy


def _fault_reply(rule: FaultRule, incarnation_hint: int) -> Reply:
    if rule.kind == "429":
        return _json_reply(
            429, {"error": "Too many requests"}, **{"Retry-After": str(rule.retry_after)}
        )
    if rule.kind == "5xx":
        return _json_reply(rule.status, {"error": "Internal server error"})
    if rule.kind == "4xx":
        return _json_reply(
            rule.status, {"error": f"Bad request. Refused ({rule.status}, injected)"}
        )
    if rule.kind == "malformed":
        if rule.body == "not-json":
            # Cut off mid-document, as a proxy that dropped the connection's tail would.
            text = f'{{"DocumentIncarnation": {incarnation_hint}, "Events": [{{"EventId": "'
            return Reply(200, text.encode(), {"Content-Type": "application/json; charset=utf-8"})
        return _json_reply(200, {"DocumentIncarnation": "n/a", "Events": {"unexpected": True}})
    return Reply(0, b"", reset=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the forwarder polls through one Session
    server_version = "sebridge-imds-sim"
    sys_version = ""
    # Headers and body leave in one segment (flushed by handle_one_request): with separate
    # writes, Nagle plus the client's delayed ACK add ~40 ms to every keep-alive request.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    app: SimulatorApp  # set on a subclass by make_server

    # -- plumbing -------------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, reply: Reply) -> None:
        if reply.reset:
            # SO_LINGER 0 makes close() send RST: the client sees "connection reset by peer".
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering 411/413 (the connection is closed)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            self._send(_json_reply(411, {"error": "Length required"}))
            return None
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            self._send(_json_reply(413, {"error": f"body must be 0 to {MAX_BODY} bytes"}))
            return None
        return self.rfile.read(length) if length else b""

    def _dispatch(self, method: str) -> None:
        body = b""
        if method == "POST":
            read = self._read_body()
            if read is None:
                return
            body = read
        try:
            reply = self._route(method, body)
        except Exception:  # a bug must cost one 500, never the server
            log.exception("error handling %s %s", method, self.path)
            reply = _json_reply(500, {"error": "simulator error (see its log)"})
        self._send(reply)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- routing --------------------------------------------------------------------------------

    def _route(self, method: str, body: bytes) -> Reply:
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        path = url.path
        if path.startswith("/_sim/"):
            return self._control(method, path, query, body)
        vm = None
        match = _VM_PREFIX.match(path)
        if match:
            vm, path = match.group(1), match.group(2)
        path = path.rstrip("/")
        if path == "/metadata/scheduledevents":
            return self._scheduled_events(method, query, body, vm)
        if path == "/metadata/instance":
            return self._instance(method, query, vm)
        return _json_reply(404, {"error": "Not found"})

    def _check_imds(self, query: Mapping[str, list[str]], versions: Sequence[str]) -> Reply | None:
        # Real IMDS compares the header value case-insensitively ("Metadata: True" works).
        if self.headers.get("Metadata", "").strip().lower() != "true":
            return _json_reply(400, _MISSING_HEADER)
        newest = list(reversed(versions[-3:]))
        given = query.get("api-version", [""])[-1]
        if not given:
            return _json_reply(
                400,
                {
                    "error": "Bad request. api-version was not specified in the request. "
                    "For more information refer to aka.ms/azureimds",
                    "newest-versions": newest,
                },
            )
        if given not in versions:
            return _json_reply(
                400,
                {
                    "error": "Bad request. api-version is invalid or was not specified in the "
                    "request. For more information refer to aka.ms/azureimds",
                    "newest-versions": newest,
                },
            )
        return None

    def _hold(self, seconds: float) -> None:
        if seconds > 0:
            self.app.stopping.wait(seconds)  # released at once when the server stops

    def _scheduled_events(
        self, method: str, query: Mapping[str, list[str]], body: bytes, vm: str | None
    ) -> Reply:
        app = self.app
        if method not in ("GET", "POST"):
            return _json_reply(405, {"error": "Method not allowed"}, Allow="GET, POST")
        target = "get" if method == "GET" else "post"
        hang, rule = app.fault_for(target)
        self._hold(hang)
        if rule is not None:
            reply = _fault_reply(rule, app.sim.incarnation)
            log.info("fault %s on %s %s", rule.kind, method, self.path)
            if method == "POST":
                app.record_post(self, vm, body, "reset" if reply.reset else reply.status)
            return reply
        invalid = self._check_imds(query, SCHEDULED_EVENTS_API_VERSIONS)
        if method == "GET":
            return invalid or _json_reply(200, app.document(vm))
        reply = invalid or self._start_requests(body, vm)
        app.record_post(self, vm, body, reply.status)
        return reply

    def _start_requests(self, body: bytes, vm: str | None) -> Reply:
        try:
            event_ids = event_ids_of(json.loads(body.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return _json_reply(400, {"error": "Bad request. The request body is not valid JSON"})
        except ValueError as exc:
            return _json_reply(400, {"error": f"Bad request. {exc}"})
        self.app.approve(event_ids, vm)
        return Reply(200, b"", {"Content-Type": "application/json; charset=utf-8"})

    def _instance(self, method: str, query: Mapping[str, list[str]], vm: str | None) -> Reply:
        if method != "GET":
            return _json_reply(405, {"error": "Method not allowed"}, Allow="GET")
        if not self.app.config.instance_metadata:
            return _json_reply(404, {"error": "Not found"})
        hang, rule = self.app.fault_for("instance")
        self._hold(hang)
        if rule is not None:
            return _fault_reply(rule, 0)
        invalid = self._check_imds(query, INSTANCE_API_VERSIONS)
        return invalid or _json_reply(200, self.app.instance(vm))

    def _control(
        self, method: str, path: str, query: Mapping[str, list[str]], body: bytes
    ) -> Reply:
        app = self.app
        try:
            payload: Any = json.loads(body) if body.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return _json_reply(400, {"error": f"the body is not JSON: {exc}"})
        try:
            if (method, path) == ("GET", "/_sim/state"):
                return _json_reply(200, app.state())
            if (method, path) == ("GET", "/_sim/requests"):
                with app.lock:
                    return _json_reply(200, {"posts": list(app.posts)})
            if (method, path) == ("GET", "/_sim/faults"):
                with app.lock:
                    rules = [r.to_json() for r in app.rules]
                    return _json_reply(
                        200, {"rules": rules, "firstCallDelay": app.first_call_delay}
                    )
            if (method, path) == ("POST", "/_sim/faults"):
                return _json_reply(200, app.set_faults(payload))
            if (method, path) == ("POST", "/_sim/reset"):
                app.reset()
                return _json_reply(200, app.state())
            if (method, path) == ("POST", "/_sim/advance"):
                raw = query.get("seconds", [""])[-1]
                try:
                    seconds = float(raw)
                except ValueError:
                    return _json_reply(400, {"error": "seconds=N (a number >= 0) is required"})
                if not 0 <= seconds <= 1e7:
                    return _json_reply(400, {"error": "seconds must be from 0 to 1e7"})
                app.advance(seconds)
                return _json_reply(200, app.state())
            if (method, path) == ("POST", "/_sim/clock"):
                running = payload.get("running") if isinstance(payload, Mapping) else None
                if not isinstance(running, bool):
                    return _json_reply(400, {"error": 'expected {"running": true|false}'})
                app.set_clock(running)
                return _json_reply(200, app.state())
            if (method, path) == ("POST", "/_sim/event"):
                if not isinstance(payload, Mapping):
                    return _json_reply(400, {"error": "the body must be a JSON object"})
                return _json_reply(200, app.control(payload))
            if (method, path) == ("POST", "/_sim/scenario"):
                if not isinstance(payload, Mapping) or not isinstance(payload.get("name"), str):
                    return _json_reply(400, {"error": 'expected {"name": "<scenario or path>"}'})
                speed = payload.get("speed")
                if speed is not None and (
                    isinstance(speed, bool) or not isinstance(speed, int | float) or speed <= 0
                ):
                    return _json_reply(400, {"error": "speed must be a number > 0"})
                app.load(payload["name"], None if speed is None else float(speed))
                return _json_reply(200, app.state())
        except (FaultError, ControlError, ScenarioError) as exc:
            return _json_reply(400, {"error": str(exc)})
        return _json_reply(404, {"error": f"no test-control endpoint {method} {path}"})


class SimulatorServer(ThreadingHTTPServer):
    daemon_threads = True  # keep-alive connections must not hold up shutdown
    allow_reuse_address = True
    app: SimulatorApp

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class SimulatorServer6(SimulatorServer):
    address_family = socket.AF_INET6  # --host ::1


def make_server(config: SimConfig, host: str = "127.0.0.1", port: int = 0) -> SimulatorServer:
    """Bind (but do not serve yet). Raises ScenarioError for a bad scenario."""
    app = SimulatorApp(config)
    handler = type("BoundHandler", (Handler,), {"app": app})
    server_class = SimulatorServer6 if ":" in host else SimulatorServer
    server = server_class((host, port), handler)
    server.app = app
    return server


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _fault(text: str) -> FaultRule:
    try:
        return parse_cli_rule(text)
    except FaultError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sebridge imds-sim",
        description="Loopback IMDS replaying scheduled-events scenarios (test control: /_sim/).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=0, help="port (0 = pick a free one)")
    parser.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        help="scenario name or path to a .json file (see --list)",
    )
    parser.add_argument("--speed", type=_positive, default=1.0, help="divide every delay by X")
    parser.add_argument("--list", action="store_true", help="list the packaged scenarios and exit")
    parser.add_argument(
        "--fault",
        type=_fault,
        action="append",
        default=[],
        metavar="KIND:KEY=VALUE,...",
        help="inject a fault, e.g. 429:count=3,retryAfter=1  5xx:probability=0.2,seed=1  "
        "4xx:status=400,target=post  hang:seconds=3  malformed:count=2,body=not-json  "
        "reset:count=1,target=post",
    )
    parser.add_argument(
        "--first-call-delay",
        type=_non_negative,
        default=0.0,
        metavar="S",
        help="hold the first scheduledevents GET for S real seconds (IMDS enabling the feature)",
    )
    parser.add_argument(
        "--no-instance-metadata",
        action="store_true",
        help="answer 404 on /metadata/instance (forwarder falls back to the hostname)",
    )
    parser.add_argument(
        "--start-on-first-poll",
        action="store_true",
        help="start the scenario clock at the first scheduledevents GET, not at startup",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs every request")
    return parser


def list_scenarios() -> str:
    lines = []
    for name in scenario_names():
        try:
            scenario = load_scenario(name)
            lines.append(f"{name:<24} {scenario.description}")
        except ScenarioError as exc:
            lines.append(f"{name:<24} INVALID: {exc}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        print(list_scenarios())
        return 0
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    config = SimConfig(
        scenario=args.scenario,
        speed=args.speed,
        faults=tuple(args.fault),
        first_call_delay=args.first_call_delay,
        instance_metadata=not args.no_instance_metadata,
        start_on_first_poll=args.start_on_first_poll,
    )
    try:
        server = make_server(config, args.host, args.port)
    except ScenarioError as exc:
        print(f"sebridge imds-sim: bad scenario: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"sebridge imds-sim: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1
    stop = threading.Event()

    StopSignals(stop).install()  # for the process's life: no lock taken in a signal handler
    thread = threading.Thread(target=server.serve_forever, name="imds-sim", daemon=True)
    thread.start()
    print(f"listening on http://{_url_host(args.host)}:{server.port}", flush=True)
    log.info(
        "effective config: scenario=%s speed=%g faults=%s first_call_delay=%g instance_metadata=%s",
        config.scenario,
        config.speed,
        [r.to_json() for r in config.faults],
        config.first_call_delay,
        config.instance_metadata,
    )
    while not stop.wait(0.5):
        pass
    log.info("stopping")
    server.app.stopping.set()
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
