"""End-to-end latency: Scheduled event visible in IMDS -> StartRequests POST at IMDS (a benchmark).

    python benchmarks/e2e_latency.py [--events 50] [--event-type Reboot]

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
`sebridge forwarder` (child process, not dry-run, --poll-interval 1).

Each round waits a random 0..1 s (so the event lands at a random phase of the poll cycle),
takes the time, adds one Scheduled event (POST /_sim/event, NotBefore in 600 s), and waits for
the simulator to record the StartRequests POST for its EventId; the latency is the POST's
recorded wall-clock time minus the time taken just before the add (conservative). The event
is then removed (Completed). Rounds are sequential. The forwarder's own log gives the split:
visible -> detected (the poll phase) and detected -> POST (Service Bus, the gate, the command
back). Target: p99 <= 2 s. Bounded: at most --events rounds of at most --round-timeout s.

Every event is its own session (session_id = EventId), and a session-enabled trigger keeps an
idle session for host.json's sessionIdleTimeout on one of maxConcurrentSessions receivers, so
a function takes at most about maxConcurrentSessions new events per sessionIdleTimeout. The
functions host here reads the project's host.json (maxConcurrentSessions 16, sessionIdleTimeout
00:00:02: about 16 new events per 2 s, far more than these sequential rounds bring); the output
prints the two values in effect. --session-idle-timeout S overrides sessionIdleTimeout alone
(maxConcurrentSessions and everything else stay as host.json says), e.g. 30 to see what a long
hold costs: once more new events arrive than 16 per 30 s, rounds wait for a free session.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import re
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulators.demo import GROUP, SUBSCRIPTION, free_port  # noqa: E402
from emulators.fakes.arm import FakeArm  # noqa: E402
from emulators.fakes.identity import FakeIdentity  # noqa: E402
from emulators.fakes.storage import FakeBlobStorage  # noqa: E402
from emulators.fakes.teams import FakeTeams  # noqa: E402
from emulators.functions_host.host import FunctionsHost, read_host_json  # noqa: E402
from emulators.imds.testing import SimClient  # noqa: E402
from emulators.processes import forwarder, server  # noqa: E402
from emulators.servicebus.testing import running_emulator  # noqa: E402

VM = "web-1"
TARGET_P99_S = 2.0
AUTO_APPROVE = {
    "rules": [{"name": "benchmark-approve-all", "match": {}, "action": "approve"}],
    "default": "approve",
}
# forwarder text log: "<iso time> INFO    forwarder.service: Scheduled <id> (Reboot, ...) ..."
_DETECTED = re.compile(r"^(\S+) INFO\s+\S+: Scheduled ([0-9a-fA-F-]{36}) \(")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"p50 {percentile(ms, 50):.0f} ms, p95 {percentile(ms, 95):.0f} ms, "
        f"p99 {percentile(ms, 99):.0f} ms, max {max(ms):.0f} ms, mean {statistics.mean(ms):.0f} ms"
    )


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


def detections(stderr_text: str) -> dict[str, float]:
    """EventId (lower case) -> when the forwarder logged its Scheduled transition (epoch s)."""
    out: dict[str, float] = {}
    for line in stderr_text.splitlines():
        match = _DETECTED.match(line)
        if match:
            out[match.group(2).lower()] = datetime.fromisoformat(match.group(1)).timestamp()
    return out


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=50, help="rounds (default %(default)s)")
    parser.add_argument(
        "--event-type",
        default="Reboot",
        choices=["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"],
        help="EventType of the added events (default %(default)s: lb-pools drains web-1 too)",
    )
    parser.add_argument(
        "--round-timeout", type=float, default=15.0, help="give up on one round after S seconds"
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
    if not 1 <= args.events <= 1000 or args.round_timeout <= 0:
        parser.error("--events must be 1..1000 and --round-timeout positive")
    if args.session_idle_timeout is not None and not 0.1 <= args.session_idle_timeout <= 300:
        parser.error("--session-idle-timeout must be 0.1..300 seconds")
    host_config = read_host_json(ROOT)
    if args.session_idle_timeout is not None:
        idle = timedelta(seconds=args.session_idle_timeout)
        host_config = replace(
            host_config, service_bus=replace(host_config.service_bus, session_idle_timeout=idle)
        )
    sb_options = host_config.service_bus
    host_line = (
        f"functions host: maxConcurrentSessions {sb_options.max_concurrent_sessions}, "
        f"sessionIdleTimeout {sb_options.session_idle_timeout.total_seconds():g} s"
        + (" (overridden)" if args.session_idle_timeout is not None else " (host.json)")
    )
    rng = random.Random(args.seed)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)

    stack: list[Callable[[], object]] = []
    latencies: list[float] = []
    poll_phase: list[float] = []  # visible -> forwarder logged Scheduled
    pipeline: list[float] = []  # forwarder logged Scheduled -> POST recorded
    failures: list[str] = []
    started = time.monotonic()
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

        http_port = free_port()
        settings = {
            "ServiceBusConnection": bus.connection_string,
            "TopicName": "scheduled-events",
            "TeamsSubscriptionName": "teams",
            "LbPoolsSubscriptionName": "lb-pools",
            "ApprovalGateSubscriptionName": "approval-gate",
            "ApprovalsQueueName": "approvals",
            "TEAMS_WEBHOOK_URL": teams.webhook_url,
            "APPROVAL_SIGNING_KEY": secrets.token_urlsafe(32),
            "APPROVAL_BASE_URL": f"http://127.0.0.1:{http_port}",
            "APPROVAL_POLICY": json.dumps(AUTO_APPROVE),
            "ARM_ENDPOINT": arm.url,
            "LB_POOL_STATE_URL": storage.container_url("sebridge-pools"),
            **identity.environ(),
        }
        host_logger = logging.getLogger("sebridge.bench.functions-host")
        host_logger.setLevel(logging.ERROR)
        host = FunctionsHost(
            ROOT / "function_app.py",
            settings,
            host_config=host_config,
            logger=host_logger,
            port=http_port,
        )
        host.start()
        stack.append(host.stop)

        workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
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
            dry_run=False,
            poll_interval=1.0,
        )
        fw.start()
        stack.append(fw.close)
        if not fw.wait_for(lambda _: "receiving commands" in fw.stderr_text(), 30):
            raise RuntimeError(f"the forwarder did not start:\n{fw.stderr_text()[-2000:]}")
        time.sleep(1.5)  # let the functions host's receivers settle on their subscriptions

        for round_number in range(args.events):
            time.sleep(rng.uniform(0.0, 1.0))  # random phase relative to the 1 s poll cycle
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
                failures.append(
                    f"round {round_number}: no POST for {event_id} within {args.round_timeout:g} s"
                )
                if not fw.alive:
                    failures.append(f"the forwarder exited:\n{fw.stderr_text()[-2000:]}")
                    break
                try:
                    sim.event("remove", eventId=event_id)  # Cancelled: not left to pile up
                except RuntimeError as exc:
                    failures.append(f"round {round_number}: remove failed: {exc}")
                continue
            received = datetime.fromisoformat(post["time"].replace("Z", "+00:00")).timestamp()
            latencies.append(received - visible_at)
            detected = detections(fw.stderr_text()).get(event_id)
            if detected is not None:
                poll_phase.append(detected - visible_at)
                pipeline.append(received - detected)
            try:
                sim.event("remove", eventId=event_id)  # Started after the POST; now Completed
            except RuntimeError as exc:
                failures.append(f"round {round_number}: remove failed: {exc}")
        time.sleep(1.0)  # the last Completed through lb-pools before everything stops
    finally:
        for undo in reversed(stack):
            try:
                undo()
            except Exception as exc:
                print(f"e2e_latency: stopping failed: {exc}", file=sys.stderr)

    elapsed = time.monotonic() - started
    print(f"command: python benchmarks/e2e_latency.py {' '.join(argv or sys.argv[1:])}".strip())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        f"loop: IMDS simulator -> forwarder (poll 1 s) -> Service Bus emulator -> functions host"
        f" (approval-gate, policy approve-all; teams, lb-pools too) -> approvals queue ->"
        f" forwarder -> IMDS POST; {args.event_type} events on {VM}; run took {elapsed:.0f} s"
    )
    print(host_line)
    for failure in failures:
        print(f"FAILED: {failure}")
    if not latencies:
        print("no round completed")
        return 1
    print(f"end to end, visible -> POST (n={len(latencies)}): {summary(latencies)}")
    if poll_phase:
        print(f"  visible -> forwarder detected (n={len(poll_phase)}): {summary(poll_phase)}")
        print(f"  detected -> POST (n={len(pipeline)}): {summary(pipeline)}")
    p99 = percentile(latencies, 99)
    met = p99 <= TARGET_P99_S and not failures
    print(
        f"p99 {p99 * 1000:.0f} ms vs target {TARGET_P99_S * 1000:.0f} ms: "
        f"{'met' if met else 'MISSED'}"
        + ("" if not failures else f" ({len(failures)} round(s) failed)")
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
