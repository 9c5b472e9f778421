"""End-to-end latency: Scheduled event visible in IMDS -> StartRequests POST at IMDS (a benchmark).

    python benchmarks/e2e_latency.py [--rounds 3] [--events 50] [--event-type Reboot]

The whole loop on loopback, under an auto-approve policy (APPROVAL_POLICY approves everything
at once), with the forwarder polling IMDS once a second:

    IMDS simulator --poll 1/s--> sebridge forwarder --publish--> Service Bus emulator (topic)
        ^                                                    | approval-gate subscription
        |                                                    v
        +--POST StartRequests-- forwarder <--approvals queue-- functions host (function_app.py)

Real pieces: the IMDS simulator (child process, the idle scenario re-homed onto VM web-1 in
rg-web), the Service Bus emulator (child process, infra/servicebus-emulator/Config.json), the
functions host in this process running the real function_app.py with the demo's settings
(Teams, ARM and managed identity played by the loopback fakes; web-1 exists in ARM behind
lb-web/pool-a, so lb-pools drains and restores it for impactful event types), and
`sebridge forwarder` (child process, not dry-run, --poll-interval 1, --log-level DEBUG for the
stage times below).

A run is --rounds rounds (default 3), each on a freshly started stack. Each round adds
--events events one after another: it waits a random 0..1 s (so the event lands at a random
phase of the poll cycle), takes the time, adds one Scheduled event (POST /_sim/event,
NotBefore in 600 s), and waits for the simulator to record the StartRequests POST for its
EventId; the latency is the POST's recorded wall-clock time minus the time taken just before
the add (conservative). The event is then removed (Completed).

Every event's stages, each a wall-clock time from the log of the piece that saw it (all on one
machine, one clock):

    visible     the benchmark added the event to IMDS
    polled      the poll that saw it returned (the Scheduled message's time, observedAt)
    saved       the forwarder logged the Scheduled transition (after the outbox row and the
                state file were written and synced: two fsyncs on this machine's disk)
    published   the forwarder logged the Scheduled message sent (Service Bus accepted it)
    teams, lb-pools, gate
                each function's invocation began for the Scheduled message (the host's log)
    prepared    lb-pools' Prepared message was enqueued (when the gate waited for it)
    gate-go     the gate invocation that sent the command began (Scheduled or Prepared)
    decided     the gate logged its policy decision in that invocation
    cmd-sent    the gate logged the approve command sent (Service Bus accepted it)
    cmd-recv    the forwarder's approvals receiver got the command (its DEBUG log)
    POST        the simulator recorded the StartRequests POST

Each round's first event (#0) only warms the stack up (the functions' first ARM token and
clients, the gate's command sender link: ~1 s once per host start) and is shown, not counted.
Printed per round: the end-to-end and detection percentiles, each stage-to-stage step's
percentiles, the slowest five events stage by stage; then the worst round. Targets, each
round: visible -> POST p99 <= 1,200 ms (the poll interval + 200 ms) and visible -> polled
p99 <= 1,050 ms (the poll interval + 50 ms); exit 1 when a round misses either or loses an
event. Bounded: at most --rounds x --events events of at most --round-timeout s each.

Every event is its own session (session_id = EventId), and a session-enabled trigger keeps an
idle session for host.json's sessionIdleTimeout on one of maxConcurrentSessions receivers.
--session-idle-timeout S overrides sessionIdleTimeout alone (everything else as host.json
says); the output prints the two values in effect.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.stats import percentile, summary  # noqa: E402
from emulators.demo.world import GROUP, SUBSCRIPTION, app_settings_for_stand_ins  # noqa: E402
from emulators.fakes.arm import FakeArm  # noqa: E402
from emulators.fakes.identity import FakeIdentity  # noqa: E402
from emulators.fakes.storage import FakeBlobStorage  # noqa: E402
from emulators.fakes.teams import FakeTeams  # noqa: E402
from emulators.functions_host import convert  # noqa: E402
from emulators.functions_host.host import FunctionsHost, read_host_json  # noqa: E402
from emulators.functions_host.http_server import listen  # noqa: E402
from emulators.functions_host.logs import LOGGER_NAME  # noqa: E402
from emulators.imds.testing import SimClient  # noqa: E402
from emulators.processes import forwarder, server  # noqa: E402
from emulators.servicebus.testing import running_emulator  # noqa: E402
from sebridge.forwarder.imds.ratelimit import WINDOW_SECONDS  # noqa: E402

VM = "web-1"
POLL_INTERVAL_S = 1.0
TARGET_P99_S = POLL_INTERVAL_S + 0.2  # visible -> POST
TARGET_DETECT_P99_S = POLL_INTERVAL_S + 0.05  # visible -> polled
IMDS_WINDOW_S = WINDOW_SECONDS
AUTO_APPROVE = {
    "rules": [{"name": "benchmark-approve-all", "match": {}, "action": "approve"}],
    "default": "approve",
}
STAGES = (
    "visible",
    "polled",
    "saved",
    "published",
    "teams",
    "lb-pools",
    "gate",
    "lb-done",
    "prepared",
    "gate-go",
    "decided",
    "cmd-sent",
    "cmd-recv",
    "POST",
)
# The steps whose percentiles are printed: (from, to). Functions run in parallel, so each is
# measured from "published"; the chain to the POST goes through the gate.
STEPS = (
    ("visible", "polled"),
    ("polled", "saved"),
    ("saved", "published"),
    ("published", "teams"),
    ("published", "lb-pools"),
    ("published", "gate"),
    ("lb-pools", "lb-done"),
    ("published", "gate-go"),
    ("gate-go", "decided"),
    ("decided", "cmd-sent"),
    ("cmd-sent", "cmd-recv"),
    ("cmd-recv", "POST"),
    ("polled", "POST"),
    ("visible", "POST"),
)
# forwarder text log: "<iso time> <LEVEL>  <logger>: <message>"
_LINE = re.compile(r"^(\S+) (\w+)\s+(\S+): (.*)$")
_DETECTED = re.compile(r"^Scheduled ([0-9a-fA-F-]{36}) \(")
_SENT = re.compile(r"^sent \d+ message\(s\): \[(.*)\]$")
_CMD = re.compile(r"^command approve:([0-9a-fA-F-]{36}) received")
FUNCTIONS = {"teams": "teams", "lb_pools": "lb-pools", "approval_gate": "gate"}


def idle_world() -> dict[str, Any]:
    """The idle scenario with the demo's instance metadata: web-1 in rg-web."""
    scenario: dict[str, Any] = json.loads((ROOT / "benchmarks" / "idle-scenario.json").read_text())
    scenario["vm"] = {
        "name": VM,
        "subscriptionId": SUBSCRIPTION,
        "resourceGroupName": GROUP,
        "vmScaleSetName": "",
        "location": "westeurope",
        "zone": "1",
    }
    return scenario


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def forwarder_stages(stderr_text: str) -> dict[str, dict[str, float]]:
    """EventId (lower case) -> {saved, published, cmd-recv}: the first time of each in the
    forwarder's log (epoch s)."""
    out: dict[str, dict[str, float]] = {}
    for line in stderr_text.splitlines():
        parsed = _LINE.match(line)
        if parsed is None:
            continue
        when, text = parsed.group(1), parsed.group(4)
        if match := _DETECTED.match(text):
            out.setdefault(match.group(1).lower(), {}).setdefault("saved", epoch(when))
        elif match := _SENT.match(text):
            for message_id in re.findall(r"'([^']*)'", match.group(1)):
                ref, _, transition = message_id.partition(":")
                if transition.startswith("Scheduled:"):
                    out.setdefault(ref, {}).setdefault("published", epoch(when))
        elif match := _CMD.match(text):
            out.setdefault(match.group(1).lower(), {}).setdefault("cmd-recv", epoch(when))
    return out


