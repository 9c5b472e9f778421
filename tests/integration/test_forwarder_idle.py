"""An idle forwarder sleeps between its polls: no thread of the real `sebridge forwarder`
process wakes more often than the poll loop needs (issue 21: its CPU per idle poll is a
target). Measured from /proc, as the kernel counts each thread's sleeps.

Before: once the VM's identity was resolved, the identity thread went on waking 20 times a
second for the process's life, 2.5x a dry-run forwarder's whole idle CPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from emulators.imds.testing import running_simulator
from emulators.processes import forwarder
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
IDLE = str(REPO / "benchmarks" / "idle-scenario.json")
pytestmark = pytest.mark.timeout(120)

WINDOW = 5.0  # seconds measured
# At 1 Hz the poll loop wakes twice a second (the same with twelve busy loops beside it); the
# HTTP deadline watchdog only at the deadlines it knows (about twice in eleven seconds); the
# rest of the process sleeps.
MOST_WAKEUPS_A_SECOND = 6


def turns(pid: int) -> dict[str, int]:
    """Each thread's count of times it went to sleep (/proc/<pid>/task/<tid>/status,
    voluntary_ctxt_switches): one per wake-up. Its turns on a CPU (schedstat) count the
    preemptions too, which grow with the machine's load, not with what the thread does (a
    CI run with six test processes on two cores: 10.2 a second for the poller)."""
    counts: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # a thread that just ended
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                counts[task.name] = int(line.split()[1])
    return counts


def test_no_thread_of_an_idle_forwarder_wakes_more_than_its_polls_need(tmp_path: Path) -> None:
    with running_simulator(IDLE) as sim:
        with forwarder(sim.base_url, tmp_path / "state", poll_interval=1.0) as fw:
            assert fw.process is not None
            pid = fw.process.pid
            # Started, identity looked up (the simulator serves instance metadata), polling.
            wait_until(lambda: (tmp_path / "state" / "status.json").exists(), 30, "a first status")
            time.sleep(3)
            before = turns(pid)
            time.sleep(WINDOW)
            after = turns(pid)
            assert fw.alive
    rates = {tid: (after[tid] - before[tid]) / WINDOW for tid in before if tid in after}
    assert rates, "no thread measured"
    busiest = max(rates.values())
    assert busiest <= MOST_WAKEUPS_A_SECOND, f"wakeups a second per thread: {rates}"
