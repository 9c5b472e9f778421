"""Run one hook: argv without a shell, the event in ``SEBRIDGE_EVENT_*`` variables and as JSON
on stdin, bounded output capture, and a timeout that kills the hook and all it started.

The hook is started contained (:mod:`sebridge.forwarder.local.containment`: a session of its
own, a per-run marker, a cgroup where one can be made), so that on timeout (or when the
forwarder stops) SIGTERM, a grace period, then SIGKILL reach it; and whatever the outcome,
what it left running (a background or ``setsid`` child) is ended when it ends. One thread does
all the I/O with a selector (stdin is written without blocking, stdout and stderr are read as
they come), so a hook that never reads its input or writes without end can neither block nor
exhaust the forwarder: the first :data:`MAX_CAPTURE` bytes of each stream are kept, the rest is
counted and dropped.

The environment is built from scratch (PATH, LANG, HOME, TZ of the forwarder and the event):
the forwarder's own settings, a connection string among them, never reach a hook. It is bounded
in bytes, each value cut at a UTF-8 character boundary (:data:`MAX_ENV_VALUE`,
:data:`MAX_ENV_BYTES`; ``SEBRIDGE_ENV_TRUNCATED`` names the variables cut), so no value IMDS
sends can keep a hook from starting; the whole event is on stdin.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sebridge.forwarder.local.containment import (
    LEFTOVER_STOP_BOUND,
    LEFTOVER_STOP_GRACE,
    Contained,
    Containment,
    default_containment,
)
from sebridge.forwarder.local.hooks_file import Hook
from sebridge.imds import ScheduledEvent, isoformat_utc

MAX_CAPTURE = 64 * 1024  # bytes kept of each of stdout and stderr
# The environment is bounded in bytes (what execve counts: Linux refuses one "NAME=value" string
# over 128 KiB, and all of argv and the environment over a quarter of the stack limit with E2BIG,
# "Argument list too long"), each value cut at a UTF-8 character boundary. The whole event is on
# stdin either way.
MAX_ENV_VALUE = 16 * 1024  # bytes of one variable's value
MAX_ENV_BYTES = 64 * 1024  # bytes of the whole environment ("NAME=value\0" each)
MAX_PASSED_VALUE = 4 * 1024  # bytes of PATH, LANG... passed through from the forwarder
_NOTE_RESERVE = 1024  # bytes kept for SEBRIDGE_ENV_TRUNCATED
# Cut last when the whole is over its bound: the two values IMDS does not bound.
_CUT_FIRST = ("SEBRIDGE_EVENT_RESOURCES", "SEBRIDGE_EVENT_DESCRIPTION")
KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL on timeout
STOP_GRACE = 1.0  # the same when the forwarder stops (it has 5 s in all)
PIPE_GRACE = 1.0  # how long output is still read after the hook exited (a background child)
PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "HOME", "TZ")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # non-zero exit, or killed by a signal
    TIMED_OUT = "timed-out"
    NOT_STARTED = "not-started"  # exec failed: missing, not executable...
    INTERRUPTED = "interrupted"  # the forwarder stopped while it ran: run again after restart


@dataclass(frozen=True)
class Invocation:
    """One hook for one transition of one event, as this VM observed it."""

    hook: Hook
    transition: str
    message_id: str
    event: ScheduledEvent
    vm_name: str
    attempt: int = 1


@dataclass(frozen=True)
class HookResult:
    outcome: Outcome
    exit_code: int | None
    seconds: float
    stdout: str = ""
    stderr: str = ""
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.SUCCEEDED


def _clean(value: str) -> str:
    """A value the OS takes in an environment: no NUL, no lone surrogate."""
    return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def cut_utf8(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` bytes of UTF-8, cut at a character boundary."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: max(0, limit)].decode("utf-8", "ignore")


def _size(key: str, value: str) -> int:
    return len(key.encode("utf-8")) + len(value.encode("utf-8")) + 2  # "=" and the NUL


def seconds_until(event: ScheduledEvent, now: datetime) -> int | None:
    if event.not_before is None:
        return None
    return int((event.not_before - now).total_seconds())


def hook_environment(
    invocation: Invocation, now: datetime, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    base = os.environ if base is None else base
    env = {key: base[key] for key in PASSED_THROUGH if key in base}
    env.setdefault("PATH", DEFAULT_PATH)
    event = invocation.event
    until = seconds_until(event, now)
    duration = event.duration_in_seconds
    values = {
        "SEBRIDGE_HOOK_NAME": invocation.hook.name,
        "SEBRIDGE_HOOK_PREPARE": "1" if invocation.hook.prepare else "0",
        "SEBRIDGE_HOOK_ATTEMPT": str(invocation.attempt),
        "SEBRIDGE_VM_NAME": invocation.vm_name,
        "SEBRIDGE_EVENT_TRANSITION": invocation.transition,
        "SEBRIDGE_EVENT_MESSAGE_ID": invocation.message_id,
        "SEBRIDGE_EVENT_ID": event.event_id,
        "SEBRIDGE_EVENT_TYPE": event.event_type,
        "SEBRIDGE_EVENT_STATUS": event.status,
        "SEBRIDGE_EVENT_RESOURCE_TYPE": event.resource_type,
        "SEBRIDGE_EVENT_RESOURCES": ",".join(event.resources),
        "SEBRIDGE_EVENT_NOT_BEFORE": isoformat_utc(event.not_before) if event.not_before else "",
        "SEBRIDGE_EVENT_SECONDS_UNTIL_NOT_BEFORE": "" if until is None else str(until),
        "SEBRIDGE_EVENT_DURATION_SECONDS": "" if duration is None else str(duration),
        "SEBRIDGE_EVENT_SOURCE": event.event_source or "",
        "SEBRIDGE_EVENT_DESCRIPTION": event.description or "",
    }
    env = {key: cut_utf8(_clean(value), MAX_PASSED_VALUE) for key, value in env.items()}
    budget = MAX_ENV_BYTES - _NOTE_RESERVE - sum(_size(key, value) for key, value in env.items())
    cut: list[str] = []
    # The small values first; Resources and Description get what is left, within their bound.
    for key in sorted(
        values, key=lambda name: _CUT_FIRST.index(name) + 1 if name in _CUT_FIRST else 0
    ):
        clean = _clean(values[key])
        value = cut_utf8(clean, max(0, min(MAX_ENV_VALUE, budget - _size(key, ""))))
        if value != clean:
            cut.append(key)
        env[key] = value
        budget -= _size(key, value)
    if cut:
        env["SEBRIDGE_ENV_TRUNCATED"] = ",".join(cut)  # the full values are on stdin
    return env


def hook_input(invocation: Invocation, now: datetime) -> bytes:
    """The JSON document on the hook's stdin."""
    event = invocation.event
    document: dict[str, Any] = {
        "schemaVersion": 1,
        "hook": {
            "name": invocation.hook.name,
            "prepare": invocation.hook.prepare,
            "attempt": invocation.attempt,
        },
        "vmName": invocation.vm_name,
        "transition": invocation.transition,
        "messageId": invocation.message_id,
        "notBefore": isoformat_utc(event.not_before) if event.not_before else None,
        "secondsUntilNotBefore": seconds_until(event, now),
        "event": event.to_imds(),
    }
    text = json.dumps(document, ensure_ascii=True, separators=(",", ":"), default=str)
    return text.encode("ascii") + b"\n"


