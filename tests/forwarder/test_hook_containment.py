"""Everything a hook started is gone when it ends (issue 22, item 8), with real processes.

A background child and a ``setsid`` child used to keep running after the hook succeeded or
timed out, counting against the unit's task limit. Each net of
:mod:`sebridge.forwarder.local.containment` is tried on its own: the cgroup (where one can be
made: root here), and without it the process group, the marker and the subreaper.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sebridge.forwarder.local.containment import Containment, _own_cgroup, default_containment
from sebridge.forwarder.local.hooks_file import Hook, parse_hooks
from sebridge.forwarder.local.runner import Invocation, Outcome, run_hook
from sebridge.imds import ScheduledEvent
from tests.forwarder.local_support import Parts
from tests.support.root import skip_unless_root
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
EVENT = ScheduledEvent.from_imds(
    {
        "EventId": "9e1c6b52-7a44-4da0-b1ca-6e8c3f0a1b2c",
        "EventType": "Reboot",
        "EventStatus": "Scheduled",
        "Resources": ["web-1"],
        "NotBefore": "Sun, 22 Nov 2026 10:05:00 GMT",
    }
)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def zombie_children() -> list[int]:
    me = os.getpid()
    out = []
    for task in os.listdir(f"/proc/{me}/task"):
        for pid in Path(f"/proc/{me}/task/{task}/children").read_text().split():
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] == "Z" and int(stat[3]) != os.getsid(0):
                out.append(int(pid))
    return out


@pytest.fixture(params=["cgroup", "group-marker-subreaper"])
def containment(request: pytest.FixtureRequest) -> Iterator[Containment]:
    contain = Containment(cgroups=request.param == "cgroup")
    if request.param == "cgroup":
        need_cgroups(contain)
    yield contain


def need_cgroups(contain: Containment) -> None:
    """Skip where ``contain`` cannot make run cgroups, saying why: a machine without cgroup v2
    is a plain skip; a process that is not root (and has no delegated cgroup) skips with
    NEEDS_ROOT, which fails under CI=true (tests/conftest.py)."""
    if contain.cgroup_base is not None:
        return
    if _own_cgroup() is None:
        pytest.skip("no cgroup v2 on this machine (cgroup v1 only, or not mounted)")
    skip_unless_root("to make cgroups under this process's own (or a delegated cgroup)")
    pytest.skip("cgroup v2 is read-only here, whoever asks (a container's cgroupfs)")


def run(
    contain: Containment, body: str, *, timeout: float = 10, cancel: threading.Event | None = None
) -> Outcome:
    hook = Hook("contain", frozenset({"Scheduled"}), ("/bin/sh", "-c", body), timeout)
    invocation = Invocation(hook, "Scheduled", "x:Scheduled:1", EVENT, "web-1")
    result = run_hook(
        invocation, now=NOW, base_env={}, kill_grace=0.5, containment=contain, cancel=cancel
    )
    return result.outcome


def pids(path: Path, count: int) -> list[int]:
    wait_until(
        lambda: path.exists() and len(path.read_text().split()) >= count, 10, f"{count} pid(s)"
    )
    return [int(p) for p in path.read_text().split()]


def escapees(tmp_path: Path) -> str:
    """A background child, and a setsid child that leaves the session and the group."""
    out = tmp_path / "pids"
    return (
        f"sleep 300 & echo $! >> {out}\n"
        f"setsid sh -c 'echo $$ >> {out}; exec sleep 300' &\n"
        f"while [ $(wc -l < {out}) -lt 2 ]; do sleep 0.02; done\n"
    )


def test_a_background_and_a_setsid_child_of_a_hook_that_succeeded_are_gone(
    containment: Containment, tmp_path: Path
) -> None:
    assert run(containment, escapees(tmp_path) + "exit 0") is Outcome.SUCCEEDED
    background, detached = pids(tmp_path / "pids", 2)
    assert not alive(background), "the background child outlived the hook"
    assert not alive(detached), "the setsid child outlived the hook"
    assert zombie_children() == []


def test_they_are_gone_when_the_hook_fails_or_times_out(
    containment: Containment, tmp_path: Path
) -> None:
    assert run(containment, escapees(tmp_path) + "exit 3") is Outcome.FAILED
    (tmp_path / "pids").rename(tmp_path / "failed")
    assert run(containment, escapees(tmp_path) + "sleep 300", timeout=1) is Outcome.TIMED_OUT
    for pid in pids(tmp_path / "failed", 2) + pids(tmp_path / "pids", 2):
        assert not alive(pid)
    assert zombie_children() == []


def test_they_are_gone_when_the_forwarder_stops(containment: Containment, tmp_path: Path) -> None:
    cancel = threading.Event()
    timer = threading.Timer(1.0, cancel.set)
    timer.start()
    try:
        assert run(containment, escapees(tmp_path) + "sleep 300", cancel=cancel) is (
            Outcome.INTERRUPTED
        )
    finally:
        timer.cancel()
    for pid in pids(tmp_path / "pids", 2):
        assert not alive(pid)


def test_a_child_that_clears_its_environment_and_leaves_the_session_is_found_too(
    containment: Containment, tmp_path: Path
) -> None:
    """No marker, another session and group: the cgroup holds it, and without one the
    subreaper brings it back to the forwarder as an orphan."""
    out = tmp_path / "pids"
    body = (
        f"env -i setsid sh -c 'echo $$ >> {out}; exec sleep 300' &\n"
        f"while [ ! -s {out} ]; do sleep 0.02; done\nexit 0"
    )
    assert run(containment, body) is Outcome.SUCCEEDED
    (pid,) = pids(out, 1)
    assert not alive(pid)
    assert zombie_children() == []


def test_ending_one_run_leaves_another_running_hook_alone(
    containment: Containment, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    release = tmp_path / "release"
    body = (
        f"sleep 300 & echo $! >> {other}\n"
        f"setsid sh -c 'echo $$ >> {other}; exec sleep 300' &\n"
        f"while [ ! -e {release} ]; do sleep 0.05; done"
    )
    outcomes: list[Outcome] = []
    long = threading.Thread(target=lambda: outcomes.append(run(containment, body, timeout=60)))
    long.start()
    try:
        its = pids(other, 2)
        assert run(containment, escapees(tmp_path) + "exit 0") is Outcome.SUCCEEDED
        assert all(alive(pid) for pid in its), "ending one run killed another's processes"
    finally:
        release.touch()
        long.join(timeout=30)
    assert outcomes == [Outcome.SUCCEEDED]
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in its) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in its)


def test_the_run_cgroup_is_removed(tmp_path: Path) -> None:
    contain = Containment()
    need_cgroups(contain)
    assert contain.cgroup_base is not None
    # Only this process's runs: other test workers make and remove theirs meanwhile.
    ours = f"sebridge-hook-{os.getpid()}-*"
    before = set(contain.cgroup_base.glob(ours))
    marker = tmp_path / "cgroup"
    assert run(contain, f"cat /proc/self/cgroup > {marker}; sleep 300 &") is Outcome.SUCCEEDED
    assert f"sebridge-hook-{os.getpid()}-" in marker.read_text()  # it ran in its own cgroup
    assert set(contain.cgroup_base.glob(ours)) == before


def escape(tmp_path: Path) -> str:
    """The reviewer's escape hook (review round four, item 2), its pids recorded: a ``setsid``
    session leader that cleared its environment and ignores SIGTERM, with a background and a
    foreground child (they inherit the ignored SIGTERM). The children leave the leader's
    session for no one: they come back to the subreaper only after the leader's SIGKILL."""
    out = tmp_path / "escaped"
    inner = tmp_path / "inner.sh"
    inner.write_text(
        'trap "" TERM\n'
        f"echo $$ >> {out}\n"
        f"/bin/sleep 277 & echo $! >> {out}\n"
        f"/bin/sh -c 'echo $$ >> {out}; exec /bin/sleep 278'\n"
    )
    return (
        f"setsid env -i /bin/sh {inner} </dev/null >/dev/null 2>&1 &\n"
        f"while [ ! -s {out} ] || [ $(wc -l < {out}) -lt 3 ]; do sleep 0.02; done\n"
        "exit 0"
    )


