"""systemd's notify protocol, spoken from the poll loop: READY, WATCHDOG, STATUS, STOPPING.

The unit is ``Type=notify`` with ``WatchdogSec`` and ``NotifyAccess=main``. systemd passes the
socket in ``NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract socket) and the watchdog
interval in ``WATCHDOG_USEC`` (``WATCHDOG_PID``, when set, names the process it is meant for).
Each message is one datagram of ``KEY=value`` lines; no library is needed for that.

:class:`SystemdListener` is a :class:`~sebridge.forwarder.ports.LoopListener`, so it runs on the
poller's thread after every poll tick, successful or not:

- ``READY=1`` after the first tick (the first poll succeeded or failed: the forwarder is up);
- ``WATCHDOG=1`` at most every half watchdog interval, and only from there: a poll loop that
  is stuck (a read that never returns, a deadlock) stops feeding the watchdog and systemd
  restarts the forwarder, while a loop that keeps failing its polls (IMDS down) is alive and
  keeps feeding it;
- ``STATUS=`` the last poll result, sent when it changes (``systemctl status`` shows it);
- ``STOPPING=1`` when the forwarder stops (sent by ``main``).

Sending never raises and never blocks (a non-blocking datagram socket); a failure is logged
once. Without ``NOTIFY_SOCKET`` nothing is built.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence

from sebridge.contract.events import Envelope
from sebridge.forwarder.observability.health import Health

log = logging.getLogger("forwarder.systemd")

MAX_STATUS = 200  # characters of STATUS=: one line in `systemctl status`


class NotifyError(ValueError):
    """NOTIFY_SOCKET or WATCHDOG_USEC holds something unusable (the message says which)."""


def socket_address(value: str) -> str:
    """The AF_UNIX address of a ``NOTIFY_SOCKET`` value: an absolute path, or ``@name`` (an
    abstract socket, a leading NUL byte)."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    raise NotifyError(f"NOTIFY_SOCKET must be an absolute path or an @name, not {value!r}")


def watchdog_seconds(env: Mapping[str, str], pid: int) -> float | None:
    """The watchdog interval systemd expects, or None (no watchdog, or not this process's)."""
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    owner = env.get("WATCHDOG_PID")
    if owner and owner.strip() != str(pid):
        return None
    try:
        value = int(usec)
    except ValueError as exc:
        raise NotifyError(f"WATCHDOG_USEC must be an integer, not {usec!r}") from exc
    if value <= 0:
        raise NotifyError(f"WATCHDOG_USEC must be positive, not {value}")
    return value / 1_000_000


class Notifier:
    """Sends notify messages to one socket; never raises."""

    def __init__(self, address: str, watchdog: float | None = None) -> None:
        self.address = socket_address(address)
        self.watchdog = watchdog
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)
        self._failing = False

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] | None = None) -> Notifier | None:
        """The notifier systemd asked for, or None. Takes the variables out of ``env`` (as
        ``sd_notify(unset_environment=1)`` does), so that hooks and other children do not
        inherit a socket meant for the main process. Raises :class:`NotifyError`."""
        env = os.environ if env is None else env
        address = env.pop("NOTIFY_SOCKET", "")
        try:
            watchdog = watchdog_seconds(env, os.getpid())
        finally:
            env.pop("WATCHDOG_USEC", None)
            env.pop("WATCHDOG_PID", None)
        if not address:
            return None
        return cls(address, watchdog)

    def send(self, *lines: str) -> bool:
        """One datagram of ``lines``; False (logged once per failure streak) when not sent."""
        data = "\n".join(lines).encode("utf-8", "replace")
        try:
            self._sock.sendto(data, self.address)
        except OSError as exc:
            if not self._failing:
                log.warning("cannot notify systemd (%s): %s", " ".join(lines)[:80], exc)
            self._failing = True
            return False
        if self._failing:
            log.info("notifying systemd again")
        self._failing = False
        return True

    def close(self) -> None:
        self._sock.close()


def status_text(health: Health) -> str:
    """The STATUS= line: the last poll result and what waits; changes rarely when idle."""
    if health.last_successful_poll is None and health.poll_failures == 0:
        poll = "no poll yet"
    elif health.poll_failures:
        poll = f"polls failing ({health.poll_failures} in a row): {health.last_error or '?'}"
    else:
        poll = "polling IMDS: last poll ok"
    parts = [poll]
    if health.outbox_depth:
        parts.append(f"{health.outbox_depth} message(s) pending")
    if health.publish_failures:
        parts.append(f"sending failing ({health.publish_failures} in a row)")
    if health.state_save_failing_since is not None:
        parts.append("state save failing")
    if health.outbox_write_failing_since is not None:
        parts.append("outbox write failing")
    if health.set_aside:
        parts.append(f"{health.set_aside} set aside")
    text = "; ".join(parts)
    return " ".join(text.split())[:MAX_STATUS]  # one line, whatever the error said


class SystemdListener:
    """READY once, WATCHDOG while the poll loop turns, STATUS on change (see the module)."""

    def __init__(self, notifier: Notifier, clock: Callable[[], float] = time.monotonic) -> None:
        self.notifier = notifier
        self.clock = clock
        self.ready = False
        self._status = ""
        # Fed at half the interval, as sd_watchdog_enabled(3) advises.
        self._feed_every = notifier.watchdog / 2 if notifier.watchdog else None
        self._next_feed = 0.0

    def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
        return None

    def polled(self, health: Health) -> None:
        lines: list[str] = []
        if not self.ready:
            lines.append("READY=1")
            self.ready = True
        status = status_text(health)
        if status != self._status:
            lines.append(f"STATUS={status}")
            self._status = status
        if self._feed_every is not None:
            now = self.clock()
            if now >= self._next_feed:
                lines.append("WATCHDOG=1")
                self._next_feed = now + self._feed_every
        if lines:
            self.notifier.send(*lines)

    def stopping(self) -> None:
        self.notifier.send("STOPPING=1", "STATUS=stopping")
