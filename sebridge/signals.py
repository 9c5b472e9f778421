"""Stopping on a signal without running anything in the signal handler (the one way every
program of the project stops on SIGTERM/SIGINT).

A Python signal handler runs in the main thread between two bytecodes of whatever it was
doing. A handler that takes a lock (``threading.Event.set`` takes the Event's Condition lock,
``logging`` takes its handlers' locks) deadlocks when the interrupted code holds that lock: the
main thread inside ``stop.wait()``, interrupted between taking the Condition's lock and
waiting, never gets it back, and every thread that waits on ``stop`` blocks behind it. Seen
once in review: a forwarder that ignored SIGTERM for minutes.

So the handler does nothing: :func:`signal.set_wakeup_fd` makes the interpreter's own C-level
handler write the signal number to a pipe (async-signal-safe), and a thread of its own reads
the pipe, then says so (``on_signal``) and sets the stop event, outside any handler.

    with StopSignals(stop, on_signal=lambda name: log.info("received %s: stopping", name)):
        ... stop.wait() ...
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
CLOSE_JOIN = 1.0  # seconds close() waits for the reader thread


def _nothing(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: takes no lock, allocates nothing; the pipe carries the
    signal (set_wakeup_fd)."""


class StopEvent(threading.Event):
    """A stop event that also calls back when it is set.

    A thread that waits for one thing blocks on the event itself. One that waits for many (the
    HTTP client's deadline watchdog, which watches every request's deadline at once) would
    otherwise have to look at the event every so often, and wake for nothing while idle. It
    registers with :meth:`when_set` instead and is told at once. Callbacks run on the thread
    that sets the event (never in a signal handler: see :class:`StopSignals`), must be quick
    and must not fail; one may be called twice (registered just as the event is set)."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks_lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def when_set(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the event is set, or now if it already is."""
        with self._callbacks_lock:
            self._callbacks.append(callback)
        if self.is_set():
            callback()

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback()


class StopSignals:
    """Sets ``stop`` when one of ``signals`` arrives; ``on_signal(name)`` is called first, on the
    reader thread, once per signal received (it may log). Install from the main thread."""

    def __init__(
        self,
        stop: threading.Event,
        signals: Iterable[signal.Signals] = DEFAULT_SIGNALS,
        *,
        on_signal: Callable[[str], None] | None = None,
    ) -> None:
        self.stop = stop
        self.signals = tuple(signals)
        self.on_signal = on_signal
        self._numbers = frozenset(int(s) for s in self.signals)
        self._previous: dict[signal.Signals, object] = {}
        self._previous_fd = -1
        self._read_fd = -1
        self._write_fd = -1
        self._thread: threading.Thread | None = None

    def install(self) -> StopSignals:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C handler must never block on a full pipe
        try:
            self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            os.close(read_fd)
            os.close(write_fd)
            raise
        self._read_fd, self._write_fd = read_fd, write_fd
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, _nothing)
        self._thread = threading.Thread(target=self._watch, name="signals", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return  # close(): the write end was closed
            for number in data:
                if number not in self._numbers:
                    continue  # another handled signal (its own handler runs as usual)
                try:
                    if self.on_signal is not None:
                        self.on_signal(signal.Signals(number).name)
                finally:
                    self.stop.set()  # whatever saying so did

    def close(self) -> None:
        """Restore the previous handlers and wakeup fd; end the reader thread."""
        if self._thread is None:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write_fd)
        self._thread.join(CLOSE_JOIN)
        if not self._thread.is_alive():
            os.close(self._read_fd)
        self._thread = None

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
