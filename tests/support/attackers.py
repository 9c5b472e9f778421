"""Clients that attack an HTTP server over loopback, bounded in count and time (issue 22).

- :class:`SlowClients`: ``count`` connections that send a request one byte every ``every``
  seconds (slowloris), or nothing at all (``every=None``); each one dropped by the server is
  opened again, so the pressure lasts until :meth:`stop`.
- :func:`resets`: connections that send half a request and reset (RST, SO_LINGER 0);
  :func:`reset_flood` runs them in a child process (so the flood does not compete with the
  test's own measuring thread for the GIL).
- :func:`hold_idle`: up to ``hold`` connections that send nothing, opened as fast as they go
  (a bounded number), each one the server drops opened again: the idle-connection flood of
  review 22d, item 1; :func:`idle_flood` runs it in a child process.
- :func:`ask`: one well-formed GET; its status and how long it took, connect to last byte.
"""

from __future__ import annotations

import http.client
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAILURES: list[tuple[int, float, BaseException]] = []  # why ask() got no answer (for messages)
SLOW_REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 4000 + b"\r\n\r\n"


@dataclass
class _Slow:
    sock: socket.socket
    sent: int = 0
    next_at: float = 0.0


@dataclass
class SlowClients:
    port: int
    count: int
    every: float | None = 2.0  # seconds between two bytes; None: send nothing (idle)
    reconnects: int = 0
    connected: threading.Event = field(default_factory=threading.Event)  # all opened once
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> SlowClients:
        self._thread = threading.Thread(target=self._run, daemon=True, name="slow-clients")
        self._thread.start()
        if not self.connected.wait(30):
            raise AssertionError(f"could not open {self.count} connections to {self.port}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _open(self) -> _Slow:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.setblocking(False)
        return _Slow(sock, next_at=time.monotonic())

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        clients: list[_Slow] = []
        try:
            for _ in range(self.count):
                client = self._open()
                clients.append(client)
                selector.register(client.sock, selectors.EVENT_READ, client)
            self.connected.set()
            while not self._stop.wait(0.05):
                # A readable socket was closed (or answered) by the server: open another.
                for key, _ in selector.select(0):
                    client = key.data
                    selector.unregister(client.sock)
                    client.sock.close()
                    clients.remove(client)
                    fresh = self._open()
                    clients.append(fresh)
                    selector.register(fresh.sock, selectors.EVENT_READ, fresh)
                    self.reconnects += 1
                now = time.monotonic()
                for client in clients:
                    if self.every is None or now < client.next_at:
                        continue
                    client.next_at = now + self.every
                    try:
                        client.sock.send(SLOW_REQUEST[client.sent % len(SLOW_REQUEST) :][:1])
                        client.sent += 1
                    except OSError:
                        pass  # closed by the server: noticed as readable next round
        finally:
            for client in clients:
                client.sock.close()
            selector.close()


def reset_one(port: int) -> None:
    """Half a request, then a TCP reset."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET / HT")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def resets(
    port: int, count: int, stop: threading.Event | None = None, per_second: float | None = None
) -> int:
    """Up to ``count`` reset connections, as fast as they go or ``per_second`` (until
    ``stop``); how many."""
    done = 0
    started = time.monotonic()
    for i in range(count):
        if stop is not None and stop.is_set():
            break
        if per_second is not None:
            time.sleep(max(0.0, started + i / per_second - time.monotonic()))
        try:
            reset_one(port)
            done += 1
        except OSError:
            time.sleep(0.01)  # the backlog is full for a moment
    return done


def reset_flood(port: int, count: int, per_second: float | None = None) -> subprocess.Popen[bytes]:
    """:func:`resets` in a child process (wait() for it; it ends after ``count``)."""
    code = (
        "from tests.support.attackers import resets; "
        f"resets({port}, {count}, per_second={per_second!r})"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.DEVNULL)


def hold_idle(
    port: int,
    hold: int,
    seconds: float,
    opens: int,
    per_second: float | None = None,
    source: str = "127.0.0.1",
) -> int:
    """Keep up to ``hold`` connections from ``source`` that send nothing, for ``seconds`` or
    ``opens`` connections, whichever ends first, opening at most ``per_second``; how many were
    opened."""
    held: list[socket.socket] = []
    opened = 0
    started = time.monotonic()
    end = started + seconds
    try:
        while time.monotonic() < end and opened < opens:
            if per_second is not None:
                time.sleep(max(0.0, started + opened / per_second - time.monotonic()))
            if len(held) >= hold:  # make room: forget the ones the server dropped, else the oldest
                alive = []
                for sock in held:
                    try:
                        gone = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                    if gone:
                        sock.close()
                    else:
                        alive.append(sock)
                held = alive
                if len(held) >= hold:
                    held.pop(0).close()
            sock = socket.socket()
            sock.settimeout(1.0)
            try:
                sock.bind((source, 0))
                sock.connect(("127.0.0.1", port))
            except OSError:
                sock.close()
                time.sleep(0.01)  # the backlog is full for a moment
                continue
            opened += 1
            held.append(sock)
    finally:
        for sock in held:
            sock.close()
    return opened


def idle_flood(
    port: int,
    hold: int,
    seconds: float,
    opens: int,
    per_second: float | None = None,
    source: str = "127.0.0.1",
) -> subprocess.Popen[bytes]:
    """:func:`hold_idle` in a child process (wait() for it; it ends by itself)."""
    code = (
        "from tests.support.attackers import hold_idle; "
        f"hold_idle({port}, {hold}, {seconds!r}, {opens}, {per_second!r}, {source!r})"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.DEVNULL)


def ask(
    port: int, path: str = "/", timeout: float = 10.0, source: str | None = None
) -> tuple[int | None, float]:
    """One GET on a new connection (from ``source``, an address of this host, if given):
    (status or None if it failed, seconds it took from the connection's establishment to the
    answer's last byte: what the server is answerable for)."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=timeout, source_address=(source, 0) if source else None
    )
    started = time.monotonic()
    try:
        connection.connect()
        started = time.monotonic()
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except (OSError, http.client.HTTPException) as exc:
        FAILURES.append((port, time.monotonic() - started, exc))
        return None, time.monotonic() - started
    finally:
        connection.close()