class Recorder(logging.Handler):
    """Collects, in this process, the functions host's invocation events and the approval
    gate's own log lines: per EventId the times of the function stages."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records_lock = threading.Lock()
        self.invocations: list[dict[str, Any]] = []
        self.gate: list[tuple[float, str, str]] = []  # (time, message, eventId)
        self.observed: dict[str, float] = {}  # EventId -> the Scheduled message's time

    def watch_conversions(self) -> Callable[[], None]:
        """Reads the Scheduled messages' time (observedAt) as the host converts them for a
        function (the host's own conversion, called as before); returns the undo."""
        original = convert.to_function_message

        def converting(message: Any, **kwargs: Any) -> Any:
            ref, _, rest = str(message.message_id).partition(":")
            if rest.startswith("Scheduled:") and ref not in self.observed:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    body = json.loads(b"".join(message.body))
                    with self.records_lock:
                        self.observed.setdefault(ref, epoch(str(body["time"])))
            return original(message, **kwargs)

        convert.to_function_message = converting  # type: ignore[assignment]

        def undo() -> None:
            convert.to_function_message = original

        return undo

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "sebridge_fields", None)
        with self.records_lock:
            if fields and fields.get("event") == "invocation" and fields.get("message_id"):
                self.invocations.append(dict(fields, logged=record.created))
            elif record.name.startswith("sebridge.functions.approval_gate"):
                event_id = str(getattr(record, "eventId", ""))
                self.gate.append((record.created, record.getMessage(), event_id.lower()))

    def stages(self, event_id: str) -> dict[str, float]:
        out: dict[str, float] = {}
        with self.records_lock:
            if event_id in self.observed:
                out["polled"] = self.observed[event_id]
            invocations = [i for i in self.invocations if str(i["message_id"]).startswith(event_id)]
            gate = [g for g in self.gate if g[2] == event_id]
        sent = next((t for t, text, _ in gate if text == "approve command sent"), None)
        gate_starts: list[float] = []
        for inv in invocations:
            transition = str(inv["message_id"]).split(":")[1]
            name = FUNCTIONS.get(str(inv["function"]))
            started = epoch(inv["started_at"]) if inv.get("started_at") else None
            if name is None or started is None:
                continue
            if transition == "Scheduled":
                out.setdefault(name, started)
                if name == "lb-pools":
                    out.setdefault("lb-done", started + float(inv["duration_ms"]) / 1000)
            if name == "gate":
                gate_starts.append(started)
                if transition == "Prepared" and inv.get("enqueued_at"):
                    out.setdefault("prepared", epoch(inv["enqueued_at"]))
        if sent is not None:
            before = [t for t in gate_starts if t <= sent]
            if before:
                out["gate-go"] = max(before)
                decided = [
                    t
                    for t, text, _ in gate
                    if text == "policy decision" and out["gate-go"] <= t <= sent
                ]
                if decided:
                    out["decided"] = decided[-1]
            out["cmd-sent"] = sent
        return out


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@dataclass
class Round:
    number: int
    events: list[dict[str, float]] = field(default_factory=list)  # stage -> epoch s
    failures: list[str] = field(default_factory=list)
    cold: dict[str, float] | None = None  # the warm-up event's stages
    elapsed: float = 0.0

    def step(self, start: str, end: str) -> list[float]:
        return [e[end] - e[start] for e in self.events if start in e and end in e]

    @property
    def p99(self) -> float:
        values = self.step("visible", "POST")
        return percentile(values, 99) if values else float("inf")

    @property
    def detect_p99(self) -> float:
        values = self.step("visible", "polled")
        return percentile(values, 99) if values else float("inf")

    @property
    def met(self) -> bool:
        return (
            not self.failures
            and self.p99 <= TARGET_P99_S
            and self.detect_p99 <= TARGET_DETECT_P99_S
        )


