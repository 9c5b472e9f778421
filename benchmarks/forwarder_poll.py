"""Forwarder cost and detection latency at 1 Hz, against the IMDS simulator (a benchmark).

    python benchmarks/forwarder_poll.py [--polls 60] [--samples 30] [--interval 1.0]

What it measures, with the real `sebridge forwarder --dry-run` process:
- CPU milliseconds per idle poll (utime + stime of the whole process over N polls of an empty
  document), side by side with a reference listener written the way Microsoft documents it
  (benchmarks/reference_listener.py), both polling the same simulator at the same time;
- peak RSS (VmHWM) of both;
- detection latency: from an event being added to (or removed from) the simulator's document to
  the dry-run line on the forwarder's stdout, at random phases of the poll cycle.
Targets: <= 2 ms CPU per idle poll and <= 1.5x the reference; RSS <= 50 MiB; latency p99 <=
poll interval + 50 ms. Bounded: about (polls + 2 * samples) * interval seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulators.imds.testing import SimClient  # noqa: E402
from emulators.processes import ChildProcess, forwarder, server  # noqa: E402

IDLE_SCENARIO = ROOT / "benchmarks" / "idle-scenario.json"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def event(event_id: str) -> dict[str, object]:
    return {
        "EventId": event_id,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vmss_vm1"],
        "EventStatus": "Scheduled",
        "Description": "benchmark",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def wait_for_message(fw: ChildProcess, message_id: str, timeout: float) -> float:
    marker = f'"message_id":"{message_id}"'
    if not fw.wait_for(lambda lines: any(marker in x.text for x in lines), timeout):
        raise RuntimeError(f"no {message_id} within {timeout} s:\n{fw.stderr_text()[-2000:]}")
    return next(x.at for x in fw.lines if marker in x.text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--polls", type=int, default=60, help="idle polls to measure (>= 60)")
    parser.add_argument("--samples", type=int, default=30, help="latency samples per kind")
    parser.add_argument("--interval", type=float, default=1.0, help="poll interval (s)")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference")
    args = parser.parse_args(argv)

    sim_process, url = server("imds-sim", "--scenario", str(IDLE_SCENARIO))
    sim = SimClient(url)
    state = tempfile.mkdtemp(prefix="bench-forwarder-")
    fw = forwarder(url, state, poll_interval=args.interval).start()
    reference = None
    try:
        fw.wait_for(lambda _: "starting" in fw.stderr_text(), 30)
        if not args.no_reference:
            import subprocess

            reference = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "benchmarks" / "reference_listener.py"),
                    url,
                    str(args.interval),
                    str(args.polls + 20),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(3 * args.interval)  # warm-up: imports done, connections open
        assert fw.process is not None
        pids = {"forwarder": fw.process.pid}
        if reference is not None:
            pids["reference"] = reference.pid
        start_cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
        start = time.monotonic()
        time.sleep(args.polls * args.interval)
        elapsed = time.monotonic() - start
        polls = elapsed / args.interval
        cpu_ms = {
            name: (cpu_seconds(pid) - start_cpu[name]) * 1000 / polls for name, pid in pids.items()
        }
        rss = {name: peak_rss_mib(pid) for name, pid in pids.items()}
        if reference is not None:
            reference.terminate()
            reference.wait(timeout=10)

        latencies: dict[str, list[float]] = {"Scheduled": [], "Cancelled": []}
        rng = random.Random(7)
        for _ in range(args.samples):
            event_id = str(uuid.uuid4())
            time.sleep(rng.uniform(0, args.interval))  # a random phase of the poll cycle
            injected = time.monotonic()
            sim.event("add", event=event(event_id), notBeforeIn=600)
            seen = wait_for_message(fw, f"{event_id}:Scheduled", 10 * args.interval)
            latencies["Scheduled"].append(seen - injected)
            time.sleep(rng.uniform(0, args.interval))
            removed = time.monotonic()
            sim.event("remove", eventId=event_id)
            gone = wait_for_message(fw, f"{event_id}:Cancelled", 10 * args.interval)
            latencies["Cancelled"].append(gone - removed)
        rss["forwarder"] = peak_rss_mib(fw.process.pid)
    finally:
        if reference is not None and reference.poll() is None:
            reference.kill()
        fw.close()
        sim_process.close()

    both = latencies["Scheduled"] + latencies["Cancelled"]
    limit = args.interval + 0.050
    print(f"command: python benchmarks/forwarder_poll.py {' '.join(argv or sys.argv[1:])}".strip())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"idle polls measured: {polls:.0f} at {args.interval:g} s")
    print(f"forwarder CPU per idle poll: {cpu_ms['forwarder']:.2f} ms (target <= 2 ms)")
    if "reference" in cpu_ms:
        ratio = cpu_ms["forwarder"] / cpu_ms["reference"] if cpu_ms["reference"] else float("inf")
        print(
            f"reference CPU per poll: {cpu_ms['reference']:.2f} ms; forwarder/reference "
            f"{ratio:.2f}x (target <= 1.5x)"
        )
        print(f"reference peak RSS: {rss['reference']:.1f} MiB")
    print(f"forwarder peak RSS: {rss['forwarder']:.1f} MiB (target <= 50 MiB)")
    for name, values in (*latencies.items(), ("all", both)):
        p50, p95, p99 = (percentile(values, q) * 1000 for q in (50, 95, 99))
        print(
            f"detection latency {name} (n={len(values)}): p50 {p50:.0f} ms, p95 {p95:.0f} ms,"
            f" p99 {p99:.0f} ms, max {max(values) * 1000:.0f} ms,"
            f" mean {statistics.mean(values) * 1000:.0f} ms"
        )
    p99 = percentile(both, 99)
    print(
        f"latency p99 {p99 * 1000:.0f} ms vs target {limit * 1000:.0f} ms: "
        f"{'met' if p99 <= limit else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
