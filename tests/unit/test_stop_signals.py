"""SIGTERM always stops: no lock is taken in a signal handler (sebridge.signals).

The review saw a forwarder ignore SIGTERM for minutes: its handler logged and called
``stop.set()``, which takes the stop Event's Condition lock; the main thread, interrupted while
it held that lock (inside ``stop.wait()``), never got it back. The child below makes that
window wide: its main thread and four others do nothing but wait on the stop Event, so a
signal almost always lands inside one of its Condition's critical sections. Each start gets
SIGTERM at a random moment and must exit within 5 s.

``naive`` is the handler the forwarder had (log, then ``stop.set()`` in the handler): the
control test shows this harness catches it, so the test of ``StopSignals`` can fail.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from sebridge.signals import StopSignals

ROOT = Path(__file__).resolve().parents[2]
STOP_WITHIN = 5.0
STARTS = 25

CHILD = textwrap.dedent(
    """
    import logging, signal, sys, threading, time
    from sebridge.signals import StopSignals

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    log = logging.getLogger("child")
    stop = threading.Event()
    if sys.argv[1] == "naive":
        def handler(signum, frame):
            if not stop.is_set():
                log.info("received %s: stopping", signal.Signals(signum).name)
            stop.set()
        signal.signal(signal.SIGTERM, handler)
    else:
        StopSignals(
            stop, on_signal=lambda name: log.info("received %s: stopping", name)
        ).install()

    def spin():
        while not stop.wait(0):
            log.debug("waiting")

    for _ in range(4):
        threading.Thread(target=spin, daemon=True).start()
    deadline = time.monotonic() + 60  # bounded whatever happens
    print("ready", flush=True)
    while not stop.wait(0) and time.monotonic() < deadline:
        pass
    log.info("stopped")
    """
)


def _start(kind: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _hangs(kind: str, delay: float) -> bool:
    """SIGTERM ``delay`` s after the child is ready; True when it is still alive 5 s later
    (then it is killed)."""
    process = _start(kind)
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=delay)  # the child does not exit by itself: a random moment
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            return True
        return False
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_at_any_moment_stops_a_process_busy_on_its_stop_event() -> None:
    rng = random.Random(22)
    hung = [delay for delay in (rng.uniform(0.0, 0.3) for _ in range(STARTS)) if _hangs("x", delay)]
    assert hung == [], f"{len(hung)} of {STARTS} starts ignored SIGTERM (delays {hung})"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_harness_catches_a_handler_that_takes_the_stop_events_lock() -> None:
    rng = random.Random(22)
    for _ in range(STARTS):
        if _hangs("naive", rng.uniform(0.0, 0.3)):
            return
    pytest.fail(f"the old handler stopped {STARTS} times: this harness cannot catch it")


def test_the_previous_handlers_come_back_after_close() -> None:
    # A handler of this test's own as "before": another test in this worker may have left
    # StopSignals' handler installed (a fresh clone's run met exactly that).
    def before(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, before)
    # Likewise the wakeup fd: an emulator's main() run in this worker installs one for the
    # process's life, so start from none and check that none is what comes back.
    previous_fd = signal.set_wakeup_fd(-1)
    try:
        stop = threading.Event()
        with StopSignals(stop, (signal.SIGTERM,), on_signal=lambda name: None):
            assert signal.getsignal(signal.SIGTERM) is not before
            signal.raise_signal(signal.SIGTERM)
            assert stop.wait(5), "SIGTERM did not set the stop event"
        assert signal.getsignal(signal.SIGTERM) is before
        assert signal.set_wakeup_fd(-1) == -1  # nothing left pointing at a closed pipe
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.set_wakeup_fd(previous_fd)
