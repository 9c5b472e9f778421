"""systemd notify + watchdog (issue 14, item 2): the real `sebridge forwarder` process, a
loopback notify socket bound here (as systemd binds one), and the IMDS simulator.

The forwarder says READY=1 and STATUS= once its first poll is done, feeds WATCHDOG=1 while its
poll loop turns, stops feeding it while a poll is stuck (a `hang` fault: IMDS holds the GET),
feeds it again once the loop turns again, and says STOPPING=1 on SIGTERM.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators.imds.testing import RunningSimulator, running_simulator
from emulators.processes import forwarder
from sebridge.forwarder.observability.health import Health
from sebridge.forwarder.observability.systemd_notify import (
    Notifier,
    NotifyError,
    socket_address,
    status_text,
)

REPO = Path(__file__).resolve().parents[2]
IDLE = str(REPO / "benchmarks" / "idle-scenario.json")
pytestmark = pytest.mark.timeout(180)

WATCHDOG_USEC = 2_000_000  # 2 s: fed every 1 s (at the first poll tick after that)
HANG = 8.0  # seconds IMDS holds the stuck GET (the forwarder's read deadline is 10 s)


class NotifySocket:
    """A datagram socket like systemd's: records every message with its arrival time."""

    def __init__(self) -> None:
        self.name = f"@sebridge-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(socket_address(self.name))
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode().split("\n")))

    def times(self, line: str) -> list[float]:
        return [at for at, lines in list(self.messages) if line in lines]

    def lines(self, prefix: str) -> list[str]:
        return [x for _, lines in list(self.messages) for x in lines if x.startswith(prefix)]

    def wait(self, line: str, timeout: float, after: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [t for t in self.times(line) if t > after]
            if later:
                return later[0]
            time.sleep(0.05)
        raise AssertionError(f"no {line} within {timeout} s; got {self.messages[-10:]}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def sim() -> Iterator[RunningSimulator]:
    with running_simulator(IDLE) as running:
        yield running


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    try:
        yield sock
    finally:
        sock.close()


@pytest.mark.slow
def test_watchdog_is_fed_only_while_the_poll_loop_turns(
    sim: RunningSimulator, notify: NotifySocket, tmp_path: Path
) -> None:
    env = dict(os.environ, NOTIFY_SOCKET=notify.name, WATCHDOG_USEC=str(WATCHDOG_USEC))
    with forwarder(sim.base_url, tmp_path / "state", poll_interval=0.2, env=env) as fw:
        ready = notify.wait("READY=1", 60)
        assert notify.lines("STATUS=")[0] == "STATUS=polling IMDS: last poll ok"
        notify.wait("WATCHDOG=1", 10, after=ready)
        time.sleep(5)
        fed = [t for t in notify.times("WATCHDOG=1") if t > ready]
        assert len(fed) >= 3, "fed every second while the loop turns"
        # What systemd requires: never a whole watchdog interval without a feed.
        assert max(b - a for a, b in itertools.pairwise(fed)) < WATCHDOG_USEC / 1e6

        sim.set_faults({"kind": "hang", "seconds": HANG, "count": 1})
        stuck_from = time.monotonic()
        time.sleep(HANG - 2)
        assert fw.alive
        # The poll in progress when the fault was set may still have fed it once; after that,
        # the loop is inside the held GET and nothing is fed for as long as it is held.
        late = [t for t in notify.times("WATCHDOG=1") if t > stuck_from + 1.5]
        assert late == [], f"fed while the poll loop was stuck: {late}"
        assert time.monotonic() - stuck_from > 3 * WATCHDOG_USEC / 1e6

        resumed = notify.wait("WATCHDOG=1", 15, after=stuck_from + 1.5)
        assert resumed - stuck_from >= HANG - 1.0  # fed again only once the GET returned
        assert notify.times("READY=1") == [ready]  # READY once

        assert fw.process is not None
        fw.process.send_signal(signal.SIGTERM)
        notify.wait("STOPPING=1", 10)
        assert fw.process.wait(10) == 0


@pytest.mark.slow
def test_failing_polls_are_a_live_loop_and_keep_the_watchdog_fed(
    sim: RunningSimulator, notify: NotifySocket, tmp_path: Path
) -> None:
    """IMDS answering 500 is not a stuck forwarder: restarting it would not help."""
    env = dict(os.environ, NOTIFY_SOCKET=notify.name, WATCHDOG_USEC=str(WATCHDOG_USEC))
    sim.set_faults({"kind": "5xx", "count": 1000})
    with forwarder(sim.base_url, tmp_path / "state", poll_interval=0.2, env=env):
        ready = notify.wait("READY=1", 60)
        assert notify.lines("STATUS=")[0].startswith("STATUS=polls failing (1 in a row)")
        time.sleep(4)
        fed = [t for t in notify.times("WATCHDOG=1") if t >= ready]
        assert len(fed) >= 2  # at each failed poll (backoff 1-5 s), at most every second


def test_without_notify_socket_nothing_is_built_and_children_do_not_inherit_it() -> None:
    assert Notifier.from_env({}) is None
    env = {"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier.from_env(env)
    assert notifier is not None and notifier.watchdog == 30.0
    assert env == {}  # taken out, as sd_notify(unset_environment=1)
    notifier.close()
    other = Notifier.from_env(
        {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "5", "WATCHDOG_PID": "1"}
    )
    assert other is not None and other.watchdog is None  # the watchdog is another process's
    other.close()
    with pytest.raises(NotifyError):
        Notifier.from_env({"NOTIFY_SOCKET": "relative/path"})
    with pytest.raises(NotifyError):
        Notifier.from_env({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "soon"})


def test_sending_to_a_missing_socket_never_raises() -> None:
    notifier = Notifier(f"@sebridge-nobody-{uuid.uuid4().hex}")
    assert notifier.send("READY=1") is False
    notifier.close()


def test_status_is_one_bounded_line() -> None:
    health = Health(poll_failures=3, last_error="IMDS\nanswered 500: " + "x" * 1000)
    text = status_text(health)
    assert "\n" not in text and len(text) <= 200 and text.startswith("polls failing (3 in a row)")
