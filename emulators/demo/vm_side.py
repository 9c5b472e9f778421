"""`sebridge demo --scenario vm-side`: preparing the VM itself, on 127.0.0.1, with a timeline.

The VM is ``web_0``, an instance of the Uniform scale set ``web`` behind lb-web/pool-a: its pool
membership belongs to the scale-set model, so lb-pools cannot take it out (docs/workflows.md).
It prepares itself instead, with the forwarder's local actions:

- a prepare hook (``checkpoint``) writes a checkpoint file with the event it got on stdin;
- the drain probe (``--drain-probe-port``, on 127.0.0.1 here) answers 503 from the Scheduled,
  and after ``--drain-seconds`` the drain counts as done;
- when both are done the forwarder publishes ``Prepared`` (by ``hooks+drain-probe``);
- the approval gate's ``approve-when-prepared`` approves, the event starts, completes, and the
  probe answers 200 again.

Everything else is the default demo's: the IMDS simulator, the Service Bus emulator, the
functions host with the real function_app.py, the fakes, and the forwarder as a child process.
The hooks file must be root-owned (the forwarder refuses any other), so this scenario runs as
root; as another user it says so and exits 2.

:func:`run_vm_side` returns the reasons the loop is incomplete, so the test can tell the
approval step (the gate's) from the forwarder's steps.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emulators.demo.stack import DemoStack, watch_list
from emulators.demo.timeline import Timeline
from emulators.demo.world import GROUP, SUBSCRIPTION
from emulators.ports import reserve_port

NAME = "vm-side"
DESCRIPTION = (
    "A Uniform scale-set VM prepares itself: a prepare hook writes a checkpoint, the drain "
    "probe turns the load balancer away, Prepared, the gate approves, the probe is healthy again."
)
EVENT_ID = "5c0ffee0-1616-4d16-9616-000000000016"
VM = "web_0"
SCALE_SET = "web"
VM_ID = "0b16c0de-1616-4616-8616-000000000016"
DRAIN_SECONDS = 3
NOT_BEFORE_IN = 60  # scenario seconds
GATE_STEP = "the approval gate did not approve early after the VM-side Prepared"


def world(resource_id: str) -> dict[str, Any]:
    """The IMDS scenario; the VM's ids are the ones the ARM fake holds (the gate checks them)."""
    return {
        "name": NAME,
        "description": DESCRIPTION,
        "provenance": "Demo scenario of this project (issue 16).",
        "vm": {
            "name": VM,
            "subscriptionId": SUBSCRIPTION,
            "resourceGroupName": GROUP,
            "vmScaleSetName": SCALE_SET,
            "vmId": VM_ID,
            "resourceId": resource_id,
            "location": "westeurope",
            "zone": "1",
        },
        "events": [
            {
                "EventId": EVENT_ID,
                "EventType": "Redeploy",
                "ResourceType": "VirtualMachine",
                "Resources": [VM],
                "Description": "Host maintenance: the VM moves to another host.",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
                "timeline": [
                    {"at": 2, "status": "Scheduled", "notBeforeIn": NOT_BEFORE_IN},
                    {"at": 2 + NOT_BEFORE_IN, "status": "Started"},
                    {"at": 2 + NOT_BEFORE_IN + 10, "status": "gone"},
                ],
            }
        ],
        "expect": [
            {"transition": transition, "eventId": EVENT_ID}
            for transition in ("Scheduled", "Started", "Completed")
        ],
    }


