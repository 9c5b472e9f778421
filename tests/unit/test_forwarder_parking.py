"""A stop that leaves a thread behind still closes the forwarder's state when that thread is
parked in a call that touches none of it (Forwarder.parked: the approvals receiver waiting for a
command), and never when it is not.

Hostile review (stop 33): the approvals receiver is nearly always inside a receive that waits up
to 20 s, so SIGTERM left it behind 8 times in 9, and main then skipped closing the local actions,
which is what keeps when the last poll was. After a restart the local actions measured their gap
from an older time than the forwarder did, and a hook ran for Completed while the topic got
Cancelled."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sebridge.forwarder.ports import StoppedWhileParked
from tests.support.forwarder_fakes import World
from tests.support.waiting import wait_until

JOIN = 0.3  # seconds run() gives its threads after the stop


def run_until_stopped(world: World, worker: Callable[[], None], entered: threading.Event) -> bool:
    """Run the forwarder with ``worker`` beside its loops; stop it once the worker is in its
    call; what run() returned."""
    result: list[bool] = []
    runner = threading.Thread(
        target=lambda: result.append(world.forwarder.run((worker,), join_timeout=JOIN))
    )
    runner.start()
    assert entered.wait(10), "the worker never reached its call"
    world.forwarder.stop()
    runner.join(10)
    assert len(result) == 1, "run() did not return"
    return result[0]


def parked_receiver(
    world: World, release: threading.Event, then: Callable[[], None]
) -> tuple[Callable[[], None], threading.Event, list[str]]:
    """A worker parked in a call that outlasts the join; ``then`` is how the call ends."""
    entered = threading.Event()
    outcome: list[str] = []

    def approvals() -> None:
        try:
            with world.forwarder.parked():
                entered.set()
                release.wait(30)
                then()
            outcome.append("went on after the call")
        except StoppedWhileParked:
            outcome.append("returned at once")
        except Exception as exc:
            outcome.append(f"handled {type(exc).__name__}")

    return approvals, entered, outcome


def test_a_thread_left_behind_in_a_parked_call_leaves_the_state_closable() -> None:
    world, release = World(), threading.Event()
    worker, entered, outcome = parked_receiver(world, release, lambda: None)
    assert run_until_stopped(world, worker, entered) is False  # not every thread ended in time
    assert world.forwarder.left_in_use == []  # but none that may still use the state
    release.set()  # the call returns after the stop began closing: nothing more is done
    wait_until(lambda: outcome, 10, "the worker to leave its call")
    assert outcome == ["returned at once"]


def test_a_call_that_fails_after_the_stop_began_closing_raises_stopped_instead() -> None:
    """Whatever the parked call did (here: the SDK failing as its connection closes), the
    worker sees StoppedWhileParked, so its error path (log, back off, reconnect) never runs."""

    def link_closed() -> None:
        raise ConnectionError("link closed")

    world, release = World(), threading.Event()
    worker, entered, outcome = parked_receiver(world, release, link_closed)
    assert run_until_stopped(world, worker, entered) is False
    release.set()
    wait_until(lambda: outcome, 10, "the worker to leave its call")
    assert outcome == ["returned at once"]
    # And a thread that parks only after the stop began closing never enters its call.
    entered_late: list[bool] = []
    try:
        with world.forwarder.parked():
            entered_late.append(True)
    except StoppedWhileParked:
        pass
    assert entered_late == []


def test_a_thread_left_behind_outside_a_parking_keeps_the_state_open() -> None:
    world, release, entered = World(), threading.Event(), threading.Event()

    def approvals() -> None:  # a command being handled: it writes to the local actions
        entered.set()
        release.wait(30)

    try:
        assert run_until_stopped(world, approvals, entered) is False
        assert world.forwarder.left_in_use == ["approvals"]
    finally:
        release.set()


def test_a_parked_call_that_ends_before_the_stop_goes_on_as_usual() -> None:
    world, release = World(), threading.Event()
    release.set()
    entered, done = threading.Event(), threading.Event()
    outcome: list[str] = []

    def approvals() -> None:
        with world.forwarder.parked():
            pass
        outcome.append("went on")
        entered.set()
        world.forwarder.stop_event.wait(30)
        done.set()

    assert run_until_stopped(world, approvals, entered) is True
    assert outcome == ["went on"] and done.is_set()
    assert world.forwarder.left_in_use == []