def test_the_escape_hook_leaves_nothing_and_the_log_says_what_was_ended(
    containment: Containment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the leader got SIGTERM (ignored) and SIGKILL; its children then came back to
    the subreaper, were waited on 5 s without a signal and kept running, while the log said
    "ended (<leader>)". Fails so without cgroups; with one, the cgroup held them all."""
    caplog.set_level(logging.INFO, logger="forwarder.hooks")
    assert run(containment, escape(tmp_path)) is Outcome.SUCCEEDED
    escaped = pids(tmp_path / "escaped", 3)
    assert [pid for pid in escaped if alive(pid)] == [], "the escape hook's processes outlived it"
    assert zombie_children() == []
    ended = " ".join(r.getMessage() for r in caplog.records if "ended (" in r.getMessage())
    assert all(str(pid) in ended for pid in escaped), ended
    assert not [r for r in caplog.records if "could not be ended" in r.getMessage()]


def test_the_escape_hook_leaves_nothing_while_another_hook_runs(
    containment: Containment, tmp_path: Path
) -> None:
    """Before: with another hook running, the orphans of the escape hook were left for later
    (they belong to no running hook); the other hook's processes are still left alone."""
    other = tmp_path / "other"
    release = tmp_path / "release"
    body = (
        f"sleep 300 & echo $! >> {other}\n"
        f"setsid sh -c 'echo $$ >> {other}; exec sleep 300' &\n"
        f"while [ ! -e {release} ]; do sleep 0.05; done"
    )
    outcomes: list[Outcome] = []
    long = threading.Thread(target=lambda: outcomes.append(run(containment, body, timeout=60)))
    long.start()
    try:
        its = pids(other, 2)
        assert run(containment, escape(tmp_path)) is Outcome.SUCCEEDED
        escaped = pids(tmp_path / "escaped", 3)
        assert [pid for pid in escaped if alive(pid)] == [], "they waited for the other hook"
        assert all(alive(pid) for pid in its), "ending one run killed another's processes"
    finally:
        release.touch()
        long.join(timeout=30)
    assert outcomes == [Outcome.SUCCEEDED]
    wait_until(lambda: not any(alive(pid) for pid in its), 10, "the other hook's processes ended")


def test_the_forwarder_stopping_ends_what_hooks_left(
    containment: Containment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run whose end never came (its thread given up at stop): end_all, at stop, ends all
    it left, the escape hook's processes among them, and says so. Before: nothing did."""
    caplog.set_level(logging.INFO, logger="forwarder.hooks")
    started = containment.popen(
        ("/bin/sh", "-c", escape(tmp_path)),
        {"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
    )
    assert started.process.wait(timeout=30) == 0
    escaped = pids(tmp_path / "escaped", 3)
    assert all(alive(pid) for pid in escaped)
    ending = containment.end_all()
    assert [pid for pid in escaped if alive(pid)] == [], "they outlived the forwarder's stop"
    assert set(escaped) <= ending.ended and not ending.left
    assert zombie_children() == []
    assert any("stopping: ended" in r.getMessage() for r in caplog.records)


def test_the_hook_worker_stopping_ends_what_hooks_left(tmp_path: Path) -> None:
    """The stop path: HookWorker.run, once stopped, ends what the process's hooks left (a run
    of the process's one Containment whose end never came). Before: it outlived the stop."""
    idle = {"name": "idle", "on": ["Completed"], "command": ["/bin/true"]}
    hooks = parse_hooks({"hooks": [idle]})
    parts = Parts(tmp_path, hooks)
    assert parts.worker is not None
    stop = threading.Event()
    worker = threading.Thread(target=parts.worker.run, args=(stop,), daemon=True)
    worker.start()
    try:
        started = default_containment().popen(
            ("/bin/sh", "-c", escape(tmp_path)),
            {"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
        )
        assert started.process.wait(timeout=30) == 0
        escaped = pids(tmp_path / "escaped", 3)
        assert all(alive(pid) for pid in escaped)
    finally:
        stop.set()
        worker.join(timeout=30)
        parts.journal.close()
    assert not worker.is_alive()
    assert [pid for pid in escaped if alive(pid)] == [], "they outlived the hooks worker's stop"
    assert zombie_children() == []


def test_what_outlives_the_bound_is_logged_as_still_running_never_as_ended(
    containment: Containment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A leftover that handles SIGTERM and goes on, with a grace longer than the bound: the
    end gives up at the bound and says it still runs (before, any process signalled was
    counted and logged as "ended"). One process, no children: a shell loop of ``sleep`` left
    a new leftover every 50 ms (178 of them in one run), and the log names ten; after the pids
    wrapped, the stubborn one was not among them."""
    caplog.set_level(logging.INFO, logger="forwarder.hooks")
    out = tmp_path / "stubborn"
    stubborn_code = (
        "import os, signal, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: open('{out}.term', 'a').write('TERM'))\n"
        f"open('{out}', 'a').write(f'{{os.getpid()}}\\n')\n"
        "while True:\n    time.sleep(0.05)\n"
    )
    body = (
        f"setsid {shlex.quote(sys.executable)} -c {shlex.quote(stubborn_code)} "
        "</dev/null >/dev/null 2>&1 &\n"
        f"while [ ! -s {out} ]; do sleep 0.02; done\nexit 0"
    )
    started = containment.popen(
        ("/bin/sh", "-c", body),
        {"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
    )
    assert started.process.wait(timeout=30) == 0
    (stubborn,) = pids(out, 1)
    try:
        # The grace outlasts the bound: it only ever gets SIGTERM, which it survives.
        wait_until(lambda: alive(stubborn), 10, "the stubborn child")
        containment.end(started, grace=600, bound=1.0)  # its sleeps are ended, maybe not it
        assert Path(f"{out}.term").exists(), "it never got SIGTERM"
        messages = [r.getMessage() for r in caplog.records]
        if started.cgroup is None:
            assert alive(stubborn)
            assert any("still running" in m and str(stubborn) in m for m in messages), messages
            assert not any("ended (" in m and str(stubborn) in m for m in messages), messages
        else:  # removing the run's cgroup killed it (cgroup.kill): ended, and said so
            assert not alive(stubborn)
            assert any("ended (" in m and str(stubborn) in m for m in messages), messages
            assert not any("still running" in m for m in messages), messages
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stubborn, 9)
        wait_until(lambda: not alive(stubborn), 10, "the stubborn child to be killed")
        containment.reap()
