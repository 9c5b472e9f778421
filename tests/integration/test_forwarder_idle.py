"""An idle forwarder sleeps between its polls: no thread of the real `sebridge forwarder`
process wakes more often than the poll loop needs (issue 21: its CPU per idle poll is a
target). Measured from /proc, as the scheduler counts each thread's turns on a CPU.

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
# At 1 Hz a poll is a GET and a watchdog arming (two threads woken about twice a second); the
# rest of the process sleeps. The bound leaves room for a busy machine's scheduling.
MOST_WAKEUPS_A_SECOND = 6


def turns(pid: int) -> dict[str, int]:
    """Each thread's count of turns on a CPU (/proc/<pid>/task/<tid>/schedstat, 3rd field)."""
    counts: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            counts[task.name] = int((task / "schedstat").read_text().split()[2])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
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