def run_round(number: int, args: argparse.Namespace, host_config: Any, seed: int) -> Round:
    """One round on a fresh stack. Runs in a child process of its own: the Function App's
    composition root keeps its settings and clients for the life of a process, as in Azure,
    so a second host in one process would reach the previous round's (stopped) emulator."""
    rng = random.Random(seed)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    result = Round(number)
    stack: list[Callable[[], object]] = []
    started = time.monotonic()
    recorder = Recorder()
    watched = [logging.getLogger(LOGGER_NAME), logging.getLogger("sebridge.functions")]
    stack.append(recorder.watch_conversions())
    for logger in watched:
        logger.addHandler(recorder)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        stack.append(lambda logger=logger: logger.removeHandler(recorder))
    ids: list[tuple[str, float, dict[str, Any] | None]] = []  # (EventId, visible, POST)
    try:
        teams, arm, identity = FakeTeams(), FakeArm(), FakeIdentity()
        storage = FakeBlobStorage()  # the capacity guard's pool locks
        for fake in (teams, arm, identity, storage):
            fake.start()
            stack.append(fake.stop)
        lb = arm.add_load_balancer(SUBSCRIPTION, GROUP, "lb-web", ["pool-a"])
        arm.add_vm(SUBSCRIPTION, GROUP, VM, [f"{lb}/backendAddressPools/pool-a"])
        # A second member, so that LB_MIN_HEALTHY=1 lets lb-pools drain web-1.
        arm.add_vm(SUBSCRIPTION, GROUP, "web-spare", [f"{lb}/backendAddressPools/pool-a"])

        emulator_cm = running_emulator(ROOT / "infra" / "servicebus-emulator" / "Config.json")
        bus = emulator_cm.__enter__()
        stack.append(lambda: emulator_cm.__exit__(None, None, None))

        listener = listen()  # bound now: the Approve links name its port
        settings = {
            **app_settings_for_stand_ins(
                bus.connection_string,
                teams_url=teams.webhook_url,
                arm_url=arm.url,
                approval_base_url=f"http://127.0.0.1:{listener.getsockname()[1]}",
                identity=identity.environ(),
            ),
            "APPROVAL_POLICY": json.dumps(AUTO_APPROVE),
            "LB_POOL_STATE_URL": storage.container_url("sebridge-pools"),
        }
        host = FunctionsHost(
            ROOT / "function_app.py",
            settings,
            host_config=host_config,
            logger=logging.getLogger(LOGGER_NAME),
            listener=listener,
        )
        host.start()
        stack.append(host.stop)

        workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
        stack.append(lambda: shutil.rmtree(workdir, ignore_errors=True))
        scenario_file = workdir / "scenario.json"
        scenario_file.write_text(json.dumps(idle_world()))
        sim_process, sim_url = server("imds-sim", "--scenario", str(scenario_file))
        stack.append(sim_process.close)
        sim = SimClient(sim_url)

        fw = forwarder(
            sim_url,
            workdir / "state",
            "--connection-string",
            bus.connection_string,
            "--log-level",
            "DEBUG",
            dry_run=False,
            poll_interval=POLL_INTERVAL_S,
        )
        fw.start()
        stack.append(fw.close)
        if not fw.wait_for(lambda _: "receiving commands" in fw.stderr_text(), 30):
            raise RuntimeError(f"the forwarder did not start:\n{fw.stderr_text()[-2000:]}")
        time.sleep(1.5)  # let the functions host's receivers settle on their subscriptions

        last_post = 0.0
        for index in range(args.events + 1):  # event 0 warms the stack up (not counted)
            # One VM's approvals share IMDS's 5 requests/s with its poller (forwarder/
            # ratelimit.py: a command's GET + POST get 3 slots per 1.2 s window), so a command
            # within 1.2 s of the last one waits for a slot: a pace no single VM's events come
            # at. Start each event a window after the last POST, then at a random phase of the
            # poll cycle.
            time.sleep(max(0.0, last_post + IMDS_WINDOW_S - time.time()))
            time.sleep(rng.uniform(0.0, POLL_INTERVAL_S))
            event_id = str(uuid.uuid4())
            visible_at = time.time()
            sim.event(
                "add",
                notBeforeIn=600,
                event={
                    "EventId": event_id,
                    "EventType": args.event_type,
                    "ResourceType": "VirtualMachine",
                    "Resources": [VM],
                    "EventStatus": "Scheduled",
                    "EventSource": "Platform",
                    "DurationInSeconds": 5 if args.event_type == "Freeze" else -1,
                },
            )
            post: dict[str, Any] | None = None

            def posted(event_id: str = event_id) -> bool:
                nonlocal post
                post = next((p for p in sim.posts() if event_id in p["body"]), None)
                return post is not None

            if not wait_until(posted, args.round_timeout) or post is None:
                result.failures.append(
                    f"event {index}: no POST for {event_id} within {args.round_timeout:g} s"
                )
                if not fw.alive:
                    result.failures.append(f"the forwarder exited:\n{fw.stderr_text()[-2000:]}")
                    break
            ids.append((event_id, visible_at, post))
            last_post = time.time()
            try:
                sim.event("remove", eventId=event_id)  # Completed (or Cancelled): no pile-up
            except RuntimeError as exc:
                result.failures.append(f"event {index}: remove failed: {exc}")
        time.sleep(1.0)  # the last Completed through lb-pools before everything stops
        from_forwarder = forwarder_stages(fw.stderr_text())
        for number, (event_id, visible_at, post) in enumerate(ids):
            if post is None:
                seen = {**from_forwarder.get(event_id, {}), **recorder.stages(event_id)}
                reached = ", ".join(
                    f"{stage} {(when - visible_at) * 1000:.0f} ms"
                    for stage, when in sorted(seen.items(), key=lambda item: item[1])
                )
                lines = [line for line in fw.stderr_text().splitlines() if event_id in line]
                result.failures.append(
                    f"event {number} ({event_id}) reached: {reached or 'nothing'}; "
                    f"forwarder lines: {lines[-6:]}"
                )
                continue
            stages = {"visible": visible_at, "POST": epoch(post["time"]), "#": float(number)}
            stages.update(from_forwarder.get(event_id, {}))
            stages.update(recorder.stages(event_id))
            if number == 0:
                result.cold = stages
            else:
                result.events.append(stages)
    finally:
        for undo in reversed(stack):
            try:
                undo()
            except Exception as exc:
                print(f"e2e_latency: stopping failed: {exc}", file=sys.stderr)
    result.elapsed = time.monotonic() - started
    return result


