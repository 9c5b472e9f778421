"""Hooks in the real `sebridge forwarder` process against the IMDS simulator.

Every hook here is a small shell script that records what it got (its environment and stdin,
one file per run) and, where the test needs it, its process ids. The forwarder runs with
--dry-run (its messages are JSON lines on stdout) and polls 5 times a second.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators.imds.testing import RunningSimulator, running_simulator
from emulators.ports import reserve_port
from emulators.processes import ChildProcess, forwarder
from tests.forwarder.local_support import root_dir, script, write_hooks
from tests.support.root import requires_root
from tests.support.simulator import NOTICE, VM, add_event

REPO = Path(__file__).resolve().parents[2]
IDLE = str(REPO / "benchmarks" / "idle-scenario.json")
pytestmark = [
    pytest.mark.timeout(180),
    requires_root("a hooks file must be root-owned"),
]


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with running_simulator(IDLE) as running:
        yield running


def subjects(fw: ChildProcess, event_id: str | None = None) -> list[str]:
    return [
        m["subject"]
        for m in fw.json_lines()
        if m.get("subject") != "Heartbeat"
        and (event_id is None or m["session_id"] == event_id.lower())
    ]


def wait_subject(fw: ChildProcess, event_id: str, subject: str, timeout: float = 20) -> None:
    assert fw.wait_for(lambda _: subject in subjects(fw, event_id), timeout), (
        f"no {subject} for {event_id}; stderr:\n{fw.stderr_text()[-3000:]}"
    )


def wait_file(path: Path, timeout: float = 20, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never written {what}")


def recording_hook(base: Path, name: str, on: list[str], **extra: Any) -> dict[str, Any]:
    """A hook that keeps its environment and stdin under base/runs/<name>-<transition>-..."""
    runs = base / "runs"
    runs.mkdir(exist_ok=True)
    body = (
        f'out="{runs}/{name}-$SEBRIDGE_EVENT_TRANSITION-$SEBRIDGE_EVENT_ID-$SEBRIDGE_HOOK_ATTEMPT"\n'
        'env > "$out.env"\ncat > "$out.stdin"'
    )
    return {"name": name, "on": on, "command": [script(base, f"{name}.sh", body)], **extra}


def make(sim: RunningSimulator, state: Path, hooks: Path, *extra: str) -> ChildProcess:
    """The forwarder with the hooks file, not started yet (``with`` starts and stops it)."""
    return forwarder(sim.base_url, state, "--hooks-file", str(hooks), *extra)


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_each_transition_reaches_the_hook_as_environment_and_stdin(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    etc = root_dir(tmp_path)
    transitions = ["Scheduled", "Updated", "Started", "Completed", "Cancelled"]
    hooks = write_hooks(etc, [recording_hook(etc, "record", transitions)])
    runs = etc / "runs"
    with make(sim, tmp_path / "state", hooks) as fw:
        first = add_event(sim)
        wait_subject(fw, first, "Scheduled")
        sim.event("update", eventId=first, notBeforeIn=900)
        wait_subject(fw, first, "Updated")
        sim.event("start", eventId=first)
        wait_subject(fw, first, "Started")
        sim.event("remove", eventId=first)
        wait_subject(fw, first, "Completed")
        second = add_event(sim, event_type="Redeploy", resources=["other-vm", VM])
        wait_subject(fw, second, "Scheduled")
        sim.event("remove", eventId=second)
        wait_subject(fw, second, "Cancelled")
        for transition, event_id in [*[(t, first) for t in transitions[:4]], ("Cancelled", second)]:
            wait_file(runs / f"record-{transition}-{event_id}-1.stdin", what=f"for {transition}")
        log = fw.stderr_text()
    for transition, event_id in [*[(t, first) for t in transitions[:4]], ("Cancelled", second)]:
        stem = runs / f"record-{transition}-{event_id}-1"
        env = read_env(stem.with_suffix(".env"))
        stdin = json.loads(stem.with_suffix(".stdin").read_text())
        assert env["SEBRIDGE_EVENT_ID"] == event_id
        assert env["SEBRIDGE_EVENT_TRANSITION"] == transition == stdin["transition"]
        assert env["SEBRIDGE_EVENT_MESSAGE_ID"] == stdin["messageId"]
        assert env["SEBRIDGE_VM_NAME"] == VM == stdin["vmName"]
        assert env["SEBRIDGE_EVENT_DESCRIPTION"] == "Host maintenance"
        assert env["SEBRIDGE_EVENT_SOURCE"] == "Platform"
        assert env["SEBRIDGE_EVENT_DURATION_SECONDS"] == "-1"
        assert stdin["event"]["EventId"] == event_id
        if event_id == second:
            assert env["SEBRIDGE_EVENT_TYPE"] == "Redeploy"
            assert env["SEBRIDGE_EVENT_RESOURCES"] == f"other-vm,{VM}"
        expected_status = "Started" if transition in ("Started", "Completed") else "Scheduled"
        assert env["SEBRIDGE_EVENT_STATUS"] == expected_status == stdin["event"]["EventStatus"]
        if expected_status == "Scheduled":
            until = int(env["SEBRIDGE_EVENT_SECONDS_UNTIL_NOT_BEFORE"])
            assert NOTICE - 60 < until <= 900, until
            assert env["SEBRIDGE_EVENT_NOT_BEFORE"].endswith("Z") and stdin["notBefore"]
            assert stdin["secondsUntilNotBefore"] == until
        else:
            assert env["SEBRIDGE_EVENT_NOT_BEFORE"] == "" and stdin["notBefore"] is None
        # The forwarder's own settings stay its own.
        assert not {k for k in env if k.startswith(("SEBRIDGE_IMDS", "SEBRIDGE_STATE", "AZURE_"))}
    assert "hook record for Scheduled" in log


def test_only_this_vms_events_unless_all_events(sim: RunningSimulator, tmp_path: Path) -> None:
    etc = root_dir(tmp_path)
    hooks = write_hooks(
        etc,
        [
            recording_hook(etc, "mine", ["Scheduled"]),
            recording_hook(etc, "every", ["Scheduled"], allEvents=True),
        ],
    )
    with make(sim, tmp_path / "state", hooks) as fw:
        other = add_event(sim, resources=["vmss_vm7"])
        wait_subject(fw, other, "Scheduled")
        wait_file(etc / "runs" / f"every-Scheduled-{other}-1.stdin")
        time.sleep(1.0)
    assert not list((etc / "runs").glob("mine-*"))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_hook_that_times_out_is_killed_with_its_process_group(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    etc = root_dir(tmp_path)
    pids = etc / "pids"
    body = f'sleep 600 & echo $! >> {pids}\necho $$ >> {pids}\ntrap "" TERM\nsleep 600'
    hooks = write_hooks(
        etc,
        [
            {
                "name": "stuck",
                "on": ["Scheduled"],
                "timeoutSeconds": 1.5,
                "command": [script(etc, "stuck.sh", body)],
            }
        ],
    )
    with make(sim, tmp_path / "state", hooks) as fw:
        event_id = add_event(sim)
        wait_subject(fw, event_id, "Scheduled")
        wait_file(pids)
        assert fw.wait_for(lambda _: "timed out after 1.5 s" in fw.stderr_text(), 30), (
            fw.stderr_text()
        )
        assert fw.alive
    numbers = [int(p) for p in pids.read_text().split()]
    assert len(numbers) == 2
    deadline = time.monotonic() + 10
    while any(alive(p) for p in numbers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in numbers), "a process of the timed-out hook survived"


def test_a_hook_cut_short_by_a_crash_runs_again_and_a_finished_one_does_not(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    etc = root_dir(tmp_path)
    ledger = etc / "ledger"
    quick = f'echo "quick $SEBRIDGE_EVENT_MESSAGE_ID $SEBRIDGE_HOOK_ATTEMPT" >> {ledger}'
    # The first attempt of "long" hangs (until the crash); a later one finishes.
    long = (
        f'echo "long-start $SEBRIDGE_HOOK_ATTEMPT $(ps -o pgid= -p $$)" >> {ledger}\n'
        f'[ "$SEBRIDGE_HOOK_ATTEMPT" = 1 ] && sleep 600\n'
        f'echo "long-done $SEBRIDGE_HOOK_ATTEMPT" >> {ledger}'
    )
    hooks = write_hooks(
        etc,
        [
            {"name": "quick", "on": ["Scheduled"], "command": [script(etc, "quick.sh", quick)]},
            {
                "name": "long",
                "on": ["Scheduled"],
                "command": [script(etc, "long.sh", long)],
                "timeoutSeconds": 900,
            },
        ],
    )
    state = tmp_path / "state"
    fw = make(sim, state, hooks).start()
    try:
        event_id = add_event(sim)
        wait_subject(fw, event_id, "Scheduled")
        deadline = time.monotonic() + 20
        while "long-start 1" not in (ledger.read_text() if ledger.exists() else ""):
            assert time.monotonic() < deadline, fw.stderr_text()
            time.sleep(0.05)
        fw.kill()  # SIGKILL: a crash
        # On a VM the crash or reboot takes the hook with it (systemd stops the unit's cgroup).
        pgid = int(ledger.read_text().split("long-start 1 ", 1)[1].split()[0])
        os.killpg(pgid, signal.SIGKILL)
    finally:
        fw.close()
    with make(sim, state, hooks) as again:
        deadline = time.monotonic() + 30
        while "long-done 2" not in ledger.read_text():
            assert time.monotonic() < deadline, again.stderr_text()
            time.sleep(0.05)
        time.sleep(1.0)  # a few more polls: nothing else may run
        log = again.stderr_text()
    lines = ledger.read_text().splitlines()
    assert [line for line in lines if line.startswith("quick")] == [
        f"quick {event_id.lower()}:Scheduled:1 1"
    ], lines
    assert [line.split()[:2] for line in lines if line.startswith("long")] == [
        ["long-start", "1"],
        ["long-start", "2"],
        ["long-done", "2"],
    ]
    assert "cut short by a stop, crash or reboot" in log


def test_hooks_never_delay_detection(sim: RunningSimulator, tmp_path: Path) -> None:
    etc = root_dir(tmp_path)
    sleeper = script(etc, "sleep.sh", "sleep 60")
    hooks = write_hooks(
        etc,
        [
            {
                "name": "sleep-prepare",
                "on": ["Scheduled", "Updated"],
                "prepare": True,
                "command": [sleeper],
                "timeoutSeconds": 120,
            },
            {
                "name": "sleep",
                "on": ["Scheduled", "Started", "Completed", "Cancelled"],
                "command": [sleeper],
                "timeoutSeconds": 120,
                "allEvents": True,
            },
        ],
    )
    with make(sim, tmp_path / "state", hooks) as fw:
        first = add_event(sim)
        wait_subject(fw, first, "Scheduled")
        assert fw.wait_for(lambda _: "hook sleep-prepare starting" in fw.stderr_text(), 10)
        # While a 60 s hook runs for the first event, everything else goes on at poll speed.
        for _ in range(3):
            other = add_event(sim, resources=["vmss_vm3"])
            began = time.monotonic()
            wait_subject(fw, other, "Scheduled", timeout=60)
            sim.event("remove", eventId=other)
            wait_subject(fw, other, "Cancelled", timeout=60)
            assert time.monotonic() - began < 5, "a transition waited for a hook"
        sim.event("start", eventId=first)
        began = time.monotonic()
        wait_subject(fw, first, "Started", timeout=60)
        assert time.monotonic() - began < 5
        assert "Prepared" not in subjects(fw, first)  # its prepare hook has not finished


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("group-writable", "is writable by its group"),
        ("other-owner", "owned by uid 65534, not root"),
        ("dir-writable", "is writable by group and others"),
        ("invalid", "absolute path"),
        ("missing", "cannot check"),
        ("symlink", "is a symbolic link"),  # issue 22, item 6: it could be pointed elsewhere
    ],
)
def test_a_hooks_file_anyone_but_root_could_change_is_refused_at_start(
    sim: RunningSimulator, tmp_path: Path, damage: str, problem: str
) -> None:
    etc = root_dir(tmp_path)
    hooks = write_hooks(etc, [recording_hook(etc, "x", ["Scheduled"])])
    if damage == "group-writable":
        os.chmod(hooks, 0o664)
    elif damage == "other-owner":
        os.chown(hooks, 65534, 65534)
    elif damage == "dir-writable":
        os.chmod(etc, 0o777)
    elif damage == "invalid":
        hooks.write_text(
            json.dumps({"hooks": [{"name": "x", "on": ["Scheduled"], "command": ["sh"]}]})
        )
    elif damage == "missing":
        hooks = etc / "nothing.json"
    elif damage == "symlink":
        link = etc / "link.json"
        link.symlink_to(hooks)
        os.lchown(link, 65534, 65534)
        hooks = link
    fw = make(sim, tmp_path / "state", hooks).start()
    try:
        assert fw.process is not None
        code = fw.process.wait(timeout=60)
        stderr = fw.stderr_text()
    finally:
        fw.close()
    assert code == 2, stderr
    assert problem in stderr
    assert "refused" in stderr or "cannot check" in stderr or "hooks file" in stderr


def test_a_failed_prepare_hook_publishes_no_prepared_and_heartbeats_say_so(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    etc = root_dir(tmp_path)
    hooks = write_hooks(
        etc,
        [
            {
                "name": "checkpoint",
                "on": ["Scheduled"],
                "prepare": True,
                "command": [script(etc, "fail.sh", "echo no space left >&2; exit 28")],
            },
        ],
    )
    with make(sim, tmp_path / "state", hooks, "--heartbeat-interval", "1") as fw:
        event_id = add_event(sim)
        wait_subject(fw, event_id, "Scheduled")

        def reported() -> list[dict[str, Any]]:
            return [
                m["body"]["data"]["heartbeat"].get("health", {})
                for m in fw.json_lines()
                if m.get("subject") == "Heartbeat"
                and m["body"]["data"]["heartbeat"].get("health", {}).get("hooksFailed")
                # counted a moment later (the hook's end, then the Prepared decision)
                and m["body"]["data"]["heartbeat"].get("health", {}).get("notPrepared")
            ]

        assert fw.wait_for(lambda _: reported(), 30), fw.stderr_text()[-3000:]
        health = reported()[-1]
        log = fw.stderr_text()
    assert health["hooksFailed"] == 1 and health["notPrepared"] == 1
    assert "checkpoint" in health["lastHookFailure"] and "exit code 28" in health["lastHookFailure"]
    assert "Prepared" not in subjects(fw, event_id)
    assert "NOT PREPARED" in log and "no space left" in log


def test_hooks_and_probe_together_publish_one_prepared_when_both_are_done(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    etc = root_dir(tmp_path)
    done = etc / "checkpoint.done"
    hooks = write_hooks(
        etc,
        [
            {
                "name": "checkpoint",
                "on": ["Scheduled"],
                "prepare": True,
                "command": [script(etc, "cp.sh", f"sleep 3; touch {done}")],
            },
        ],
    )
    port = reserve_port()  # the forwarder takes a port number, not 0
    with make(
        sim,
        tmp_path / "state",
        hooks,
        "--drain-probe-port",
        str(port),
        "--drain-probe-address",
        "127.0.0.1",
        "--drain-seconds",
        "1",
    ) as fw:
        event_id = add_event(sim)
        wait_subject(fw, event_id, "Scheduled")
        # The drain is done after 1 s, the checkpoint after 3 s: Prepared waits for both.
        assert fw.wait_for(lambda _: "Prepared" in subjects(fw, event_id), 30), fw.stderr_text()[
            -3000:
        ]
        assert done.exists()
        time.sleep(1.5)
        prepared = [m for m in fw.json_lines() if m.get("subject") == "Prepared"]
    assert len(prepared) == 1
    assert prepared[0]["body"]["data"]["prepared"] == {
        "vms": [VM],
        "preparedBy": "hooks+drain-probe",
    }


def test_sigterm_with_hooks_running_stops_within_5_s_and_takes_the_hooks_along(
    sim: RunningSimulator, tmp_path: Path
) -> None:
    etc = root_dir(tmp_path)
    pids = etc / "pids"
    body = f'sleep 600 & echo $! >> {pids}\necho $$ >> {pids}\ntrap "" TERM\nsleep 600'
    hooks = write_hooks(
        etc,
        [
            {
                "name": "stuck",
                "on": ["Scheduled"],
                "timeoutSeconds": 900,
                "command": [script(etc, "stuck.sh", body)],
            },
            {
                "name": "everyone",
                "on": ["Scheduled"],
                "timeoutSeconds": 900,
                "allEvents": True,
                "command": [script(etc, "sleep.sh", "sleep 600")],
            },
        ],
    )
    fw = make(sim, tmp_path / "state", hooks).start()
    try:
        for _ in range(3):
            add_event(sim)
        deadline = time.monotonic() + 30
        while len(pids.read_text().split() if pids.exists() else []) < 2:
            assert time.monotonic() < deadline, fw.stderr_text()[-3000:]
            time.sleep(0.05)
        assert fw.process is not None
        began = time.monotonic()
        fw.process.send_signal(signal.SIGTERM)
        code = fw.process.wait(timeout=30)
        took = time.monotonic() - began
        log = fw.stderr_text()
    finally:
        fw.close()
    assert code == 0, log[-3000:]
    assert took < 5.0, (took, log[-2000:])  # the forwarder's promise (issue 10), hooks or not
    numbers = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in numbers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in numbers), "a hook outlived the forwarder's stop"
    assert "the forwarder stopped while it ran" in log
