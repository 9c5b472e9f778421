"""Everything a hook started is gone when the hook ends, whatever the outcome.

A hook is started in a session of its own, so its process group is its own; but a hook may
put a child in the background and exit, or start one with ``setsid`` (a new session and group)
or double-fork it away. Such children used to outlive the hook, and count against the unit's
task limit. Three nets, from the strongest:

1. **A cgroup per run**, where the forwarder can make cgroups of its own (cgroup v2, its own
   cgroup writable: systemd ``Delegate=yes`` with ``ProtectControlGroups=no``, or root): the
   hook moves itself into ``sebridge-hook-<pid>-<n>`` before it executes (a fixed ``/bin/sh``
   trampoline: ``echo $$ > cgroup.procs; exec "$@"``, the hook's argv passed through untouched),
   so nothing it starts can leave; at the end every member is signalled, and the cgroup removed.
2. **The process group and a per-run marker**: ``SEBRIDGE_HOOK_RUN=<token>`` in the hook's
   environment, inherited by everything it starts (``setsid`` keeps it): at the end, the group
   and every process carrying the marker are signalled.
3. **The forwarder as a child subreaper** (``PR_SET_CHILD_SUBREAPER``): what a hook orphans
   comes back to the forwarder instead of init, so even a child that cleared its environment
   and left the session is found (a child of the forwarder in another session that belongs to
   no running hook: not its main process, cgroup, group, marker, or a session its processes
   made) and ended; and the forwarder reaps them.

The end is a loop, bounded in time (:data:`END_BOUND`): signal what is found (SIGTERM, up to a
grace period, then SIGKILL; SIGKILL at once to a process that ignores SIGTERM), then look again,
since ending a process brings its children back to the subreaper (the children of a ``setsid``
leader that ignored SIGTERM come back only after its SIGKILL, and ignore SIGTERM too); what
came back in a session the run's processes made is the run's even while another hook runs.
The loop waits on the condition (nothing of the run left), never a fixed time, and the log
says what was ended and what could not be. When the forwarder stops, :meth:`Containment.
end_all` ends whatever any hook left (bounded too). Hooks started by the forwarder run as its
own user, so nothing here needs a privilege.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sebridge.forwarder.local.hooks_file import open_command

log = logging.getLogger("forwarder.hooks")

MARKER = "SEBRIDGE_HOOK_RUN"
LEFTOVER_GRACE = 1.0  # seconds what a finished hook left behind has between SIGTERM and SIGKILL
KILL_WAIT = 5.0  # seconds for SIGKILLed processes to be gone
END_BOUND = LEFTOVER_GRACE + KILL_WAIT  # seconds ending what a run left may take in all
LEFTOVER_STOP_GRACE = 0.5  # at a stop: SIGTERM, this, SIGKILL to what hooks left
LEFTOVER_STOP_BOUND = 1.5  # ... and in all at most this (the forwarder stops within 5 s)
_SIGTERM_BIT = 1 << (signal.SIGTERM - 1)  # in /proc/<pid>/status SigIgn
CGROUP_PREFIX = "sebridge-hook-"
PR_SET_CHILD_SUBREAPER = 36
# The trampoline: join the run's cgroup, then become the hook. "$0" is the cgroup.procs path;
# the hook's argv follows as "$@", never read by the shell.
_TRAMPOLINE = 'echo $$ > "$0" 2>/dev/null; exec "$@"'


@dataclass
class Contained:
    """One hook run: its main process, its marker and its cgroup (if any)."""

    process: subprocess.Popen[bytes]
    token: str
    cgroup: Path | None = None
    killed: int = 0  # processes it left behind that were ended

    @property
    def pgid(self) -> int:
        return self.process.pid


@dataclass(frozen=True)
class Ending:
    """What an end found: the processes ended, and those still running after the bound."""

    ended: frozenset[int]
    left: frozenset[int]

    def again(self, contain: Containment) -> Ending:
        """The same after something else may have ended some of ``left`` (a cgroup's kill)."""
        contain.reap()
        gone = frozenset(pid for pid in self.left if not _alive(pid))
        return Ending(self.ended | gone, self.left - gone)


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    session: int
    zombie: bool


def _stat(pid: int) -> _Proc | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        fields = text.rsplit(")", 1)[1].split()
        return _Proc(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0] == "Z")
    except (IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    proc = _stat(pid)
    return proc is not None and not proc.zombie


def _ignores_term(pid: int) -> bool:
    """Whether ``pid`` ignores SIGTERM (``trap "" TERM``, inherited across exec): it gets
    SIGKILL at once, as a grace period would only be waited out."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & _SIGTERM_BIT)
    except (OSError, IndexError, ValueError):
        pass
    return False


def _pids(pids: Iterable[int]) -> str:
    listed = sorted(pids)
    more = f" and {len(listed) - 10} more" if len(listed) > 10 else ""
    return ", ".join(str(p) for p in listed[:10]) + more


def _all_pids() -> Iterator[int]:
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                yield int(name)


def _markers(pid: int) -> set[bytes]:
    """The ``SEBRIDGE_HOOK_RUN=...`` entries of ``pid``'s environment (one read)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return set()
    prefix = f"{MARKER}=".encode()
    return {entry for entry in environ.split(b"\0") if entry.startswith(prefix)}


def _own_cgroup() -> Path | None:
    """The forwarder's own cgroup v2 directory, or None (cgroup v1 only, not mounted)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    relative = next((line[3:] for line in lines if line.startswith("0::")), None)
    if relative is None:
        return None
    for mount in mounts:
        parts = mount.split(" - ")
        if len(parts) == 2 and parts[1].split()[0] == "cgroup2":
            point = parts[0].split()[4]
            return Path(point) / relative.lstrip("/")
    return None


class Containment:
    """The one way hooks are started and ended (see the module's docstring)."""

    def __init__(
        self,
        *,
        cgroups: bool = True,
        subreaper: bool = True,
        trusted_owners: Sequence[int] = (0,),
    ) -> None:
        # Who may own a hook's command besides the forwarder's own user (hooks_file).
        self.trusted_owners = tuple(trusted_owners)
        self._lock = threading.Lock()  # around starting a hook and reaping: see reap()
        # Running hooks by main process (Popen reaps those), each with its marker and cgroup.
        self._running: dict[int, Contained] = {}
        self._serial = itertools.count(1)
        self._session = os.getsid(0)
        self.subreaper = self._become_subreaper() if subreaper else False
        self.cgroup_base = self._cgroup_base() if cgroups else None

    # -- set-up ---------------------------------------------------------------------------
    @staticmethod
    def _become_subreaper() -> bool:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        except (OSError, AttributeError) as exc:
            log.warning("cannot become the child subreaper of hooks (%s): orphans go to init", exc)
            return False
        return True

    def _cgroup_base(self) -> Path | None:
        """Where run cgroups can be made (proved by making and removing one), or None."""
        base = _own_cgroup()
        if base is None or not (base / "cgroup.procs").exists():
            return None
        for leftover in base.glob(f"{CGROUP_PREFIX}*"):  # of a forwarder that was killed
            owner = leftover.name.removeprefix(CGROUP_PREFIX).split("-")[0]
            if owner.isdigit() and _stat(int(owner)) is None:
                with contextlib.suppress(OSError):
                    leftover.rmdir()
        probe = base / f"{CGROUP_PREFIX}{os.getpid()}-probe"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            log.info(
                "hooks are contained by process group, marker and subreaper, not by cgroup "
                "(cannot make one in %s: %s; with systemd: Delegate=yes, ProtectControlGroups=no)",
                base,
                exc.strerror,
            )
            return None
        return base

    def describe(self) -> str:
        nets = ["process group", "marker"]
        if self.subreaper:
            nets.append("subreaper")
        if self.cgroup_base is not None:
            nets.insert(0, f"cgroup under {self.cgroup_base}")
        return ", ".join(nets)

    # -- a run --------------------------------------------------------------------------
    def popen(self, argv: Sequence[str], env: Mapping[str, str], **options: Any) -> Contained:
        """Start ``argv`` contained (raises OSError or ValueError as Popen does)."""
        token = secrets.token_hex(12)
        # The command is checked on the file it opens (owner, mode, every directory, no link)
        # and executed from that descriptor: a file swapped after the check is never run.
        program = open_command(argv[0], self.trusted_owners)
        try:
            if not os.fstat(program).st_mode & 0o111:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), argv[0])
            os.set_inheritable(program, True)
            executable = f"/proc/self/fd/{program}"
            cgroup = self._make_cgroup()
            command = list(argv)
            if cgroup is not None:
                procs = str(cgroup / "cgroup.procs")
                command = ["/bin/sh", "-c", _TRAMPOLINE, procs, executable, *command[1:]]
                executable = "/bin/sh"
            try:
                with self._lock:
                    process = subprocess.Popen(  # noqa: S603 - argv from the checked hooks file
                        command,
                        executable=executable,
                        env={**env, MARKER: token},
                        start_new_session=True,
                        pass_fds=(program,),
                        **options,
                    )
                    run = Contained(process, token, cgroup)
                    self._running[process.pid] = run
            except BaseException:
                self._remove_cgroup(cgroup)
                raise
        finally:
            os.close(program)
        return run

    def terminate(self, run: Contained, grace: float) -> None:
        """End the main process and its group (a timeout, a stop): SIGTERM, up to ``grace``
        seconds, SIGKILL. The rest goes in :meth:`end`."""
        process = run.process
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pgid, sig)
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def end(self, run: Contained, grace: float = LEFTOVER_GRACE, bound: float = END_BOUND) -> int:
        """After the main process was waited for: end everything it left behind (the loop of
        the module's docstring, at most ``bound`` seconds), reap it, remove the cgroup. Returns
        how many were ended; what could not be is logged."""
        with self._lock:
            self._running.pop(run.process.pid, None)
        sessions = {run.pgid}  # sessions (and groups) the run's processes made
        ending = self._end(lambda: self._of_runs([run], sessions), grace, bound)
        if run.cgroup is not None:  # removing it kills what is still in it (cgroup.kill)
            self._remove_cgroup(run.cgroup)
            ending = ending.again(self)
        run.killed = len(ending.ended)
        if ending.ended:
            log.warning(
                "hook run left %d process(es) behind: ended (%s)",
                len(ending.ended),
                _pids(ending.ended),
            )
        if ending.left:
            log.error(
                "hook run left %d process(es) behind that could not be ended within %.1f s, "
                "still running: %s",
                len(ending.left),
                bound,
                _pids(ending.left),
            )
        return len(ending.ended)

    def end_all(
        self, grace: float = LEFTOVER_STOP_GRACE, bound: float = LEFTOVER_STOP_BOUND
    ) -> Ending:
        """When the forwarder stops: end every process its hooks left (orphans the subreaper
        got, whether or not a hook still runs, and all of any run not ended yet), at most
        ``bound`` seconds."""
        with self._lock:
            runs = list(self._running.values())
        sessions = {run.pgid for run in runs}
        ending = self._end(lambda: self._of_runs(runs, sessions), grace, bound)
        for run in runs:
            self._remove_cgroup(run.cgroup)
        ending = ending.again(self)
        if ending.ended:
            log.warning(
                "stopping: ended %d process(es) hooks left (%s)",
                len(ending.ended),
                _pids(ending.ended),
            )
        if ending.left:
            log.error(
                "stopping: %d process(es) hooks left could not be ended within %.1f s, still "
                "running: %s",
                len(ending.left),
                bound,
                _pids(ending.left),
            )
        return ending

    def _end(self, find: Callable[[], set[int]], grace: float, bound: float) -> Ending:
        """Signal what ``find`` finds until it finds nothing or ``bound`` seconds passed: each
        process SIGTERM (SIGKILL if it ignores SIGTERM), SIGKILL ``grace`` seconds later; then
        look again (what ending one brought back to the subreaper is found the next time)."""
        deadline = time.monotonic() + bound
        termed: dict[int, float] = {}  # pid: when it got SIGTERM
        killed: set[int] = set()
        pause = 0.002
        while True:
            self.reap()
            live = find()
            now = time.monotonic()
            if not live or now >= deadline:
                break
            sent = False
            for pid in live:
                sig: signal.Signals | None = None
                if pid not in termed:
                    termed[pid] = now
                    sig = signal.SIGKILL if _ignores_term(pid) else signal.SIGTERM
                elif pid not in killed and now - termed[pid] >= grace:
                    sig = signal.SIGKILL
                if sig is None:
                    continue
                if sig is signal.SIGKILL:
                    killed.add(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
                sent = True
            # The condition is polled: short pauses right after a signal, longer after.
            pause = 0.002 if sent else min(0.05, pause * 2)
            time.sleep(min(pause, max(0.0, deadline - now)))
        self.reap()
        left = {pid for pid in (set(termed) | find()) if _alive(pid)}
        return Ending(frozenset(set(termed) - left), frozenset(left))

    def _of_runs(self, runs: Sequence[Contained], sessions: set[int]) -> set[int]:
        """Live processes of ``runs``: in their cgroups, process groups, carrying their markers,
        or in a session or group one of their processes made (``sessions`` grows with what is
        found); and the orphans the subreaper got that belong to no other running hook (its
        main process, cgroup, group, marker, or a session or group its processes made)."""
        # Under the lock that starting a hook takes: a hook starting meanwhile is either
        # among the running (its main process theirs) or not yet started, never an orphan.
        with self._lock:
            return self._of_runs_locked(runs, sessions)

    def _of_runs_locked(self, runs: Sequence[Contained], sessions: set[int]) -> set[int]:
        others = [run for run in self._running.values() if run not in runs]
        ours_cg = self._cgroup_members(runs)
        theirs_cg = self._cgroup_members(others)
        ours_marks = {f"{MARKER}={run.token}".encode() for run in runs}
        theirs_marks = {f"{MARKER}={run.token}".encode() for run in others}
        theirs_main = {run.process.pid for run in others}
        their_sessions = {run.pgid for run in others}
        me = os.getpid()
        mine = {self._session, os.getpgrp(), 0, 1}
        procs = {
            pid: proc
            for pid in _all_pids()
            if pid != me and (proc := _stat(pid)) is not None and not proc.zombie
        }
        ours: set[int] = set()
        theirs: set[int] = set()
        for pid, proc in procs.items():
            marks = _markers(pid) if ours_marks or theirs_marks else set()
            if (
                pid in ours_cg
                or proc.session in sessions
                or proc.pgrp in sessions
                or bool(marks & ours_marks)
            ):
                ours.add(pid)
                sessions |= {proc.session, proc.pgrp} - mine
            elif (
                pid in theirs_main
                or pid in theirs_cg
                or proc.session in their_sessions
                or proc.pgrp in their_sessions
                or bool(marks & theirs_marks)
            ):
                theirs.add(pid)
                their_sessions |= {proc.session, proc.pgrp} - mine
        if self.subreaper:  # an orphan of a hook that left its session and its marker
            for pid, proc in procs.items():
                if (
                    proc.ppid == me
                    and pid not in theirs
                    and proc.session not in mine
                    and proc.session not in their_sessions
                    and proc.pgrp not in their_sessions
                ):
                    ours.add(pid)
                    sessions |= {proc.session, proc.pgrp} - mine
        return ours

    @staticmethod
    def _cgroup_members(runs: Iterable[Contained]) -> set[int]:
        out: set[int] = set()
        for run in runs:
            if run.cgroup is not None:
                with contextlib.suppress(OSError, ValueError):
                    out |= {int(p) for p in (run.cgroup / "cgroup.procs").read_text().split()}
        return out

    def reap(self) -> int:
        """Reap zombies the subreaper inherited: children of the forwarder in another session
        that are not a running hook (those are Popen's). Returns how many."""
        if not self.subreaper:
            return 0
        me = os.getpid()
        reaped = 0
        with self._lock:
            for pid in self._children(me):
                if pid in self._running:
                    continue
                proc = _stat(pid)
                if proc is None or not proc.zombie or proc.session == self._session:
                    continue
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        reaped += 1
        return reaped

    @staticmethod
    def _children(me: int) -> list[int]:
        pids: list[int] = []
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{me}/task"):
                with contextlib.suppress(OSError):
                    text = Path(f"/proc/{me}/task/{task}/children").read_text()
                    pids.extend(int(p) for p in text.split())
        return pids

    # -- cgroups ------------------------------------------------------------------------
    def _make_cgroup(self) -> Path | None:
        if self.cgroup_base is None:
            return None
        path = self.cgroup_base / f"{CGROUP_PREFIX}{os.getpid()}-{next(self._serial)}"
        try:
            path.mkdir()
        except OSError as exc:
            log.warning("cannot make the hook's cgroup %s (%s): contained without", path, exc)
            return None
        return path

    def _remove_cgroup(self, path: Path | None) -> None:
        if path is None:
            return
        deadline = time.monotonic() + KILL_WAIT
        while True:
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.warning("cannot remove the hook's cgroup %s: %s", path, exc)
                    return
                with contextlib.suppress(OSError):  # still populated: end what is in it
                    (path / "cgroup.kill").write_text("1")
                time.sleep(0.02)


_default: Containment | None = None
_default_lock = threading.Lock()


def default_containment() -> Containment:
    """The process's one Containment (the subreaper is a property of the process)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Containment()
            log.info("hooks are contained by %s", _default.describe())
        return _default


def reap_orphans() -> int:
    """Reap what the subreaper inherited since the last run ended (called now and then)."""
    with _default_lock:
        contain = _default
    return contain.reap() if contain is not None else 0


def end_left_behind(
    grace: float = LEFTOVER_STOP_GRACE, bound: float = LEFTOVER_STOP_BOUND
) -> Ending | None:
    """When the forwarder stops: end every process its hooks left (:meth:`Containment.
    end_all`); None when no hook was ever started."""
    with _default_lock:
        contain = _default
    return contain.end_all(grace, bound) if contain is not None else None