def report(result: Round) -> None:
    print(
        f"== round {result.number}: {len(result.events)} event(s) in {result.elapsed:.0f} s, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for failure in result.failures:
        print(f"FAILED: {failure}")
    if not result.events:
        print("no event completed")
        return
    for start, end in STEPS:
        values = result.step(start, end)
        if values:
            print(f"  {start:>9} -> {end:<9} (n={len(values):>3}): {summary(values)}")
    slowest = sorted(
        (e for e in result.events if "POST" in e),
        key=lambda e: e["POST"] - e["visible"],
        reverse=True,
    )[:5]
    print("  slowest five (#0: the warm-up event, not counted), ms after visible (- = not seen):")
    print("    " + f"{'#':>3} " + " ".join(f"{stage:>9}" for stage in STAGES))
    for stages in [*slowest, *([result.cold] if result.cold else [])]:
        cells = [
            f"{(stages[s] - stages['visible']) * 1000:9.0f}" if s in stages else f"{'-':>9}"
            for s in STAGES
        ]
        print("    " + f"{stages['#']:3.0f} " + " ".join(cells))
    print(
        f"  visible -> POST p99 {result.p99 * 1000:.0f} ms (target {TARGET_P99_S * 1000:.0f}),"
        f" visible -> polled p99 {result.detect_p99 * 1000:.0f} ms"
        f" (target {TARGET_DETECT_P99_S * 1000:.0f}): {'met' if result.met else 'MISSED'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default %(default)s)")
    parser.add_argument(
        "--events", type=int, default=50, help="events per round (default %(default)s)"
    )
    parser.add_argument(
        "--event-type",
        default="Reboot",
        choices=["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"],
        help="EventType of the added events (default %(default)s: lb-pools drains web-1 too)",
    )
    parser.add_argument(
        "--round-timeout", type=float, default=15.0, help="give up on one event after S seconds"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for the random phase")
    parser.add_argument(
        "--session-idle-timeout",
        type=float,
        default=None,
        metavar="S",
        help="override host.json extensions.serviceBus.sessionIdleTimeout (default: host.json)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.events <= 1000 or not 1 <= args.rounds <= 10 or args.round_timeout <= 0:
        parser.error("--events must be 1..1000, --rounds 1..10 and --round-timeout positive")
    if args.session_idle_timeout is not None and not 0.1 <= args.session_idle_timeout <= 300:
        parser.error("--session-idle-timeout must be 0.1..300 seconds")
    host_config = read_host_json(ROOT)
    if args.session_idle_timeout is not None:
        idle = timedelta(seconds=args.session_idle_timeout)
        host_config = replace(
            host_config, service_bus=replace(host_config.service_bus, session_idle_timeout=idle)
        )
    sb_options = host_config.service_bus
    seeds = random.Random(args.seed)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)

    print(f"command: python benchmarks/e2e_latency.py {' '.join(argv or sys.argv[1:])}".strip())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        f"loop: IMDS simulator -> forwarder (poll {POLL_INTERVAL_S:g} s) -> Service Bus emulator"
        f" -> functions host (approval-gate, policy approve-all; teams, lb-pools too) ->"
        f" approvals queue -> forwarder -> IMDS POST; {args.event_type} events on {VM}"
    )
    print(
        f"functions host: maxConcurrentSessions {sb_options.max_concurrent_sessions}, "
        f"sessionIdleTimeout {sb_options.session_idle_timeout.total_seconds():g} s"
        + (" (overridden)" if args.session_idle_timeout is not None else " (host.json)"),
        flush=True,
    )
    rounds: list[Round] = []
    for number in range(1, args.rounds + 1):
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            seed = seeds.randrange(2**32)
            rounds.append(pool.apply(run_round, (number, args, host_config, seed)))
        report(rounds[-1])
        sys.stdout.flush()
    worst = max(rounds, key=lambda r: (not r.met, r.p99))
    print(
        f"worst round: {worst.number}: visible -> POST p99 {worst.p99 * 1000:.0f} ms, "
        f"visible -> polled p99 {worst.detect_p99 * 1000:.0f} ms; "
        f"{sum(r.met for r in rounds)} of {len(rounds)} round(s) met both targets"
    )
    return 0 if all(r.met for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
