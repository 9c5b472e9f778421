"""The hook runner against real processes: what a hook receives, and how it ends."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sebridge.forwarder.local.hooks_file import Hook
from sebridge.forwarder.local.runner import (
    MAX_CAPTURE,
    MAX_ENV_BYTES,
    MAX_ENV_VALUE,
    Invocation,
    Outcome,
    hook_environment,
    run_hook,
)
from sebridge.imds import ScheduledEvent

pytestmark = pytest.mark.timeout(60)
NOW = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
SH = "/bin/sh"


def event(status: str = "Scheduled", **fields: object) -> ScheduledEvent:
    raw: dict[str, object] = {
        "EventId": "9E1C6B52-7A44-4DA0-B1CA-6E8C3F0A1B2C",
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["web-1", "web-2"],
        "EventStatus": status,
        "NotBefore": "" if status == "Started" else "Sun, 22 Nov 2026 10:05:00 GMT",
        "Description": "Virtual machine is going to be restarted as requested by authorized user.",
        "EventSource": "User",
        "DurationInSeconds": -1,
    }
    raw.update(fields)
    return ScheduledEvent.from_imds(raw, strict=False)


def invocation(
    command: list[str],
    *,
    timeout: float = 10,
    transition: str = "Scheduled",
    status: str = "Scheduled",
    **fields: object,
) -> Invocation:
    hook = Hook("probe-env", frozenset({transition}), tuple(command), timeout, prepare=False)
    ev = event(status, **fields)
    return Invocation(hook, transition, f"{ev.key}:{transition}:1", ev, "web-1", attempt=1)


def dump_command(tmp_path: Path) -> list[str]:
    return [
        SH,
        "-c",
        'env > "$1"; cat > "$2"',
        "sh",
        str(tmp_path / "env"),
        str(tmp_path / "stdin"),
    ]


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.mark.parametrize(
    ("transition", "status"),
    [
        ("Scheduled", "Scheduled"),
        ("Updated", "Scheduled"),
        ("Started", "Started"),
        ("Completed", "Started"),
        ("Cancelled", "Scheduled"),
    ],
)
def test_the_event_reaches_the_hook_as_environment_and_stdin(
    tmp_path: Path, transition: str, status: str
) -> None:
    inv = invocation(dump_command(tmp_path), transition=transition, status=status)
    secrets = {
        "PATH": "/usr/bin:/bin",
        "SEBRIDGE_CONNECTION_STRING": "Endpoint=sb://x;SharedAccessKey=s3cret",
        "AZURE_CLIENT_ID": "abc",
        "LANG": "C.UTF-8",
    }
    result = run_hook(inv, now=NOW, base_env=secrets)
    assert result.outcome is Outcome.SUCCEEDED, result
    env = read_env(tmp_path / "env")
    assert env["SEBRIDGE_EVENT_ID"] == "9E1C6B52-7A44-4DA0-B1CA-6E8C3F0A1B2C"
    assert env["SEBRIDGE_EVENT_TYPE"] == "Reboot"
    assert env["SEBRIDGE_EVENT_STATUS"] == status
    assert env["SEBRIDGE_EVENT_TRANSITION"] == transition
    assert (
        env["SEBRIDGE_EVENT_MESSAGE_ID"] == f"9e1c6b52-7a44-4da0-b1ca-6e8c3f0a1b2c:{transition}:1"
    )
    assert env["SEBRIDGE_EVENT_RESOURCES"] == "web-1,web-2"
    assert env["SEBRIDGE_EVENT_DURATION_SECONDS"] == "-1"
    assert env["SEBRIDGE_EVENT_SOURCE"] == "User"
    assert env["SEBRIDGE_EVENT_DESCRIPTION"].startswith("Virtual machine is going")
    assert env["SEBRIDGE_VM_NAME"] == "web-1"
    assert env["SEBRIDGE_HOOK_NAME"] == "probe-env" and env["SEBRIDGE_HOOK_ATTEMPT"] == "1"
    if status == "Started":
        assert env["SEBRIDGE_EVENT_NOT_BEFORE"] == ""
        assert env["SEBRIDGE_EVENT_SECONDS_UNTIL_NOT_BEFORE"] == ""
    else:
        assert env["SEBRIDGE_EVENT_NOT_BEFORE"] == "2026-11-22T10:05:00Z"
        assert env["SEBRIDGE_EVENT_SECONDS_UNTIL_NOT_BEFORE"] == "300"
    # Nothing of the forwarder's own settings reaches a hook.
    assert "SEBRIDGE_CONNECTION_STRING" not in env and "AZURE_CLIENT_ID" not in env
    assert "s3cret" not in (tmp_path / "env").read_text()
    assert env["PATH"] == "/usr/bin:/bin" and env["LANG"] == "C.UTF-8"
    document = json.loads((tmp_path / "stdin").read_text())
    assert document["transition"] == transition
    assert document["event"]["EventId"] == "9E1C6B52-7A44-4DA0-B1CA-6E8C3F0A1B2C"
    assert document["event"]["Resources"] == ["web-1", "web-2"]
    assert document["hook"] == {"name": "probe-env", "prepare": False, "attempt": 1}
    assert document["secondsUntilNotBefore"] == (None if status == "Started" else 300)
    assert document["notBefore"] == (None if status == "Started" else "2026-11-22T10:05:00Z")


@pytest.mark.parametrize(("prepare", "seen"), [(True, "1"), (False, "0")])
def test_a_prepare_hook_sees_1_and_any_other_0_as_documented(
    tmp_path: Path, prepare: bool, seen: str
) -> None:
    """docs/vm-actions.md: SEBRIDGE_HOOK_PREPARE is 1 for a prepare hook, 0 for any other
    (review round four, item 4: it was "true"/"false")."""
    inv = invocation(dump_command(tmp_path))
    inv = replace(inv, hook=replace(inv.hook, prepare=prepare))
    assert run_hook(inv, now=NOW, base_env={}).ok
    assert read_env(tmp_path / "env")["SEBRIDGE_HOOK_PREPARE"] == seen
    assert json.loads((tmp_path / "stdin").read_text())["hook"]["prepare"] is prepare


def test_hostile_values_from_imds_still_start_the_hook(tmp_path: Path) -> None:
    inv = invocation(
        dump_command(tmp_path),
        Description="a\x00b\ud800c" + "x" * 100_000,
        EventSource=None,
        DurationInSeconds="n/a",
    )
    result = run_hook(inv, now=NOW, base_env={})
    assert result.outcome is Outcome.SUCCEEDED, result
    env = read_env(tmp_path / "env")
    assert env["SEBRIDGE_EVENT_DESCRIPTION"].startswith("ab?c")
    assert len(env["SEBRIDGE_EVENT_DESCRIPTION"]) == MAX_ENV_VALUE
    assert env["SEBRIDGE_ENV_TRUNCATED"] == "SEBRIDGE_EVENT_DESCRIPTION"
    assert env["SEBRIDGE_EVENT_DURATION_SECONDS"] == "" and env["SEBRIDGE_EVENT_SOURCE"] == ""
    assert env["PATH"].startswith("/usr/local/sbin")  # the default when the forwarder has none
    assert json.loads((tmp_path / "stdin").read_text())["event"]["Description"].startswith("a\x00b")


def test_a_description_of_emoji_still_starts_the_hook(tmp_path: Path) -> None:
    """Issue 22, item 9: 40,000 emoji are 40,000 characters but 160,000 bytes. The environment
    was capped in characters (32,768: 131,072 bytes, over the 128 KiB execve takes in one
    string), so the hook never started ("Argument list too long"). Now in bytes, at a
    character boundary."""
    emoji = "\N{GRINNING FACE}"
    inv = invocation(dump_command(tmp_path), Description=emoji * 40_000)
    result = run_hook(inv, now=NOW, base_env={})
    assert result.outcome is Outcome.SUCCEEDED, result
    value = read_env(tmp_path / "env")["SEBRIDGE_EVENT_DESCRIPTION"]
    assert set(value) == {emoji} and len(value.encode()) == MAX_ENV_VALUE  # whole characters
    stdin = json.loads((tmp_path / "stdin").read_text())
    assert stdin["event"]["Description"] == emoji * 40_000


@pytest.mark.parametrize(
    "fields",
    [
        {"Description": "\N{GRINNING FACE}" * 100_000, "Resources": ["\u00e9" * 60] * 2_000},
        {"Resources": ["web-1"] * 100_000},
        {"Description": "x" * 10**6, "EventSource": "\u4e2d" * 10**5, "EventType": "y" * 10**5},
    ],
)
def test_the_whole_environment_is_bounded_in_bytes(fields: dict[str, object]) -> None:
    env = hook_environment(invocation(["/bin/true"], **fields), NOW, base={"PATH": "/p" * 10**5})
    total = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())
    assert total <= MAX_ENV_BYTES
    assert all(len(v.encode()) <= MAX_ENV_VALUE for v in env.values())
    assert env["SEBRIDGE_EVENT_ID"] == "9E1C6B52-7A44-4DA0-B1CA-6E8C3F0A1B2C"  # never starved
    assert "SEBRIDGE_EVENT_DESCRIPTION" in env["SEBRIDGE_ENV_TRUNCATED"].split(",") or (
        "SEBRIDGE_EVENT_RESOURCES" in env["SEBRIDGE_ENV_TRUNCATED"]
    )
    assert run_hook(invocation(["/bin/true"], **fields), now=NOW).outcome is Outcome.SUCCEEDED


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_pid_file(path: Path) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def test_a_hook_that_times_out_is_killed_with_its_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f'sleep 300 & echo $! > {pids}.child; trap "" TERM; echo $$ > {pids}; sleep 300'
    inv = invocation([SH, "-c", script], timeout=1.0)
    started = time.monotonic()
    result = run_hook(inv, now=NOW, kill_grace=0.5)
    took = time.monotonic() - started
    assert result.outcome is Outcome.TIMED_OUT
    assert "everything it started were killed" in result.detail
    assert 1.0 <= took < 8, took
    leader, child = wait_pid_file(pids), wait_pid_file(Path(f"{pids}.child"))
    deadline = time.monotonic() + 5
    while (alive(leader) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(leader), "the hook survived its timeout"
    assert not alive(child), "the hook's background child survived its timeout"


def test_nothing_a_hook_started_outlives_it(tmp_path: Path) -> None:
    """Issue 22, item 8: a background child and a setsid child used to keep running after the
    hook succeeded (tests/forwarder/test_hook_containment.py tries each net on its own)."""
    out = tmp_path / "pids"
    body = (
        f"sleep 300 & echo $! >> {out}\n"
        f"setsid sh -c 'echo $$ >> {out}; exec sleep 300' &\n"
        f"while [ $(wc -l < {out}) -lt 2 ]; do sleep 0.02; done"
    )
    assert run_hook(invocation([SH, "-c", body]), now=NOW).outcome is Outcome.SUCCEEDED
    background, detached = (int(p) for p in out.read_text().split())
    assert not alive(background), "the background child outlived the hook"
    assert not alive(detached), "the setsid child outlived the hook"


def test_a_stop_of_the_forwarder_interrupts_and_kills_the_hook(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    inv = invocation([SH, "-c", f"echo $$ > {pid_file}; exec sleep 300"], timeout=600)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    result = run_hook(inv, now=NOW, cancel=cancel)
    assert result.outcome is Outcome.INTERRUPTED
    pid = wait_pid_file(pid_file)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_output_is_captured_up_to_the_bound_and_the_rest_counted() -> None:
    inv = invocation([SH, "-c", "head -c 1000000 /dev/zero | tr '\\0' a; echo oops >&2; exit 4"])
    result = run_hook(inv, now=NOW)
    assert result.outcome is Outcome.FAILED and result.exit_code == 4
    assert result.stdout == "a" * MAX_CAPTURE
    assert result.stdout_dropped == 1_000_000 - MAX_CAPTURE
    assert result.stderr == "oops\n" and result.stderr_dropped == 0
    assert result.detail == "exit code 4"


def test_a_hook_that_ignores_stdin_or_closes_it_still_succeeds() -> None:
    result = run_hook(invocation([SH, "-c", "exec 0<&-; exit 0"]), now=NOW)
    assert result.outcome is Outcome.SUCCEEDED


def test_a_background_child_holding_the_output_does_not_hold_the_runner() -> None:
    inv = invocation([SH, "-c", "sleep 30 & echo started"])
    started = time.monotonic()
    result = run_hook(inv, now=NOW)
    assert result.outcome is Outcome.SUCCEEDED and result.stdout == "started\n"
    assert time.monotonic() - started < 5


def test_a_missing_or_non_executable_command_is_not_started(tmp_path: Path) -> None:
    missing = run_hook(invocation([str(tmp_path / "missing")]), now=NOW)
    assert missing.outcome is Outcome.NOT_STARTED and "No such file" in missing.detail
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o644)
    denied = run_hook(invocation([str(script)]), now=NOW)
    assert denied.outcome is Outcome.NOT_STARTED and "Permission denied" in denied.detail


def test_a_hook_killed_by_a_signal_failed() -> None:
    result = run_hook(invocation([SH, "-c", "kill -KILL $$"]), now=NOW)
    assert result.outcome is Outcome.FAILED and result.detail == "killed by signal SIGKILL"


def test_seconds_until_not_before_counts_from_when_the_hook_starts() -> None:
    inv = invocation(["/bin/true"])
    later = hook_environment(inv, NOW + timedelta(seconds=200), base={})
    assert later["SEBRIDGE_EVENT_SECONDS_UNTIL_NOT_BEFORE"] == "100"
    passed = hook_environment(inv, NOW + timedelta(seconds=400), base={})
    assert passed["SEBRIDGE_EVENT_SECONDS_UNTIL_NOT_BEFORE"] == "-100"