def write_hooks(directory: Path) -> tuple[Path, Path]:
    """The hooks file (root-owned, 0644) and the directory the checkpoint lands in."""
    # Readable by all, writable by root only: what the forwarder's hooks-file check asks for.
    os.chmod(directory, 0o755)  # noqa: S103
    checkpoints = directory / "checkpoints"
    checkpoints.mkdir(mode=0o755)
    hook = directory / "checkpoint.sh"
    hook.write_text(
        "#!/bin/sh\n"
        "# Prepare hook: save what the application needs to resume, then say so.\n"
        f'cat > "{checkpoints}/checkpoint-$SEBRIDGE_EVENT_ID.json"\n'
        "sleep 1\n"
        'echo "checkpoint written for $SEBRIDGE_EVENT_TYPE $SEBRIDGE_EVENT_ID, '
        '$SEBRIDGE_EVENT_SECONDS_UNTIL_NOT_BEFORE s before NotBefore"\n'
    )
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    path = directory / "hooks.json"
    path.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "hooks": [
                    {
                        "name": "checkpoint",
                        "on": ["Scheduled", "Updated"],
                        "command": [str(hook)],
                        "timeoutSeconds": 30,
                        "prepare": True,
                    }
                ],
            },
            indent=2,
        )
    )
    path.chmod(0o644)
    return path, checkpoints


def probe_status(port: int) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        response.read()
        return response.status
    except OSError:
        return None
    finally:
        connection.close()


def watch_probe(
    port: int, timeline: Timeline, answers: list[tuple[float, int]], stop: threading.Event
) -> None:
    last: int | None = None
    while not stop.wait(0.1):
        answer = probe_status(port)
        if answer is None or answer == last:
            continue
        answers.append((time.time(), answer))
        if last is not None:
            word = "draining" if answer == 503 else "healthy"
            timeline.add("probe", f"{last} -> {answer} ({word})")
        else:
            timeline.add("probe", f"answers {answer}")
        last = answer


HOOK_LINE = re.compile(
    r"(hook checkpoint starting .*|prepare hook checkpoint .*|Prepared \S+ by \S+)"
)


def forwarder_lines(stderr: Callable[[], str]) -> Callable[[], list[str]]:
    def lines() -> list[str]:
        return [m.group(1) for m in HOOK_LINE.finditer(stderr())]

    return lines


def run_vm_side(speed: float, timeout: float, verbose: bool) -> tuple[list[str], Timeline]:
    """Run the scenario; the reasons it is incomplete (empty: the whole loop) and the timeline."""
    from emulators.processes import forwarder

    timeline = Timeline(live=verbose)
    probe_answers: list[tuple[float, int]] = []
    report = logging.getLogger("sebridge.demo").warning
    with DemoStack(timeline, verbose, report) as stack:
        work = stack.workdir("sebridge-demo-vm-side-")
        stack.start_fakes()
        lb = stack.arm.add_load_balancer(SUBSCRIPTION, GROUP, "lb-web", ["pool-a"])
        instance_id = stack.arm.add_vmss_instance(
            SUBSCRIPTION, GROUP, SCALE_SET, "0", [f"{lb}/backendAddressPools/pool-a"], vm_id=VM_ID
        )
        stack.start_bus()
        # No capacity guard: lb-pools cannot drain a Uniform instance in any case.
        stack.start_host({"LB_MIN_HEALTHY": "0"})

        scenario_file = work / "scenario.json"
        scenario_file.write_text(json.dumps(world(instance_id)))
        hooks_path, checkpoints = write_hooks(work)
        _, sim_url = stack.start_simulator(scenario_file, speed)

        probe_port = reserve_port()  # the forwarder takes a port number, not 0
        fw = forwarder(
            sim_url,
            work / "state",
            "--connection-string",
            stack.connection_string,
            "--hooks-file",
            str(hooks_path),
            "--drain-probe-port",
            str(probe_port),
            "--drain-probe-address",
            "127.0.0.1",
            "--drain-seconds",
            str(DRAIN_SECONDS),
            dry_run=False,
            poll_interval=1.0,
        )
        fw.start()
        stack.defer(fw.close)
        timeline.add(
            "setup",
            f"forwarder with {hooks_path.name} and the drain probe on 127.0.0.1:{probe_port}",
        )
        stack.watch(
            watch_list,
            lambda: sorted(p.name for p in checkpoints.glob("*.json")),
            lambda name: f"checkpoint file {name} written",
            "hook",
            timeline,
            stack.stop,
        )
        stack.watch(watch_list, forwarder_lines(fw.stderr_text), str, "vm", timeline, stack.stop)
        stack.watch(watch_probe, probe_port, timeline, probe_answers, stack.stop)

        topic_seen, posts_seen = stack.topic_seen, stack.posts_seen
        deadline = time.monotonic() + timeout
        reasons = ["not finished"]
        while time.monotonic() < deadline:
            reasons = verdict(topic_seen, posts_seen, probe_answers, checkpoints, fw.stderr_text())
            if not reasons or not fw.alive:
                break
            ended = any(s["transition"] == "Completed" for s in topic_seen)
            if ended and reasons == [GATE_STEP]:
                break  # nothing left that could change the verdict
            time.sleep(0.3)
        if not fw.alive:
            reasons.append(f"the forwarder exited:\n{fw.stderr_text()[-2000:]}")
        time.sleep(0.5)  # the watchers' last lines
        return reasons, timeline


