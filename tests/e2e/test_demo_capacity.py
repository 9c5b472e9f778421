"""`sebridge demo --scenario capacity-hold`: two overlapping events on one pool of two show a
Held, the held drain happens when the first event completes, and every pool ends as it was."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from emulators.demo.world import CAPACITY_HOLD, load_packaged
from emulators.imds.scenario import parse_scenario

MILESTONES = [
    r"topic\s+Scheduled\s+Reboot a1a1a1a1 on web-1",
    r"arm\s+- web-1-nic/ipconfig1 left lb-web/pool-a",
    r"imds\s+POST StartRequests a1a1a1a1 -> 200",
    r"topic\s+Scheduled\s+Reboot b2b2b2b2 on web-2",
    r"topic\s+Held\s+Reboot b2b2b2b2 on web-2",
    r"teams\s+card: .*Reboot held: web-2",
    r"topic\s+Completed\s+Reboot a1a1a1a1 on web-1",
    r"arm\s+\+ web-1-nic/ipconfig1 joined lb-web/pool-a",
    r"arm\s+- web-2-nic/ipconfig1 left lb-web/pool-a",
    r"imds\s+POST StartRequests b2b2b2b2 -> 200",
    r"topic\s+Completed\s+Reboot b2b2b2b2 on web-2",
    r"arm\s+\+ web-2-nic/ipconfig1 joined lb-web/pool-a",
]


def test_the_scenario_is_valid_for_the_imds_simulator() -> None:
    scenario = parse_scenario(load_packaged(CAPACITY_HOLD))
    assert [e.key[:8] for e in scenario.events] == ["a1a1a1a1", "b2b2b2b2"]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_capacity_hold_shows_a_held_drain_and_ends_with_every_pool_as_it_was() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sebridge.cli",
            "demo",
            "--scenario",
            CAPACITY_HOLD,
            "--timeout",
            "90",
        ],
        capture_output=True,
        text=True,
        timeout=130,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    positions = []
    for milestone in MILESTONES:
        index = next((i for i, line in enumerate(lines) if re.search(milestone, line)), None)
        assert index is not None, f"missing {milestone!r} in:\n{result.stdout}"
        positions.append(index)
    # web-2 never left the pool before web-1 came back: the pool always kept a member.
    web_2_left = positions[MILESTONES.index(r"arm\s+- web-2-nic/ipconfig1 left lb-web/pool-a")]
    web_1_back = positions[MILESTONES.index(r"arm\s+\+ web-1-nic/ipconfig1 joined lb-web/pool-a")]
    held = positions[MILESTONES.index(r"topic\s+Held\s+Reboot b2b2b2b2 on web-2")]
    assert held < web_1_back <= web_2_left, result.stdout
    assert "A drain was held until capacity allowed it." in result.stdout
