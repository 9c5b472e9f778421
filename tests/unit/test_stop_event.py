"""StopEvent (sebridge.signals): an Event that also tells its listeners when it is set, so that a
thread waiting for many things (the HTTP client's deadline watchdog) is woken at once by a stop
instead of looking at the event every so often."""

from __future__ import annotations

import threading

from sebridge.signals import StopEvent


def test_a_listener_is_told_when_the_event_is_set_and_waiters_still_wake() -> None:
    stop = StopEvent()
    told: list[str] = []
    stop.when_set(lambda: told.append("a"))
    stop.when_set(lambda: told.append("b"))
    assert told == []
    woken = threading.Event()
    waiter = threading.Thread(target=lambda: stop.wait(30) and woken.set(), daemon=True)
    waiter.start()
    stop.set()
    waiter.join(10)
    assert woken.is_set()
    assert told == ["a", "b"]


def test_a_listener_that_comes_after_the_set_is_told_at_once() -> None:
    stop = StopEvent()
    stop.set()
    told: list[int] = []
    stop.when_set(lambda: told.append(1))
    assert told == [1]


def test_a_listener_registered_while_another_thread_sets_is_never_missed() -> None:
    """Registration and set race on two threads: the listener is told at least once, every
    time (once by set, or at once by when_set when it sees the flag)."""
    for _ in range(300):
        stop = StopEvent()
        told: list[int] = []
        go = threading.Barrier(2)

        def setter(stop: StopEvent = stop, go: threading.Barrier = go) -> None:
            go.wait()
            stop.set()

        thread = threading.Thread(target=setter)
        thread.start()
        go.wait()
        stop.when_set(lambda told=told: told.append(1))
        thread.join()
        assert told, "a listener registered during set() was never told"