def verdict(
    seen: list[dict[str, Any]],
    posts: list[dict[str, Any]],
    answers: list[tuple[float, int]],
    checkpoints: Path,
    forwarder_log: str,
) -> list[str]:
    """What is missing for the VM-side loop to be complete, in the loop's order."""
    transitions = [item["transition"] for item in list(seen)]
    missing = []
    if not (checkpoints / f"checkpoint-{EVENT_ID}.json").exists():
        missing.append("the prepare hook wrote no checkpoint file")
    if 503 not in [answer for _, answer in answers]:
        missing.append("the drain probe never answered 503")
    prepared_line = re.search(rf"Prepared {EVENT_ID} by (\S+)", forwarder_log)
    if prepared_line is None or prepared_line.group(1) != "hooks+drain-probe":
        missing.append("the forwarder published no Prepared by hooks+drain-probe")
    if "Prepared" not in transitions:
        missing.append("no Prepared on the topic")
    approved = [p for p in list(posts) if p.get("status") == 200]
    if not approved:
        missing.append(GATE_STEP)
    if "Completed" not in transitions:
        missing.append("the event has not completed")
    else:
        drained_until = max((at for at, answer in answers if answer == 503), default=None)
        healthy_after = [at for at, answer in answers if answer == 200]
        if drained_until is None or not any(at > drained_until for at in healthy_after):
            missing.append("the probe did not answer 200 again after Completed")
    return missing


def run(speed: float, timeout: float, verbose: bool) -> int:
    """The `sebridge demo --scenario vm-side` entry point: prints the timeline and a verdict."""
    if os.geteuid() != 0:
        print(
            "sebridge demo: the vm-side scenario needs root: the forwarder runs a hooks file "
            "only if root owns it (run it as root, e.g. in a container)"
        )
        return 2
    print(f"sebridge demo: scenario {NAME} at speed {speed:g}: {DESCRIPTION}")
    print(
        f"world: {VM} in Uniform scale set {SCALE_SET} ({GROUP}), behind lb-web/pool-a; "
        "everything on 127.0.0.1\n"
    )
    if not verbose:
        print("running the scenario; the timeline follows when the loop is done...\n")
    started = time.time()
    reasons, timeline = run_vm_side(speed, max(timeout, 90.0), verbose)
    if not verbose:
        print("\n".join(timeline.render()))
    elapsed = time.time() - started
    if reasons:
        print(f"\nFAILED after {elapsed:.1f} s: the loop did not complete")
        for reason in reasons:
            print(f"  - {reason}")
        return 1
    print(
        f"\nOK in {elapsed:.1f} s: checkpoint written, the probe drained the VM, Prepared, "
        "approved early, completed, and the probe is healthy again."
    )
    return 0
