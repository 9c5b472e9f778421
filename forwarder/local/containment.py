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
   and left the session is found (a child of the forwarder in another session that is not a
   running hook) and ended when no other hook is running; and the forwarder reaps them.

The end is SIGTERM to all of it, up to a grace period, then SIGKILL. Hooks started by the
forwarder run as its own user, so nothing here needs a privilege.
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sebridge.forwarder.local.hooks_file import open_command

log = logging.getLogger("forwarder.hooks")

MARKER = "SEBRIDGE_HOOK_RUN"
LEFTOVER_GRACE = 1.0  # seconds what a finished hook left behind has between SIGTERM and SIGKILL
KILL_WAIT = 5.0  # seconds for SIGKILLed processes to be gone
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


def _all_pids() -> Iterator[int]:
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                yield int(name)


def _carries(pid: int, marker: bytes) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return marker in environ.split(b"\0")


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
        self._running: set[int] = set()  # main processes of running hooks (Popen reaps them)
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
                    self._running.add(process.pid)
            except BaseException:
                self._remove_cgroup(cgroup)
                raise
        finally:
            os.close(program)
        return Contained(process, token, cgroup)

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

    def end(self, run: Contained, grace: float = LEFTOVER_GRACE) -> int:
        """After the main process was waited for: end everything it left behind (SIGTERM, up to
        ``grace`` seconds, SIGKILL), reap it, remove the cgroup. Returns how many were ended."""
        with self._lock:
            self._running.discard(run.process.pid)
        marker = f"{MARKER}={run.token}".encode()
        ended: set[int] = set()
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT)):
            left = self._leftovers(run, marker)
            if not left:
                break
            ended |= left
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            self._wait_gone(run, marker, wait)
        self.reap()
        self._remove_cgroup(run.cgroup)
        run.killed = len(ended)
        if ended:
            log.warning(
                "hook run left %d process(es) behind: ended (%s)",
                len(ended),
                ", ".join(str(p) for p in sorted(ended)[:10]),
            )
        return len(ended)

    def _leftovers(self, run: Contained, marker: bytes) -> set[int]:
        """Live processes of the run: in its cgroup, its process group, carrying its marker,
        or (no other hook running) orphans the subreaper got from any hook."""
        out: set[int] = set()
        if run.cgroup is not None:
            with contextlib.suppress(OSError):
                out |= {int(p) for p in (run.cgroup / "cgroup.procs").read_text().split()}
        with self._lock:
            alone = not self._running
            running = set(self._running)
        me = os.getpid()
        for pid in _all_pids():
            if pid == me or pid in running:
                continue
            proc = _stat(pid)
            if proc is None or proc.zombie:
                continue
            if proc.pgrp == run.pgid or _carries(pid, marker):
                out.add(pid)
            elif alone and self.subreaper and proc.ppid == me and proc.session != self._session:
                out.add(pid)  # an orphan of a hook that left its session and its marker
        out.discard(me)
        return {pid for pid in out if (p := _stat(pid)) is not None and not p.zombie}

    def _wait_gone(self, run: Contained, marker: bytes, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.reap()
            if not self._leftovers(run, marker):
                return
            time.sleep(0.02)

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