class _Capture:
    def __init__(self) -> None:
        self.kept = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = MAX_CAPTURE - len(self.kept)
        self.kept += chunk[:room]
        self.dropped += max(0, len(chunk) - room)

    def text(self) -> str:
        return self.kept.decode("utf-8", "replace")


def run_hook(
    invocation: Invocation,
    *,
    now: datetime,
    cancel: threading.Event | None = None,
    base_env: Mapping[str, str] | None = None,
    kill_grace: float = KILL_GRACE,
    containment: Containment | None = None,
) -> HookResult:
    """Run the hook to its end, its timeout, or ``cancel``; never raises for the hook's faults.
    Whatever the outcome, nothing the hook started outlives the call (:mod:`sebridge.forwarder.
    local.containment`)."""
    hook = invocation.hook
    cancel = cancel or threading.Event()
    contain = containment or default_containment()
    started = time.monotonic()
    try:
        run = contain.popen(
            hook.command,
            hook_environment(invocation, now, base_env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            close_fds=True,
        )
    except (OSError, ValueError) as exc:
        return HookResult(
            Outcome.NOT_STARTED, None, time.monotonic() - started, detail=f"cannot start: {exc}"
        )
    try:
        return _supervise(invocation, run, now, cancel, kill_grace, contain, started)
    finally:
        if cancel.is_set():  # the forwarder stops: it has 5 s in all
            contain.end(run, LEFTOVER_STOP_GRACE, LEFTOVER_STOP_BOUND)
        else:
            contain.end(run)


def _supervise(
    invocation: Invocation,
    run: Contained,
    now: datetime,
    cancel: threading.Event,
    kill_grace: float,
    contain: Containment,
    started: float,
) -> HookResult:
    hook = invocation.hook
    process = run.process
    assert process.stdin and process.stdout and process.stderr
    pending = memoryview(hook_input(invocation, now))
    captures = {process.stdout.fileno(): _Capture(), process.stderr.fileno(): _Capture()}
    selector = selectors.DefaultSelector()
    for stream in (process.stdout, process.stderr):
        os.set_blocking(stream.fileno(), False)
        selector.register(stream, selectors.EVENT_READ)
    os.set_blocking(process.stdin.fileno(), False)
    selector.register(process.stdin, selectors.EVENT_WRITE)
    writing = True
    deadline = started + hook.timeout
    outcome: Outcome | None = None
    exited_at: float | None = None
    open_readers = 2
    try:
        while True:
            clock = time.monotonic()
            if exited_at is None and process.poll() is not None:
                exited_at = clock
            if exited_at is not None and (open_readers == 0 or clock - exited_at > PIPE_GRACE):
                break
            if exited_at is None and clock >= deadline:
                outcome = Outcome.TIMED_OUT
                contain.terminate(run, kill_grace)
                break
            if exited_at is None and cancel.is_set():
                outcome = Outcome.INTERRUPTED
                contain.terminate(run, STOP_GRACE)
                break
            wait = 0.1 if exited_at is not None else max(0.0, min(0.1, deadline - clock))
            for key, _ in selector.select(timeout=wait):
                if key.fileobj is process.stdin:
                    try:
                        written = os.write(process.stdin.fileno(), pending[:65536])
                        pending = pending[written:]
                    except BlockingIOError:
                        continue
                    except OSError:  # the hook closed its stdin (or exited): it did not read
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(process.stdin)
                        process.stdin.close()
                        writing = False
                    continue
                fd = key.fd
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if chunk:
                    captures[fd].add(chunk)
                else:
                    selector.unregister(key.fileobj)
                    open_readers -= 1
    finally:
        selector.close()
        if writing:
            process.stdin.close()
        process.stdout.close()
        process.stderr.close()
        if process.poll() is None:
            # A leak guard for an exception above: nothing of the hook outlives this call.
            contain.terminate(run, 0.0)
    exit_code = process.wait()
    out, err = captures.values()
    if outcome is None:
        outcome = Outcome.SUCCEEDED if exit_code == 0 else Outcome.FAILED
    if outcome is Outcome.TIMED_OUT:
        detail = f"timed out after {hook.timeout:g} s: it and everything it started were killed"
    elif outcome is Outcome.INTERRUPTED:
        detail = "the forwarder stopped while it ran: it and everything it started were killed"
    elif exit_code < 0:
        try:
            detail = f"killed by signal {signal.Signals(-exit_code).name}"
        except ValueError:
            detail = f"killed by signal {-exit_code}"
    else:
        detail = f"exit code {exit_code}"
    return HookResult(
        outcome,
        exit_code,
        time.monotonic() - started,
        stdout=out.text(),
        stderr=err.text(),
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
        detail=detail,
    )
