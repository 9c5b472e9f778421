"""Burst: 50 Scheduled events at once on 50 VMs in 5 backend pools of 10 (a benchmark).

    python benchmarks/burst.py [--hosts 1] [--vms 50] [--pools 5] [--min-healthy 1]

The real function_app.py runs in the local functions host (child processes) against the
Service Bus emulator (child process), with ARM (VMs, NICs, one load balancer with one probed
rule per pool), managed identity, Teams and blob storage (the pools' leases and held events)
played by the loopback fakes in this process. Every VM reports one Reboot (NotBefore in 10
minutes) for itself; all of them are put on the topic in one batch, under the default approval
policy (prepare-first).

Measured per event, on one clock (this machine's wall clock), from just before the batch is
sent to the topic:
- decision: -> the drain (the ARM fake's record of the NIC leaving its pool) or the hold (lb-pools
  logging the hold, once it is saved under the pool's lease, just before Held is published; the
  host's log line carries the time);
- approval: -> the approve command on the approvals queue (the gate logging "approve command
  sent" once the SDK send returned); drained events only: a held event is not approved early,
  and the run fails if one is.
Checked from ARM's record of every pool change, replayed in order: no pool ever had fewer than
LB_MIN_HEALTHY healthy members (all probes are Up here, so members = healthy). Targets: decision
p99 <= 3 s and zero violations; the run exits 1 when one is missed. Bounded: one burst, at most
--timeout seconds of waiting.

Sessions: every event is its own session, and a session-enabled trigger keeps an idle session
for host.json's sessionIdleTimeout on one of maxConcurrentSessions receivers, so one host
instance takes about maxConcurrentSessions new events per sessionIdleTimeout per function (and
the local host caps receivers at 32 per trigger). In Azure the app scales out under a backlog;
--hosts N runs N functions-host processes on the same subscriptions, as N instances of the
app. --session-idle-timeout and --max-concurrent-sessions override host.json's two values
(everything else as host.json says); the output says which values were in effect.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from azure.servicebus import ServiceBusClient  # noqa: E402

from benchmarks.stats import percentile, summary  # noqa: E402
from emulators.demo.world import app_settings_for_stand_ins  # noqa: E402
from emulators.fakes.arm import FakeArm, simulator_vm_id  # noqa: E402
from emulators.fakes.identity import FakeIdentity  # noqa: E402
from emulators.fakes.storage import FakeBlobStorage  # noqa: E402
from emulators.fakes.teams import FakeTeams  # noqa: E402
from emulators.functions_host.host import FunctionsHost, read_host_json  # noqa: E402
from emulators.functions_host.hostconfig import HostConfig  # noqa: E402
from emulators.functions_host.logs import JsonFormatter as HostJsonFormatter  # noqa: E402
from emulators.processes import ChildProcess  # noqa: E402
from emulators.servicebus.testing import running_emulator  # noqa: E402
from sebridge.contract.events import Observer, Transition, event_message  # noqa: E402
from sebridge.imds import Document  # noqa: E402
from sebridge.logs import JsonFormatter  # noqa: E402
from sebridge.servicebus import envelope_message  # noqa: E402
from sebridge.signals import StopSignals  # noqa: E402

SUBSCRIPTION = "00000000-0000-4000-8000-0000000000b5"
GROUP = "rg-burst"
TARGET_DECISION_P99_S = 3.0


APPROVED = "approve command sent"
HELD = " held, VMs "


# Flex Consumption (infra/modules/functionapp.bicep) scales per function: each Service Bus
# function on instances of its own, the HTTP functions as one group. --scaling per-function
# runs one functions-host process for each group (per instance); --scaling app runs the whole
# app in each process, as a plan that scales the app as one would.
FUNCTION_GROUPS = (("lb_pools",), ("approval_gate",), ("teams",), ("approve",))


def serve(settings_file: str, host_config: HostConfig, functions: list[str] | None) -> int:
    """The functions host in a process of its own (so that the fakes in the benchmark's process
    do not share its interpreter lock): runs until SIGTERM; what the workflows log about holds
    and approvals goes to stderr as JSON lines, with the time they happened."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("sebridge.functions.approval_gate", "sebridge.functions.lb_pools"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    settings = json.loads(Path(settings_file).read_text())
    host_log = logging.getLogger("sebridge.bench.functions-host")
    host_log.setLevel(logging.INFO)  # its "invocation" events: which function, how long
    host_handler = logging.StreamHandler(sys.stderr)
    host_handler.setFormatter(HostJsonFormatter())
    host_log.addHandler(host_handler)
    host_log.propagate = False
    host = FunctionsHost(
        ROOT / "function_app.py",
        settings,
        host_config=host_config,
        logger=host_log,
        port=0,
        functions=functions,
    )
    stop = threading.Event()
    StopSignals(stop, (signal.SIGTERM,)).install()  # no lock taken in a signal handler
    host.start()
    print(f"listening on {host.url}", flush=True)
    stop.wait(3600)
    host.stop()
    return 0


