"""Run the project's programs as real child processes: for the demo, tests and benchmarks.

A :class:`ChildProcess` starts ``python -m sebridge.cli <command> ...`` (no PATH needed),
collects stdout lines with their arrival time (monotonic) in a thread, keeps stderr in a log
file, and always stops the process: SIGTERM first, SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


@dataclass(frozen=True)
class Line:
    at: float  # time.monotonic() when the line arrived
    text: str


class ChildProcess:
    def __init__(
        self,
        command: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.name = name or command
        self.argv = [sys.executable, "-m", "sebridge.cli", command, *args]
        self.env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self.cwd = cwd
        self.lines: list[Line] = []
        self._cond = threading.Condition()
        self._log: IO[str] | None = None
        self.process: subprocess.Popen[str] | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> ChildProcess:
        """Start the process; a no-op while it runs (``with server(...)[0]:`` after
        :func:`server` started it would otherwise start a second one and leak the first)."""
        if self.alive:
            return self
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            "w+", prefix=f"{self.name}-", suffix=".log", encoding="utf-8"
        )
        self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            self.argv,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )
        threading.Thread(target=self._pump, name=f"{self.name}-stdout", daemon=True).start()
        return self

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            with self._cond:
                self.lines.append(Line(time.monotonic(), raw.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, wait, SIGKILL. Returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL now: a crash, or power loss as far as the process can tell."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)

    def close(self) -> None:
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ChildProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- observing ------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def stderr_path(self) -> Path | None:
        """The file stderr goes to (for incremental reading), while the process is open."""
        return None if self._log is None else Path(self._log.name)

    def stderr_text(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_text(encoding="utf-8", errors="replace")

    def wait_for(self, predicate: Callable[[list[Line]], bool], timeout: float) -> bool:
        """Block until ``predicate(lines)`` holds, the process exits, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.lines):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.alive:
                    return predicate(self.lines)
                self._cond.wait(min(remaining, 0.2))
        return True

    def wait_for_line(self, prefix: str, timeout: float) -> str:
        if not self.wait_for(lambda ls: any(x.text.startswith(prefix) for x in ls), timeout):
            raise RuntimeError(
                f"{self.name} printed no line starting {prefix!r} within {timeout:g} s; "
                f"stderr:\n{self.stderr_text()[-4000:]}"
            )
        return next(x.text for x in self.lines if x.text.startswith(prefix))

    def json_lines(self) -> list[dict[str, Any]]:
        out = []
        with self._cond:
            lines = list(self.lines)
        for line in lines:
            if line.text.startswith("{"):
                try:
                    out.append(json.loads(line.text))
                except ValueError:
                    continue
        return out


def forwarder(
    imds_url: str,
    state_dir: str | Path,
    *extra: str,
    dry_run: bool = True,
    poll_interval: float = 0.2,
    heartbeat_interval: float = 0,
    env: Mapping[str, str] | None = None,
) -> ChildProcess:
    """A ``sebridge forwarder`` child (not started) with test-friendly defaults."""
    args = [
        "--imds-endpoint",
        imds_url,
        "--state-dir",
        str(state_dir),
        "--poll-interval",
        str(poll_interval),
        "--heartbeat-interval",
        str(heartbeat_interval),
        *(["--dry-run"] if dry_run else []),
        *extra,
    ]
    return ChildProcess("forwarder", args, env=env)


def server(
    command: str, *args: str, env: Mapping[str, str] | None = None
) -> tuple[ChildProcess, str]:
    """Start one of the loopback servers and return it with the URL from its listening line."""
    child = ChildProcess(command, ["--port", "0", *args], env=env).start()
    try:
        line = child.wait_for_line("listening on ", timeout=30)
    except RuntimeError:
        child.close()
        raise
    return child, line.removeprefix("listening on ").strip()
