"""scripts/beside: make test's way to run ruff and mypy beside pytest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.waiting import wait_until

BESIDE = Path(__file__).resolve().parents[2] / "scripts" / "beside"


def beside(background: str, *foreground: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BESIDE), background, *foreground], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("background", "foreground", "code"),
    [
        ("exit 0", "true", 0),
        ("exit 3", "true", 3),  # a failed check fails the run even when the tests pass
        ("exit 0", "false", 1),
        ("exit 3", "false", 1),  # the tests' own exit status comes first
    ],
)
def test_either_failing_fails_the_whole(background: str, foreground: str, code: int) -> None:
    assert beside(background, foreground).returncode == code


def test_the_background_output_comes_after_the_foreground_output(tmp_path: Path) -> None:
    marker = tmp_path / "background-ran"
    # The foreground waits until the background has written: both ran at the same time...
    done = beside(
        f"echo from-the-checks; touch {marker}",
        "bash",
        "-c",
        f"for i in $(seq 200); do [ -e {marker} ] && break; sleep 0.05; done; "
        f"[ -e {marker} ] && echo from-the-tests",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # ...and what the checks printed is shown after what the tests printed, under a header.
    lines = done.stdout.splitlines()
    assert lines[0] == "from-the-tests"
    assert lines[1].startswith("== beside it: echo from-the-checks")
    assert lines[2] == "from-the-checks"


def test_no_kept_output_is_left_behind(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BESIDE), "echo kept", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0
    assert "kept" in done.stdout
    assert list(tmp_path.iterdir()) == []


FOREGROUND = """
import time
try:
    print("the tests started", flush=True)
    time.sleep(30)
except KeyboardInterrupt:
    print("the tests stopped cleanly", flush=True)
    raise SystemExit(130)
"""


# The checks beside: a process that waits 31 s, with the test's marker in its arguments.
WAITS = f"{sys.executable} -c 'import time; time.sleep(31)'"


def _in_a_session_of_its_own() -> None:
    """As from a terminal: SIGINT at its default, and a process group to signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()


def _leftovers(marker: str) -> list[str]:
    """The processes with the test's marker in their arguments, as "pid ppid pgid state args"."""
    ps = subprocess.run(
        ["ps", "-ww", "-eo", "pid=,ppid=,pgid=,stat=,args="],
        capture_output=True,
        text=True,
        timeout=10,
    )
    return [line.strip() for line in ps.stdout.splitlines() if marker in line]


def _both_commands_run(marker: str) -> bool:
    """Both commands exec'd: the checks' and the tests' Pythons, not a fork of beside yet."""
    commands = [line.split(None, 4)[4] for line in _leftovers(marker)]
    pythons = [args for args in commands if args.startswith(sys.executable)]
    return any("time.sleep(31)" in args for args in pythons) and any(
        args.endswith(".py") for args in pythons
    )


@pytest.mark.parametrize(
    ("sig", "to_group", "code"),
    [
        (signal.SIGINT, True, 130),  # Ctrl-C: the terminal signals the whole foreground group
        # make, or a CI runner, stopping the command it started: the tests are interrupted as
        # on Ctrl-C, so that their clean-ups run
        (signal.SIGTERM, False, 130),
    ],
)
def test_a_stop_reaches_both_commands_and_keeps_the_checks_output(
    tmp_path: Path, sig: signal.Signals, to_group: bool, code: int
) -> None:
    marker = f"beside-{tmp_path.name}"
    script = tmp_path / f"{marker}.py"
    script.write_text(FOREGROUND)
    beside_run = subprocess.Popen(
        [str(BESIDE), f"echo checks-started; exec {WAITS} {marker}", sys.executable, script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_in_a_session_of_its_own,
    )
    try:
        assert beside_run.stdout is not None
        assert beside_run.stdout.readline() == "the tests started\n"
        # The checks under way too. Signalled earlier, while beside's fork for a command has
        # not yet exec'd it, the stop would test bash's fork, not beside: wait for both.
        wait_until(lambda: _both_commands_run(marker), 20, "both commands under way")
        if to_group:
            os.killpg(beside_run.pid, sig)
        else:
            beside_run.send_signal(sig)
        out, _ = beside_run.communicate(timeout=20)
    finally:
        if beside_run.poll() is None:
            os.killpg(beside_run.pid, signal.SIGKILL)
            beside_run.wait(timeout=10)
    assert beside_run.returncode == code, out
    assert "the tests stopped cleanly" in out  # pytest's own clean-ups run
    assert "checks-started" in out.split("== beside it:", 1)[1]
    assert f"== stopped by {sig.name}" in out
    # Gone within a moment: under load, a process with beside's own arguments was twice still
    # listed as beside returned (a fork not yet exec'd, or exiting), once for 5 s when the stop
    # came before both forks had exec'd. The listing names pid, parent, group and state.
    deadline = time.monotonic() + 5
    while _leftovers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leftovers(marker) == [], "a command outlived the stop"