def logged(stderr_text: str) -> tuple[dict[str, float], dict[str, float]]:
    """(approved, held): EventId -> when the host logged it (epoch seconds)."""
    approved: dict[str, float] = {}
    held: dict[str, float] = {}
    for entry in json_lines(stderr_text):
        event_id, message = entry.get("eventId"), entry.get("message", "")
        if not isinstance(event_id, str):
            continue
        at = datetime.fromisoformat(str(entry["time"]).replace("Z", "+00:00")).timestamp()
        if message == APPROVED:
            approved.setdefault(event_id, at)
        elif HELD in message:
            held.setdefault(event_id, at)
    return approved, held


def lb_pools_invocations(stderr_text: str) -> dict[str, tuple[float, float]]:
    """EventId (the session) -> (start, duration) of its first lb-pools invocation."""
    out: dict[str, tuple[float, float]] = {}
    for entry in json_lines(stderr_text):
        if entry.get("event") != "invocation" or entry.get("function") != "lb_pools":
            continue
        end = datetime.fromisoformat(str(entry["time"]).replace("Z", "+00:00")).timestamp()
        duration = float(entry.get("duration_ms", 0)) / 1000
        out.setdefault(str(entry.get("session")), (end - duration, duration))
    return out


def json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "time" in entry:
                out.append(entry)
    return out


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def violations(arm: FakeArm, pools: dict[str, list[str]], minimum: int) -> list[str]:
    """Replay ARM's pool changes in order; every moment a pool had fewer than ``minimum``
    members (all probes are Up in this world, so members are the healthy ones)."""
    members = {pool.lower(): {ipc.lower() for ipc in ipcs} for pool, ipcs in pools.items()}
    found: list[str] = []
    for change in sorted(arm.pool_events, key=lambda c: c.at):
        pool = members.setdefault(change.pool.lower(), set())
        (pool.add if change.joined else pool.discard)(change.ip_configuration)
        if not change.joined and len(pool) < minimum:
            found.append(f"{change.pool.split('/')[-1]} down to {len(pool)} when {change.nic} left")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vms", type=int, default=50, help="VMs, one event each (%(default)s)")
    parser.add_argument("--pools", type=int, default=5, help="backend pools (%(default)s)")
    parser.add_argument("--min-healthy", type=int, default=1, help="LB_MIN_HEALTHY (%(default)s)")
    parser.add_argument("--timeout", type=float, default=120.0, help="wait at most (s)")
    parser.add_argument("--session-idle-timeout", type=float, default=None, metavar="S")
    parser.add_argument("--max-concurrent-sessions", type=int, default=None, metavar="N")
    parser.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="functions-host processes, as instances of a scaled-out app (%(default)s)",
    )
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=64,
        metavar="N",
        help="PYTHON_THREADPOOL_THREAD_COUNT, the Python worker's threads for sync functions "
        "(%(default)s, as infra/modules/functionapp.bicep sets it)",
    )
    parser.add_argument(
        "--nic-write-latency",
        type=float,
        default=0.0,
        metavar="S",
        help="every NIC PUT waits S seconds in the ARM fake, as ARM's long-running operation "
        "does (%(default)s)",
    )
    parser.add_argument(
        "--scaling",
        choices=("per-function", "app"),
        default="per-function",
        help="per-function: a host process per function (per instance), as Flex Consumption "
        "scales the deployed app; app: every function in one process (%(default)s)",
    )
    parser.add_argument("--serve", metavar="SETTINGS", help=argparse.SUPPRESS)  # the child
    parser.add_argument("--serve-functions", metavar="NAMES", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 1 <= args.pools <= args.vms <= 500 or not 0 <= args.min_healthy <= 100:
        parser.error("need 1 <= pools <= vms <= 500 and 0 <= min-healthy <= 100")
    if not 1 <= args.hosts <= 8:
        parser.error("--hosts must be 1..8")
    host_config = read_host_json(ROOT)
    options = host_config.service_bus
    if args.session_idle_timeout is not None:
        options = replace(
            options, session_idle_timeout=timedelta(seconds=args.session_idle_timeout)
        )
    if args.max_concurrent_sessions is not None:
        options = replace(options, max_concurrent_sessions=args.max_concurrent_sessions)
    host_config = replace(host_config, service_bus=options)
    if args.serve:
        names = args.serve_functions.split(",") if args.serve_functions else None
        return serve(args.serve, host_config, names)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)

    started = time.monotonic()
    batches = 0
    stack: list[Callable[[], object]] = []
    failures: list[str] = []
    decisions: dict[str, float] = {}
    approvals: dict[str, float] = {}
    held: set[str] = set()
    drained: set[str] = set()
    found: list[str] = []
    waited: dict[str, float] = {}  # sent -> lb-pools invocation started (receivers, sessions)
    worked: dict[str, float] = {}  # lb-pools invocation, start to end (scope, guard, drain)
    try:
        teams, arm, identity, storage = FakeTeams(), FakeArm(), FakeIdentity(), FakeBlobStorage()
        for fake in (teams, arm, identity, storage):
            fake.start()
            stack.append(fake.stop)
        pool_names = [f"pool-{n}" for n in range(args.pools)]
        lb = arm.add_load_balancer(
            SUBSCRIPTION, GROUP, "lb-burst", pool_names, rules={f"rule-{p}": p for p in pool_names}
        )
        if args.nic_write_latency > 0:
            arm.slow(
                args.nic_write_latency,
                method="PUT",
                path_contains="/networkInterfaces/",
                times=10 * args.vms,
            )
        vm_pool: dict[str, str] = {}
        members: dict[str, list[str]] = {}
        for n in range(args.vms):
            vm, pool = f"vm-{n:03d}", f"{lb}/backendAddressPools/{pool_names[n % args.pools]}"
            arm.add_vm(SUBSCRIPTION, GROUP, vm, [pool])
            vm_pool[vm] = pool
            members.setdefault(pool, []).append(arm.pool_members(pool)[-1])
        members = {pool: arm.pool_members(pool) for pool in members}

        emulator = running_emulator(ROOT / "infra" / "servicebus-emulator" / "Config.json")
        bus = emulator.__enter__()
        stack.append(lambda: emulator.__exit__(None, None, None))
        settings = {
            **app_settings_for_stand_ins(
                bus.connection_string,
                teams_url=teams.webhook_url,
                arm_url=arm.url,
                approval_base_url="http://127.0.0.1:9",
                identity=identity.environ(),
            ),
            "LB_MIN_HEALTHY": str(args.min_healthy),
            "LB_POOL_STATE_URL": storage.container_url("sebridge-pools"),
            "PYTHON_THREADPOOL_THREAD_COUNT": str(args.worker_threads),
        }
        workdir = Path(tempfile.mkdtemp(prefix="bench-burst-"))
        stack.append(lambda: shutil.rmtree(workdir, ignore_errors=True))
        settings_file = workdir / "settings.json"
        settings_file.write_text(json.dumps(settings))
        hosts: list[ChildProcess] = []
        groups: tuple[tuple[str, ...] | None, ...] = (
            FUNCTION_GROUPS if args.scaling == "per-function" else (None,)
        )
        for n in range(args.hosts):
            for group in groups:
                child = ChildProcess(f"burst-host-{n}-{'+'.join(group or ('app',))}", [])
                child.argv = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--serve",
                    str(settings_file),
                ]
                if group is not None:
                    child.argv += ["--serve-functions", ",".join(group)]
                if args.session_idle_timeout is not None:
                    child.argv += ["--session-idle-timeout", str(args.session_idle_timeout)]
                if args.max_concurrent_sessions is not None:
                    child.argv += ["--max-concurrent-sessions", str(args.max_concurrent_sessions)]
                child.start()
                stack.append(child.close)
                hosts.append(child)
        for child in hosts:
            child.wait_for_line("listening on ", timeout=60)
        time.sleep(1.5)  # let the receivers settle on their subscriptions

        def host_logs() -> str:
            return "\n".join(child.stderr_text() for child in hosts)

        not_before = (datetime.now(UTC) + timedelta(minutes=10)).strftime(
            "%a, %d %b %Y %H:%M:%S GMT"
        )
        envelopes = []
        for n, vm in enumerate(vm_pool):
            event_id = f"{n:08x}-b0b0-4b0b-8b0b-00000000b0b0"
            fields = {
                "EventId": event_id,
                "EventType": "Reboot",
                "ResourceType": "VirtualMachine",
                "Resources": [vm],
                "EventStatus": "Scheduled",
                "NotBefore": not_before,
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
            (event,) = Document.from_imds({"DocumentIncarnation": 1, "Events": [fields]}).events
            observer = Observer(
                vm_name=vm,
                vm_id=simulator_vm_id(vm),
                resource_id=f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/"
                f"Microsoft.Compute/virtualMachines/{vm}",
                subscription_id=SUBSCRIPTION,
                resource_group=GROUP,
            )
            envelopes.append(
                event_message(Transition.SCHEDULED, event, observer, 1, datetime.now(UTC))
            )
        with (
            ServiceBusClient.from_connection_string(bus.connection_string) as client,
            client.get_topic_sender("scheduled-events") as sender,
        ):
            batch = sender.create_message_batch()
            for envelope in envelopes:
                batch.add_message(envelope_message(envelope))
            # The clock starts before the send: the events are on the topic a little later, so
            # every latency below is, if anything, overstated.
            sent_at = time.time()
            sender.send_messages(batch, timeout=30)

        vm_of_nic = {f"{vm}-nic": vm for vm in vm_pool}
        event_of_vm = {vm: f"{n:08x}-b0b0-4b0b-8b0b-00000000b0b0" for n, vm in enumerate(vm_pool)}

        def drains() -> dict[str, float]:
            return {
                event_of_vm[vm_of_nic[e.nic]]: e.at for e in list(arm.pool_events) if not e.joined
            }

        if not wait_until(
            lambda: len(drains()) + len(logged(host_logs())[1]) >= args.vms, args.timeout
        ):
            failures.append(f"not every event was decided within {args.timeout:g} s")
        wait_until(lambda: len(logged(host_logs())[0]) >= len(drains()), args.timeout)
        time.sleep(1.0)  # anything late (a second decision, an early approval) shows up now
        approved_at, held_at = logged(host_logs())
        for event_id, at in drains().items():
            drained.add(event_id)
            decisions[event_id] = at - sent_at
        for event_id, at in held_at.items():
            held.add(event_id)
            decisions.setdefault(event_id, at - sent_at)
        for event_id, at in approved_at.items():
            approvals[event_id] = at - sent_at
        for event_id, (start, duration) in lb_pools_invocations(host_logs()).items():
            waited[event_id] = start - sent_at
            worked[event_id] = duration
        both = sorted(drained & held)
        if both:
            failures.append(f"{len(both)} event(s) both drained and held: {both[:3]}")
        early = sorted(set(approvals) & held)
        if early:
            failures.append(f"{len(early)} held event(s) approved early: {early[:3]}")
        if len(approvals) < len(drained):
            failures.append(f"{len(drained) - len(approvals)} drained event(s) never approved")

        def held_cards() -> int:
            return sum(1 for card in list(teams.cards) if "held: " in json.dumps(card).lower())

        wait_until(lambda: held_cards() >= len(held), 30)
        held_messages = held_cards()
        if held_messages < len(held):
            failures.append(f"{len(held)} held but only {held_messages} Held card(s) in Teams")
        found = violations(arm, members, args.min_healthy)
        # How the decisions were grouped: each lease taken on a pool is one batch of decisions.
        batches = sum(
            1 for call in storage.lease_log if call.action == "acquire" and call.status == 201
        )
        expected_held = args.pools * min(args.min_healthy, args.vms // args.pools)
        if len(held) != expected_held:
            failures.append(f"{len(held)} held, expected {expected_held} (min per pool kept)")
    finally:
        for undo in reversed(stack):
            try:
                undo()
            except Exception as exc:
                print(f"burst: stopping failed: {exc}", file=sys.stderr)

    elapsed = time.monotonic() - started
    print(f"command: python benchmarks/burst.py {' '.join(argv or sys.argv[1:])}".strip())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        f"world: {args.vms} VMs in {args.pools} pools of {args.vms // args.pools} behind one load "
        f"balancer (one probed rule per pool), LB_MIN_HEALTHY={args.min_healthy}; "
        f"{args.vms} Scheduled Reboots in one batch; run took {elapsed:.0f} s"
    )
    print(
        f"functions hosts: {args.hosts} instance(s) of the app, "
        + (
            f"each one process per function ({', '.join('+'.join(g) for g in FUNCTION_GROUPS)}: "
            "Flex Consumption's per-function scaling)"
            if args.scaling == "per-function"
            else "each one process running every function"
        )
        + f", {args.worker_threads} worker threads per process; maxConcurrentSessions "
        f"{options.max_concurrent_sessions}, "
        f"sessionIdleTimeout {options.session_idle_timeout.total_seconds():g} s"
        + (
            " (overridden)"
            if args.session_idle_timeout is not None or args.max_concurrent_sessions is not None
            else " (host.json)"
        )
    )
    print(f"outcome: {len(drained)} drained, {len(held)} held, {len(approvals)} approved")
    for failure in failures:
        print(f"FAILED: {failure}")
    if decisions:
        values = list(decisions.values())
        print(f"decision, Scheduled -> drain or hold (n={len(values)}): {summary(values)}")
    if approvals:
        values = list(approvals.values())
        print(f"approval, Scheduled -> approve command (n={len(values)}): {summary(values)}")
    if waited:
        print(f"  of which: sent -> lb-pools invocation started: {summary(list(waited.values()))}")
        print(f"  of which: lb-pools invocation, start to end: {summary(list(worked.values()))}")
    print(
        f"decision batches: {batches} leases taken on the {args.pools} pools for "
        f"{len(decisions)} events (a batch decides the events that queued while the one "
        "before it was decided)"
    )
    print(f"pool minimum violations (replayed from ARM's changes): {len(found)}")
    for violation in found[:10]:
        print(f"  {violation}")
    p99 = percentile(list(decisions.values()), 99) if decisions else float("inf")
    met = p99 <= TARGET_DECISION_P99_S and not found and not failures
    print(
        f"decision p99 {p99 * 1000:.0f} ms vs target {TARGET_DECISION_P99_S * 1000:.0f} ms, "
        f"violations {len(found)} vs 0: {'met' if met else 'MISSED'}"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
