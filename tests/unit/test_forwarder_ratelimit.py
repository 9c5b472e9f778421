"""The IMDS request limit shared by the poller and the approvals handler (simulated time)."""

from __future__ import annotations

import threading

import pytest

from sebridge.forwarder.imds.ratelimit import RequestLimit
from tests.support.imds_stub import max_in_any_window


def simulate(poll_every: float | None, commands: bool, seconds: float = 60.0) -> dict[str, list]:
    """Every 10 ms: the poller asks when a poll is due, a flood of commands always asks."""
    now = [0.0]
    limit = RequestLimit(clock=lambda: now[0])
    started: dict[str, list[float]] = {"poll": [], "command": []}
    poll_delays: list[float] = []
    due = 0.0
    for step in range(int(seconds * 100)):
        now[0] = step / 100
        if poll_every is not None and now[0] >= due and limit._wait_needed(now[0], True) == 0:
            started["poll"].append(now[0])
            poll_delays.append(now[0] - due)
            due += poll_every
        if commands and limit._wait_needed(now[0], False) == 0:
            started["command"].append(now[0])
    return started | {"delays": poll_delays}


@pytest.mark.parametrize(
    ("poll_every", "commands"), [(1.0, True), (0.2, True), (0.05, True), (None, True), (0.2, False)]
)
def test_never_more_than_5_requests_in_any_second(poll_every: float | None, commands: bool) -> None:
    started = simulate(poll_every, commands)
    assert max_in_any_window(started["poll"] + started["command"], window=1.2) <= 5


def test_a_flood_of_commands_never_delays_a_poll_at_1_hz() -> None:
    started = simulate(1.0, True)
    assert max(started["delays"]) == 0.0
    assert len(started["command"]) >= 60 * 2  # and the commands still go at 2.5/s


def test_a_fast_poller_never_starves_the_commands() -> None:
    started = simulate(0.05, True)
    assert len(started["command"]) >= 60 / 1.2 - 1  # at least one slot in every window
    assert max_in_any_window(started["poll"], window=1.2) <= 4


def test_acquire_gives_up_at_the_deadline_or_when_cancelled() -> None:
    limit = RequestLimit()
    for _ in range(3):
        assert limit.acquire(priority=False)
    import time

    started = time.monotonic()
    assert not limit.acquire(priority=False, deadline=time.monotonic() + 0.1)
    assert time.monotonic() - started < 0.5
    cancel = threading.Event()
    threading.Timer(0.1, cancel.set).start()
    assert not limit.acquire(priority=False, cancel=cancel)
    assert limit.acquire(priority=True)  # the poller's slots are still there
