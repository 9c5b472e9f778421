"""Fleet: N forwarders see one event; exactly one message per transition per subscription.

    python benchmarks/fleet.py [--forwarders 200] [--wave 20]

One IMDS simulator serves the whole fleet through its /vm/<name>/ prefix: forwarder i polls
http://127.0.0.1:P/vm/vm-<i> (so its instance metadata names it vm-<i>) and every VM sees the
same events, as every VM of an availability set or scale-set placement group does in Azure.
All forwarders are real `sebridge forwarder` processes (not dry-run, --poll-interval 1,
--heartbeat-interval 0) publishing to one Service Bus emulator (the project's entities). Each
transition reaches the topic N times with the same message id; duplicate detection must
collapse them to one message per transition on every subscription.

The run, bounded by --timeout overall:
1. the emulator and the simulator start (idle scenario); forwarders start in waves of --wave,
   each wave waiting until all its forwarders have polled IMDS (the simulator counts GETs per
   VM), so 2 cores are not asked to import N Python programs at once;
2. one Reboot event is added with a long notice (NotBefore in 15 min), then stepped to Started
   (POST /_sim/event op start) and removed (op remove): Scheduled, Started, Completed. Each step
   waits until every forwarder has logged the transition and its outbox no longer holds the
   message (= it was accepted by the broker), then records the time from the step to the last
   forwarder's detection and publication;
3. every subscription (teams, lb-pools, approval-gate, audit; all session-enabled) is drained
   with NEXT_AVAILABLE_SESSION receivers and counted per Service Bus subject (= transition).
Figures: the counts, time to start the fleet, per-transition spread, CPU seconds and RSS of the
emulator, the simulator and the forwarders (from /proc). Exit 0 when every subscription got
exactly one message per transition it subscribes to and every forwarder published every one.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient  # noqa: E402
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError  # noqa: E402

from emulators.imds.testing import SimClient  # noqa: E402
from emulators.processes import ChildProcess, forwarder, server  # noqa: E402
from emulators.servicebus.testing import EmulatorProcess, running_emulator  # noqa: E402

CONFIG = ROOT / "infra" / "servicebus-emulator" / "Config.json"
IDLE_SCENARIO = ROOT / "benchmarks" / "idle-scenario.json"
TOPIC = "scheduled-events"
TRANSITIONS = ("Scheduled", "Started", "Completed")
# What each subscription's SQL filter lets through, of the transitions this run produces.
EXPECTED: dict[str, dict[str, int]] = {
    "teams": {"Scheduled": 1, "Started": 1, "Completed": 1},
    "lb-pools": {"Scheduled": 1, "Started": 1, "Completed": 1},
    "approval-gate": {"Scheduled": 1},
    "audit": {"Scheduled": 1, "Started": 1, "Completed": 1},
}
# forwarder text log: "<iso time> INFO    forwarder.service: Started <id> (Reboot, Started) ..."
_TRANSITION_LINE = re.compile(
    r"^(\S+) INFO\s+\S+: (Scheduled|Updated|Started|Completed|Cancelled) ([0-9a-fA-F-]{36}) \("
)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- /proc --------------------------------------------------------------------------------
def cpu_seconds(pid: int | None) -> float:
    """utime + stime of one process (0 if it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Usage:
    """CPU seconds and RSS (MiB) of one group of processes at one moment."""

    cpu: float
    rss: list[float]

    @classmethod
    def of(cls, pids: list[int | None]) -> Usage:
        return cls(sum(cpu_seconds(p) for p in pids), [rss_mib(p) for p in pids])


# -- one forwarder --------------------------------------------------------------------------
@dataclass
class Member:
    vm: str
    state_dir: Path
    child: ChildProcess
    started_at: float = 0.0
    detected: dict[str, float] = field(default_factory=dict)  # message id -> logged (epoch s)
    published: dict[str, float] = field(default_factory=dict)  # message id -> seen sent (epoch)
    _db: sqlite3.Connection | None = None
    _log_offset: int = 0
    _log_rest: str = ""

    @property
    def pid(self) -> int | None:
        return None if self.child.process is None else self.child.process.pid

    def scan_log(self) -> None:
        """Record transitions logged since the last scan (the log is an append-only file)."""
        log = self.child.stderr_path
        if log is None:
            return
        with open(log, encoding="utf-8", errors="replace") as handle:
            handle.seek(self._log_offset)
            chunk = handle.read()
            self._log_offset = handle.tell()
        lines = (self._log_rest + chunk).split("\n")
        self._log_rest = lines.pop()
        for line in lines:
            match = _TRANSITION_LINE.match(line)
            if match:
                key = f"{match.group(3).lower()}:{match.group(2)}:1"  # first appearance
                at = datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()
                self.detected.setdefault(key, at)

    def pending(self, message_id: str) -> bool:
        """True while the message is still in this forwarder's outbox (not yet sent)."""
        if self._db is None:
            path = self.state_dir / "outbox.sqlite3"
            if not path.exists():
                return True
            self._db = sqlite3.connect(path, timeout=1.0, check_same_thread=False)
        try:
            row = self._db.execute(
                "SELECT 1 FROM outbox WHERE message_id = ?", (message_id,)
            ).fetchone()
        except sqlite3.Error:
            return True
        return row is not None

    def close_db(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


# -- the run ----------------------------------------------------------------------------------
@dataclass
class StepResult:
    transition: str
    detected: int = 0
    published: int = 0
    last_detected_s: float | None = None
    last_published_s: float | None = None
    first_published_s: float | None = None


@dataclass
class FleetResult:
    forwarders: int
    event_id: str = ""
    start_seconds: float = 0.0
    polling: int = 0
    steps: list[StepResult] = field(default_factory=list)
    subscriptions: dict[str, dict[str, int]] = field(default_factory=dict)
    message_ids_ok: bool = True
    usage: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    total_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def published_total(self) -> int:
        return sum(step.published for step in self.steps)


def vm_name(index: int) -> str:
    return f"vm-{index:03d}"


@contextmanager
def fleet_processes(
    sim_url: str, connection_string: str, n: int, workdir: Path
) -> Iterator[list[Member]]:
    """N forwarder children (not started); all stopped at the end: SIGTERM to all, then wait."""
    members = [
        Member(
            vm=vm_name(i),
            state_dir=workdir / vm_name(i),
            child=forwarder(
                f"{sim_url}/vm/{vm_name(i)}",
                workdir / vm_name(i),
                "--connection-string",
                connection_string,
                dry_run=False,
                poll_interval=1.0,
                heartbeat_interval=0,
            ),
        )
        for i in range(n)
    ]
    try:
        yield members
    finally:
        for member in members:
            member.close_db()
            process = member.child.process
            if process is not None and process.poll() is None:
                with suppress(OSError):
                    process.send_signal(signal.SIGTERM)
        for member in members:
            member.child.close()  # waits for the SIGTERM, SIGKILL after 10 s


def start_in_waves(
    members: list[Member],
    sim: SimClient,
    wave: int,
    deadline: float,
    say: Callable[[str], None],
) -> int:
    """Start the forwarders ``wave`` at a time; returns how many have polled IMDS."""
    polled: set[str] = set()

    def polling_now() -> set[str]:
        requests = sim.state()["requests"]
        return {m.vm for m in members if requests.get(f"get:{m.vm}", 0) > 0}

    for first in range(0, len(members), wave):
        batch = members[first : first + wave]
        for member in batch:
            member.child.start()
            member.started_at = time.monotonic()
        names = {m.vm for m in batch}
        while time.monotonic() < deadline:
            polled = polling_now()
            if names <= polled:
                break
            dead = [m.vm for m in batch if not m.child.alive]
            if dead:
                raise RuntimeError(
                    f"forwarder(s) {dead[:5]} exited at start:\n"
                    + batch[0].child.stderr_text()[-2000:]
                )
            time.sleep(0.25)
        say(f"  {len(polled & {m.vm for m in members[: first + wave]})} forwarders polling")
        if time.monotonic() >= deadline:
            break
    return len(polling_now())


def follow_step(
    members: list[Member],
    message_id: str,
    step_at: float,
    timeout: float,
) -> StepResult:
    """Wait until every forwarder logged and sent ``message_id`` (or timeout).

    Detection is the forwarder's own log timestamp; publication is when this loop (a round
    every 0.1 s) first saw the message gone from the forwarder's outbox, so it is late by up
    to one round. ``step_at`` and both are wall-clock seconds."""
    result = StepResult(transition=message_id.split(":")[1])
    deadline = time.monotonic() + timeout
    waiting = list(members)
    while waiting and time.monotonic() < deadline:
        still: list[Member] = []
        for member in waiting:
            if message_id not in member.detected:
                member.scan_log()
            if message_id in member.detected and not member.pending(message_id):
                member.published[message_id] = time.time()
            else:
                still.append(member)
        waiting = still
        if waiting:
            time.sleep(0.1)
    detected = [m.detected[message_id] - step_at for m in members if message_id in m.detected]
    published = [m.published[message_id] - step_at for m in members if message_id in m.published]
    result.detected, result.published = len(detected), len(published)
    result.last_detected_s = max(detected) if detected else None
    result.last_published_s = max(published) if published else None
    result.first_published_s = min(published) if published else None
    return result


def count_subscription(
    connection_string: str, subscription: str, event_id: str, timeout: float
) -> tuple[Counter[str], bool]:
    """Drain every session of one subscription; (count per subject, message ids as expected)."""
    counts: Counter[str] = Counter()
    ids_ok = True
    measured: set[str] = set()  # each forwarder's Measured report (not a transition): one each
    deadline = time.monotonic() + timeout
    empty_rounds = 0
    # retry_total=0: with nothing waiting, the SDK would retry the session accept for ~20 s.
    with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        while time.monotonic() < deadline and empty_rounds < 2:
            try:
                with client.get_subscription_receiver(
                    TOPIC, subscription, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                ) as receiver:
                    got = receiver.receive_messages(max_message_count=100, max_wait_time=1)
                    for message in got:
                        subject = str(message.subject)
                        if subject == "Measured":
                            report = str(message.message_id)
                            if (
                                not report.startswith(f"{event_id}:Measured:1:")
                                or report in measured
                                or message.session_id != event_id
                            ):
                                ids_ok = False
                            measured.add(report)
                            receiver.complete_message(message)
                            continue
                        counts[subject] += 1
                        expected_id = f"{event_id}:{subject}:1"  # one appearance
                        if message.message_id != expected_id or message.session_id != event_id:
                            ids_ok = False
                        receiver.complete_message(message)
                    empty_rounds = 0 if got else empty_rounds + 1
            except OperationTimeoutError:
                empty_rounds += 1  # no session with messages waiting
            except ServiceBusError:
                empty_rounds += 1
                time.sleep(0.2)
    return counts, ids_ok


FleetCounts = dict[str, tuple[Counter[str], bool]]


def count_all(connection_string: str, event_id: str, timeout: float) -> FleetCounts:
    out: FleetCounts = {}
    threads = []

    def one(name: str) -> None:
        out[name] = count_subscription(connection_string, name, event_id, timeout)

    for name in EXPECTED:
        thread = threading.Thread(target=one, args=(name,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout + 5)
    return out


def run_fleet(
    n: int,
    *,
    wave: int = 20,
    timeout: float = 600.0,
    step_timeout: float = 60.0,
    say: Callable[[str], None] = print,
    emulator: EmulatorProcess | None = None,
) -> FleetResult:
    """The whole check; every process it starts is stopped before it returns."""
    started = time.monotonic()
    deadline = started + timeout
    result = FleetResult(forwarders=n)
    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    with _emulator(emulator) as bus:
        sim_process, sim_url = server("imds-sim", "--scenario", str(IDLE_SCENARIO))
        sim = SimClient(sim_url)
        try:
            with fleet_processes(sim_url, bus.connection_string, n, workdir) as members:
                say(f"starting {n} forwarders in waves of {wave}...")
                result.polling = start_in_waves(members, sim, wave, deadline, say)
                result.start_seconds = time.monotonic() - started
                if result.polling < n:
                    result.problems.append(f"only {result.polling} of {n} forwarders polled IMDS")
                time.sleep(1.5)  # a full poll cycle for the last wave too
                pids = [m.pid for m in members]
                sim_pid = sim_process_pid(sim_process)
                idle_from = (
                    time.monotonic(),
                    Usage.of(pids),
                    cpu_seconds(bus.pid),
                    cpu_seconds(sim_pid),
                )
                time.sleep(5.0)
                idle_to = (
                    time.monotonic(),
                    Usage.of(pids),
                    cpu_seconds(bus.pid),
                    cpu_seconds(sim_pid),
                )
                say("idle 5 s measured; adding the event")

                event_id = str(uuid.uuid4())
                result.event_id = event_id
                resources = [m.vm for m in members[:3]]
                busy_from = (
                    Usage.of(pids),
                    cpu_seconds(bus.pid),
                    cpu_seconds(sim_process_pid(sim_process)),
                )
                for transition in TRANSITIONS:
                    left = max(1.0, min(step_timeout, deadline - time.monotonic()))
                    step_at = time.time()  # just before the IMDS change: conservative
                    if transition == "Scheduled":
                        sim.event(
                            "add",
                            notBeforeIn=900,
                            event={
                                "EventId": event_id,
                                "EventType": "Reboot",
                                "ResourceType": "VirtualMachine",
                                "Resources": resources,
                                "EventStatus": "Scheduled",
                                "EventSource": "Platform",
                                "DurationInSeconds": -1,
                            },
                        )
                    elif transition == "Started":
                        sim.event("start", eventId=event_id)
                    else:
                        sim.event("remove", eventId=event_id)
                    step = follow_step(members, f"{event_id}:{transition}:1", step_at, left)
                    result.steps.append(step)
                    say(
                        f"  {transition}: {step.published}/{n} published, last after "
                        f"{_s(step.last_published_s)}"
                    )
                    if step.published < n:
                        result.problems.append(
                            f"{transition}: only {step.published} of {n} forwarders published "
                            f"it ({step.detected} logged it)"
                        )
                busy_to = (
                    Usage.of(pids),
                    cpu_seconds(bus.pid),
                    cpu_seconds(sim_process_pid(sim_process)),
                )
                alive = sum(1 for m in members if m.child.alive)
                if alive < n:
                    result.problems.append(f"{n - alive} forwarder(s) exited during the run")
                result.usage = {
                    "idle_seconds": idle_to[0] - idle_from[0],
                    "idle_forwarders_cpu": idle_to[1].cpu - idle_from[1].cpu,
                    "idle_emulator_cpu": idle_to[2] - idle_from[2],
                    "idle_simulator_cpu": idle_to[3] - idle_from[3],
                    "event_forwarders_cpu": busy_to[0].cpu - busy_from[0].cpu,
                    "event_emulator_cpu": busy_to[1] - busy_from[1],
                    "event_simulator_cpu": busy_to[2] - busy_from[2],
                    "forwarders_cpu_total": busy_to[0].cpu,
                    "forwarder_rss": busy_to[0].rss,
                    "emulator_cpu_total": busy_to[1],
                    "emulator_rss": rss_mib(bus.pid),
                    "simulator_cpu_total": busy_to[2],
                    "simulator_rss": rss_mib(sim_process_pid(sim_process)),
                }
            say("forwarders stopped; counting what reached each subscription...")
            counts = count_all(bus.connection_string, event_id, timeout=30.0)
            for name, expected in EXPECTED.items():
                got, ids_ok = counts.get(name, (Counter(), False))
                result.subscriptions[name] = dict(got)
                result.message_ids_ok &= ids_ok
                if dict(got) != expected:
                    result.problems.append(f"{name}: got {dict(got)}, expected {expected}")
            if not result.message_ids_ok:
                result.problems.append("a message had an unexpected message_id or session_id")
        finally:
            sim_process.close()
    result.total_seconds = time.monotonic() - started
    return result


def sim_process_pid(child: ChildProcess) -> int | None:
    return None if child.process is None else child.process.pid


@contextmanager
def _emulator(given: EmulatorProcess | None) -> Iterator[EmulatorProcess]:
    if given is not None:
        yield given
        return
    with running_emulator(CONFIG) as bus:
        yield bus


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def report(result: FleetResult, argv: list[str]) -> list[str]:
    n = result.forwarders
    usage = result.usage
    lines = [
        f"command: python benchmarks/fleet.py {' '.join(argv)}".strip(),
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        f"forwarders: {n} (polling IMDS: {result.polling}), all started and polling after "
        f"{result.start_seconds:.1f} s; event {result.event_id}; "
        f"whole run {result.total_seconds:.0f} s",
        f"transitions published by forwarders in total: {result.published_total()} "
        f"(expected {n * len(TRANSITIONS)} = {n} x {len(TRANSITIONS)})",
    ]
    for step in result.steps:
        lines.append(
            f"  {step.transition:<9} logged by {step.detected}/{n}, published by "
            f"{step.published}/{n}; after the IMDS change: last detection "
            f"{_s(step.last_detected_s)}, first publish {_s(step.first_published_s)}, "
            f"last publish {_s(step.last_published_s)}"
        )
    for name, expected in EXPECTED.items():
        got = result.subscriptions.get(name, {})
        verdict = "exactly one per transition" if got == expected else f"WRONG, expected {expected}"
        lines.append(f"subscription {name:<13} received {got}: {verdict}")
    if usage:
        rss = usage["forwarder_rss"]
        lines += [
            f"idle polling ({usage['idle_seconds']:.1f} s): forwarders "
            f"{usage['idle_forwarders_cpu'] / usage['idle_seconds']:.2f} CPU "
            f"({usage['idle_forwarders_cpu'] / usage['idle_seconds'] / n * 1000:.1f} ms/s each), "
            f"emulator {usage['idle_emulator_cpu'] / usage['idle_seconds']:.2f} CPU, "
            f"simulator {usage['idle_simulator_cpu'] / usage['idle_seconds']:.2f} CPU "
            f"({n} GET/s)",
            f"the three transitions: forwarders {usage['event_forwarders_cpu']:.1f} CPU s "
            f"({usage['event_forwarders_cpu'] / n * 1000:.0f} ms each), emulator "
            f"{usage['event_emulator_cpu']:.1f} CPU s, "
            f"simulator {usage['event_simulator_cpu']:.1f} CPU s",
            f"forwarders: {usage['forwarders_cpu_total']:.0f} CPU s in total (start-up included); "
            f"RSS mean {sum(rss) / max(1, len(rss)):.0f} MiB, max {max(rss, default=0):.0f} MiB, "
            f"sum {sum(rss) / 1024:.2f} GiB (overstated: shared pages count in every process)",
            f"emulator: {usage['emulator_cpu_total']:.1f} CPU s, "
            f"RSS {usage['emulator_rss']:.0f} MiB; "
            f"simulator: {usage['simulator_cpu_total']:.1f} CPU s, "
            f"RSS {usage['simulator_rss']:.0f} MiB",
        ]
    for problem in result.problems:
        lines.append(f"PROBLEM: {problem}")
    lines.append(
        "verdict: "
        + (
            "met: duplicate detection collapsed every forwarder's copy to one message per "
            "transition on every subscription"
            if result.ok
            else "MISSED"
        )
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--forwarders", type=int, default=200, help="N (default %(default)s)")
    parser.add_argument("--wave", type=int, default=20, help="start this many at a time")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="bound of the whole run in seconds"
    )
    parser.add_argument(
        "--step-timeout", type=float, default=120.0, help="bound of one transition in seconds"
    )
    args = parser.parse_args(args_list)
    if not 1 <= args.forwarders <= 1000 or not 1 <= args.wave <= 200:
        parser.error("--forwarders must be 1..1000 and --wave 1..200")
    result = run_fleet(
        args.forwarders,
        wave=args.wave,
        timeout=args.timeout,
        step_timeout=args.step_timeout,
        say=lambda text: print(text, file=sys.stderr, flush=True),
    )
    print("\n".join(report(result, args_list)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
