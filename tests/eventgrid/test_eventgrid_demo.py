"""`sebridge demo --source eventgrid|both` as a user runs it (see emulators/demo/sources.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from emulators.demo.sources import one_message_per_transition
from sebridge.imds import ScheduledEvent


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    # At the scenario's own pace (--speed 1): beside the rest of make test on 2 cores, the
    # demo's default speed 2 left too little wall time between a short notice and its start
    # for the calendar feed and the approval to be seen first (both seen under load).
    return subprocess.run(
        [sys.executable, "-m", "sebridge.cli", "demo", "--speed", "1", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(270)
def test_agentless_demo_runs_with_no_forwarder_and_approves_through_arm() -> None:
    result = demo("--source", "eventgrid")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "forwarder polling IMDS" not in out and "Approved" not in out  # no forwarder at all
    for milestone in (
        r"evgrid\s+event subscription validated",
        r"evgrid\s+Scheduled\s+\w+ -> HTTP 202 \(delivered again",
        r"topic\s+Scheduled\s+Redeploy",
        r"topic\s+Prepared\s+Redeploy",
        r"evgrid\s+ARM acknowledge \w+ honoured",
        r"topic\s+Started\s+Redeploy",
        r"topic\s+Completed\s+Redeploy",
        r"arm\s+\+ web-1-nic/ipconfig1 joined",
    ):
        assert re.search(milestone, out), f"missing {milestone!r} in:\n{out}"
    assert len(re.findall(r"topic\s+Scheduled", out)) == 1  # delivered twice, published once


@pytest.mark.slow
@pytest.mark.timeout(270)
def test_both_sources_show_one_message_per_transition() -> None:
    result = demo("--source", "both", "--scenario", "multiple-events", "--timeout", "120")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    topic = re.findall(r"topic\s+(\w+)\s+\w+ (\w{8})", result.stdout)
    assert topic, result.stdout
    # Once per event: each lifecycle transition. Updated may repeat, and lb-pools prepares
    # again after each Updated, so Prepared may follow each Scheduled or Updated once.
    per_transition = [(t, e) for t, e in topic if t not in ("Updated", "Prepared")]
    assert len(per_transition) == len(set(per_transition)), result.stdout
    for event in {e for _, e in topic}:
        updated = topic.count(("Updated", event))
        assert topic.count(("Prepared", event)) <= 1 + updated, result.stdout
    assert "one per transition" in result.stdout


def test_the_duplicate_check_catches_two_ids_for_one_transition() -> None:
    event = ScheduledEvent(event_id="e1", event_type="Reboot", status="Scheduled")
    seen = [
        {"event": event, "transition": "Scheduled", "message_id": "e1:Scheduled:1"},
        {"event": event, "transition": "Scheduled", "message_id": "x-other:Scheduled:1"},
        {"event": event, "transition": "Updated", "message_id": "e1:Updated:1:abc:1"},
        {"event": event, "transition": "Updated", "message_id": "e1:Updated:1:def:1"},
        {"event": event, "transition": "Scheduled", "message_id": "e1:Scheduled:2"},
        # A Prepared per cause (the Scheduled, then an Updated that added a VM) and a Measured
        # per VM: several in one appearance, each once (the demo counted the two Prepared of
        # one appearance as a duplicate once their ids named the appearance).
        {"event": event, "transition": "Prepared", "message_id": "e1:Prepared:1:aaaa"},
        {"event": event, "transition": "Prepared", "message_id": "e1:Prepared:1:bbbb"},
        {"event": event, "transition": "Measured", "message_id": "e1:Measured:1:vm1"},
        {"event": event, "transition": "Measured", "message_id": "e1:Measured:1:vm2"},
        {"event": event, "transition": "Prepared", "message_id": "x-other:Prepared:1:aaaa"},
        {"event": event, "transition": "Prepared", "message_id": "e1:Prepared:1:aaaa"},
    ]
    assert one_message_per_transition(seen) == [
        "Scheduled 1 of e1 reached the topic 2 times",
        "e1:Prepared:1:aaaa of e1 reached the topic 2 times",
    ]


def test_the_demo_refuses_an_unknown_source() -> None:
    result = demo("--source", "carrier-pigeon")
    assert result.returncode == 2 and "invalid choice" in result.stderr
