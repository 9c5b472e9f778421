"""`sebridge demo --scenario vm-side` as a user runs it: the VM prepares itself (checkpoint hook,
drain probe), Prepared, the gate approves, the probe is healthy again after Completed.

The gate approves after the VM-side Prepared (a Uniform scale-set instance never leaves its
pools in ARM, so the VM's own Prepared is what counts), before the event starts.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.root import requires_root

MILESTONES = [
    r"probe\s+answers 200",
    r"topic\s+Scheduled\s+Redeploy \w+ on web_0",
    r"vm\s+hook checkpoint starting for [\w-]+:Scheduled:1 \(attempt 1\)",
    r"hook\s+checkpoint file checkpoint-[\w-]+\.json written",
    r"probe\s+200 -> 503 \(draining\)",
    r"vm\s+prepare hook checkpoint for Scheduled [\w-]+: succeeded",
    r"vm\s+Prepared [\w-]+ by hooks\+drain-probe",
    r"topic\s+Prepared\s+Redeploy",
    r"topic\s+Started\s+Redeploy",
    r"topic\s+Completed\s+Redeploy",
    r"probe\s+503 -> 200 \(healthy\)",
]
GATE_MILESTONE = r"imds\s+POST StartRequests \w+ -> 200"


@pytest.mark.slow
@pytest.mark.timeout(240)
@requires_root("the hooks file must be root-owned")
def test_the_vm_side_demo_prepares_the_vm_itself() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sebridge.cli", "demo", "--scenario", "vm-side"],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    lines = result.stdout.splitlines()
    positions = []
    for milestone in MILESTONES:
        index = next((i for i, line in enumerate(lines) if re.search(milestone, line)), None)
        assert index is not None, (
            f"missing {milestone!r} in:\n{result.stdout}\n{result.stderr[-3000:]}"
        )
        positions.append(index)
    # The Scheduled on the topic, the hook and the probe race each other (the timeline stamps
    # log lines when it reads them); then Prepared, Started, Completed in order. The probe
    # follows IMDS itself, so its healthy answer races the Completed on the topic.
    assert max(positions[1:6]) < min(positions[6:8])
    assert max(positions[6:8]) < positions[8] < positions[9]
    assert positions[8] < positions[10]
    approval = next((i for i, line in enumerate(lines) if re.search(GATE_MILESTONE, line)), None)
    assert approval is not None, result.stdout[-3000:]
    assert result.returncode == 0, result.stdout[-3000:]
    assert max(positions[6:8]) < approval < positions[8]  # after Prepared, before it started


@pytest.mark.timeout(30)
def test_the_vm_side_scenario_is_listed() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "sebridge.cli", "demo", "--list"],
        capture_output=True,
        text=True,
        timeout=25,
        check=True,
    )
    assert re.search(r"^vm-side\s+A Uniform scale-set VM prepares itself", listed.stdout, re.M)
