"""The group-commit batcher (functions/shared/batching.py) under real threads.

Each example submits requests from many threads at once, over a few keys, with a serve that
takes a moment (so batches really form) and fails on request; the properties hold whatever
the interleaving: every request is served exactly once and gets its own result or its own
error, a batch holds one key, batches of one key never overlap and keep arrival order, and a
thread never serves a batch after its own result was ready.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.shared.batching import Batcher
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(120)


class Boom(Exception):
    pass


class Recorder:
    """A serve that records what it was given and checks that one key is served at a time."""

    def __init__(self, fail_whole: set[int], fail_one: set[int], pause: float) -> None:
        self.fail_whole, self.fail_one, self.pause = fail_whole, fail_one, pause
        self.lock = threading.Lock()
        self.active: dict[str, int] = defaultdict(int)
        self.overlaps: list[str] = []
        self.batches: list[tuple[str, list[int], str]] = []  # key, requests, serving thread
        self.served_at: dict[int, float] = {}

    def serve(self, key: str, requests: list[int]) -> list[str | BaseException]:
        with self.lock:
            self.active[key] += 1
            if self.active[key] > 1:
                self.overlaps.append(key)
            self.batches.append((key, list(requests), threading.current_thread().name))
        try:
            time.sleep(self.pause)
            if any(r in self.fail_whole for r in requests):
                raise Boom(f"batch with {requests}")
            now = time.monotonic()
            for r in requests:
                self.served_at[r] = now
            return [Boom(f"only {r}") if r in self.fail_one else f"{key}:{r}" for r in requests]
        finally:
            with self.lock:
                self.active[key] -= 1


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keys=st.lists(st.sampled_from(["pool-a", "pool-b", "pool-c"]), min_size=1, max_size=40),
    fail_whole=st.sets(st.integers(0, 39), max_size=3),
    fail_one=st.sets(st.integers(0, 39), max_size=5),
    max_batch=st.integers(1, 8),
)
def test_every_request_is_served_once_with_its_own_outcome(
    keys: list[str], fail_whole: set[int], fail_one: set[int], max_batch: int
) -> None:
    batcher: Batcher[str, int, str] = Batcher(max_batch=max_batch)
    recorder = Recorder(fail_whole, fail_one, pause=0.002)
    outcomes: dict[int, str] = {}
    finished_at: dict[int, float] = {}
    start = threading.Barrier(len(keys))

    def one(n: int) -> None:
        start.wait()
        try:
            outcomes[n] = batcher.submit(keys[n], n, recorder.serve)
        except Boom as exc:
            outcomes[n] = f"error: {exc}"
        finished_at[n] = time.monotonic()

    threads = [threading.Thread(target=one, args=(n,), name=f"t{n}") for n in range(len(keys))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), "a submitter never returned"

    served = [r for _, requests, _ in recorder.batches for r in requests]
    assert sorted(served) == list(range(len(keys))), "a request was lost or served twice"
    assert not recorder.overlaps, f"two batches of one key at once: {recorder.overlaps}"
    assert all(len(requests) <= max_batch for _, requests, _ in recorder.batches)
    batch_of = {r: (key, requests) for key, requests, _ in recorder.batches for r in requests}
    for n, key in enumerate(keys):
        batch_key, requests = batch_of[n]
        assert batch_key == key, "a request was served in another key's batch"
        if any(r in fail_whole for r in requests):
            assert outcomes[n].startswith("error: batch with"), outcomes[n]
        elif n in fail_one:
            assert outcomes[n] == f"error: only {n}"  # its own error, not its neighbours'
        else:
            assert outcomes[n] == f"{key}:{n}"
    # Per key, batches keep the order in which their requests queued up: the serving thread's
    # own request is the first of the batch it serves.
    for key, requests, thread_name in recorder.batches:
        assert thread_name == f"t{requests[0]}", (key, requests, thread_name)
    # A thread that served a batch did not serve another after its own result was ready.
    served_by: dict[str, int] = defaultdict(int)
    for _, _, thread_name in recorder.batches:
        served_by[thread_name] += 1
    assert max(served_by.values()) == 1
    assert batcher.batches == len(recorder.batches)


def test_requests_that_arrive_during_a_batch_share_the_next() -> None:
    """Ten requests of one key while the first is being served: two batches, not ten."""
    batcher: Batcher[str, int, int] = Batcher()
    release = threading.Event()
    entered = threading.Event()
    batches: list[list[int]] = []

    def serve(key: str, requests: list[int]) -> list[int | BaseException]:
        batches.append(list(requests))
        entered.set()
        release.wait(10)
        return [r * 10 for r in requests]

    results: dict[int, int] = {}

    def one(n: int) -> None:
        results[n] = batcher.submit("pool", n, serve)

    first = threading.Thread(target=one, args=(0,))
    first.start()
    assert entered.wait(5)
    rest = [threading.Thread(target=one, args=(n,)) for n in range(1, 10)]
    for thread in rest:
        thread.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # all nine queued behind the first batch
        with batcher._lock:
            if len(batcher._queues.get("pool", [])) == 9:
                break
        time.sleep(0.005)
    release.set()
    for thread in [first, *rest]:
        thread.join(10)
    assert batches[0] == [0] and sorted(batches[1]) == list(range(1, 10)) and len(batches) == 2
    assert results == {n: n * 10 for n in range(10)}
    assert batcher.largest == 9


def test_a_serve_that_returns_the_wrong_number_of_results_fails_the_batch() -> None:
    batcher: Batcher[str, int, int] = Batcher()
    with pytest.raises(RuntimeError, match="1 requests"):
        batcher.submit("k", 1, lambda key, requests: [])
    assert batcher.submit("k", 2, lambda key, requests: [7]) == 7  # the key is free again


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Batcher(max_batch=0)


def test_side_by_side_runs_calls_at_once_and_reports_each_failure_in_order() -> None:
    from functions.shared.batching import side_by_side

    running, most = 0, 0
    lock = threading.Lock()

    def call(n: int) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        if n % 3 == 0:
            raise Boom(f"call {n}")

    errors = side_by_side(4)([lambda n=n: call(n) for n in range(10)])
    assert most == 4  # ten calls, four at a time
    assert [str(e) if e else None for e in errors] == [
        f"call {n}" if n % 3 == 0 else None for n in range(10)
    ]
    assert side_by_side(2)([]) == []
    with pytest.raises(ValueError):
        side_by_side(0)
