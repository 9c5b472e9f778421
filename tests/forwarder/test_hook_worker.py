"""The hooks worker with its journal and the preparations, in-process with real hook processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sebridge.contract.events import Transition, derived_message_id, parse_message
from sebridge.forwarder.local.hooks_file import parse_hooks
from sebridge.forwarder.local.journal import JOURNAL_FILE, Journal
from tests.forwarder.local_support import OBSERVER, Parts, observed, script
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


class Running:
    """A worker on its threads, stopped at the end of the test."""

    def __init__(self, tmp_path: Path, hooks: list[dict[str, Any]], parallel: int = 2) -> None:
        self.tmp_path = tmp_path
        self.hooks = parse_hooks({"hooks": hooks})
        self.parallel = parallel
        self.start()

    def start(self) -> None:
        self.parts = Parts(self.tmp_path, self.hooks, max_parallel=self.parallel, kill_grace=0.5)
        self.journal = self.parts.journal
        self.store = self.parts.store
        self.outbox = self.parts.outbox
        self.preparations = self.parts.preparations
        assert self.parts.worker is not None
        self.worker = self.parts.worker
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.worker.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def observe(self, *items: Any) -> None:
        self.parts.apply(*items)

    def settle(self, timeout: float = 30) -> None:
        wait_until(lambda: self.worker.pending() == 0, timeout, "the hooks to finish")

    def restart(self) -> None:
        self.halt()
        self.start()
        self.worker.resume()

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()
        self.journal.close()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[list[Running]]:
    made: list[Running] = []
    yield made
    for item in made:
        if not item.stop.is_set():
            item.halt()


def recorder_hook(
    tmp_path: Path, name: str, *, on: list[str], prepare: bool = False, body: str = "", **extra: Any
) -> dict[str, Any]:
    log = tmp_path / "ran.log"
    command = script(
        tmp_path, f"{name}.sh", f'{body}\necho "$SEBRIDGE_EVENT_MESSAGE_ID {name}" >> {log}'
    )
    return {"name": name, "on": on, "command": [command], "prepare": prepare, **extra}


def ran(tmp_path: Path) -> list[tuple[str, str]]:
    log = tmp_path / "ran.log"
    if not log.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()]  # type: ignore[misc]


def test_observe_never_waits_for_a_hook(tmp_path: Path, running: list[Running]) -> None:
    run = Running(tmp_path, [recorder_hook(tmp_path, "slow", on=["Scheduled"], body="sleep 60")])
    running.append(run)
    started = time.monotonic()
    run.observe(observed("Scheduled"))
    assert time.monotonic() - started < 0.5
    wait_until(lambda: run.worker.running, 10, "the hook to start")


def test_one_events_hooks_run_in_order_and_other_events_are_not_held_up(
    tmp_path: Path, running: list[Running]
) -> None:
    slow_for_a = 'case "$SEBRIDGE_EVENT_ID" in aaaa*) sleep 1.5;; esac'
    hooks = [
        recorder_hook(tmp_path, "first", on=["Scheduled", "Started"], body=slow_for_a),
        recorder_hook(tmp_path, "second", on=["Scheduled", "Started"]),
    ]
    run = Running(tmp_path, hooks)
    running.append(run)
    a, b = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"
    run.observe(observed("Scheduled", a), observed("Started", a), observed("Scheduled", b))
    # b's hooks are done long before a's slow first hook ends.
    wait_until(
        lambda: sum(1 for m, _ in ran(tmp_path) if m.startswith("bbbb")) == 2, 5, "b's hooks"
    )
    assert not any(m.startswith("aaaa") for m, _ in ran(tmp_path))
    run.settle()
    a_runs = [(m.split(":")[1], h) for m, h in ran(tmp_path) if m.startswith("aaaa")]
    assert a_runs == [
        ("Scheduled", "first"),
        ("Scheduled", "second"),
        ("Started", "first"),
        ("Started", "second"),
    ]


def test_the_same_transition_again_runs_nothing(tmp_path: Path, running: list[Running]) -> None:
    run = Running(tmp_path, [recorder_hook(tmp_path, "once", on=["Scheduled"])])
    running.append(run)
    run.observe(observed("Scheduled"))
    run.settle()
    run.restart()  # the forwarder derives the same transition (same message id) again
    run.observe(observed("Scheduled"))
    run.settle()
    assert len(ran(tmp_path)) == 1
    run.observe(observed("Scheduled", appearance=2))  # the event came back: a new transition
    run.settle()
    assert len(ran(tmp_path)) == 2


def test_a_hook_cut_short_by_a_stop_runs_again_after_the_restart(
    tmp_path: Path, running: list[Running]
) -> None:
    marker = tmp_path / "started"
    hook = recorder_hook(tmp_path, "long", on=["Scheduled"], body=f"echo x >> {marker}; sleep 30")
    run = Running(tmp_path, [hook, recorder_hook(tmp_path, "after", on=["Scheduled"])])
    running.append(run)
    run.observe(observed("Scheduled"))
    wait_until(marker.exists, 10, "the long hook to start")
    run.halt()
    assert ran(tmp_path) == []
    statuses = {r.hook: (r.status, r.attempts) for r in Journal(tmp_path).runs()}
    assert statuses == {"long": ("running", 1), "after": ("pending", 0)}
    # The restarted worker runs both; this time the long hook is quick.
    line = '"$SEBRIDGE_EVENT_MESSAGE_ID long $SEBRIDGE_HOOK_ATTEMPT"'
    (tmp_path / "long.sh").write_text(f"#!/bin/sh\necho {line} >> {tmp_path / 'ran.log'}\n")
    run.start()
    assert run.worker.resume() == 2
    run.settle()
    assert [h for _, h in ran(tmp_path)] == ["long 2", "after"]
    assert {r.hook: r.status for r in run.journal.runs()} == {
        "long": "succeeded",
        "after": "succeeded",
    }


def test_prepared_once_every_prepare_hook_succeeded(tmp_path: Path, running: list[Running]) -> None:
    hooks = [
        recorder_hook(
            tmp_path, "checkpoint", on=["Scheduled", "Updated"], prepare=True, body="sleep 0.5"
        ),
        recorder_hook(tmp_path, "flush", on=["Scheduled"], prepare=True),
        recorder_hook(tmp_path, "notify", on=["Scheduled"]),
    ]
    run = Running(tmp_path, hooks)
    running.append(run)
    scheduled = observed("Scheduled")
    run.observe(scheduled)
    assert run.outbox.envelopes == []
    run.settle()
    wait_until(lambda: run.outbox.envelopes, 5, "Prepared")
    (prepared,) = run.outbox.envelopes
    message = parse_message(prepared.body, prepared.message_id)
    assert message.transition is Transition.PREPARED
    assert message.data["prepared"] == {"vms": ["web-1"], "preparedBy": "hooks"}
    assert message.source == OBSERVER.resource_id and message.observer.vm_name == "web-1"
    assert message.event is not None and message.event.key == scheduled.event.key
    # Not the id lb-pools derives from the same Scheduled: both must survive duplicate detection.
    assert prepared.message_id != derived_message_id(
        scheduled.event, Transition.PREPARED, scheduled.message_id
    )
    # An Updated runs the checkpoint again and is prepared again, under another id.
    run.observe(observed("Updated", not_before="Sun, 22 Nov 2026 10:15:00 GMT"))
    run.settle()
    wait_until(lambda: len(run.outbox.envelopes) == 2, 5, "the second Prepared")
    assert run.outbox.envelopes[1].message_id != prepared.message_id


def test_a_failed_prepare_hook_publishes_no_prepared_and_is_reported(
    tmp_path: Path, running: list[Running], caplog: pytest.LogCaptureFixture
) -> None:
    hooks = [
        recorder_hook(tmp_path, "checkpoint", on=["Scheduled"], prepare=True),
        {
            "name": "broken",
            "on": ["Scheduled"],
            "prepare": True,
            "command": [script(tmp_path, "broken.sh", "echo disk full >&2; exit 3")],
        },
    ]
    run = Running(tmp_path, hooks)
    running.append(run)
    run.observe(observed("Scheduled"))
    run.settle()
    time.sleep(0.3)
    assert run.outbox.envelopes == []
    assert run.preparations.failed_count == 1
    assert run.worker.health()["hooksFailed"] == 1
    assert "broken" in run.worker.health()["lastHookFailure"]
    assert "NOT PREPARED" in caplog.text and "disk full" in caplog.text


def test_a_timed_out_prepare_hook_publishes_no_prepared(
    tmp_path: Path, running: list[Running]
) -> None:
    hooks = [
        recorder_hook(
            tmp_path, "slow", on=["Scheduled"], prepare=True, body="sleep 30", timeoutSeconds=0.5
        )
    ]
    run = Running(tmp_path, hooks)
    running.append(run)
    run.observe(observed("Scheduled"))
    run.settle()
    assert run.outbox.envelopes == []
    assert [r.status for r in run.journal.runs()] == ["timed-out"]


def test_other_vms_events_run_only_all_events_hooks(tmp_path: Path, running: list[Running]) -> None:
    hooks = [
        recorder_hook(tmp_path, "mine", on=["Scheduled"], prepare=True),
        recorder_hook(tmp_path, "everyone", on=["Scheduled"], allEvents=True),
    ]
    run = Running(tmp_path, hooks)
    running.append(run)
    run.observe(observed("Scheduled", resources=["web-2"]))
    run.settle()
    assert [h for _, h in ran(tmp_path)] == ["everyone"]
    assert run.outbox.envelopes == []  # nothing prepared for another VM's event


def test_a_prepare_hook_whose_event_started_meanwhile_is_skipped(
    tmp_path: Path, running: list[Running]
) -> None:
    hooks = [
        recorder_hook(tmp_path, "slow", on=["Scheduled"], body="sleep 1"),
        recorder_hook(tmp_path, "checkpoint", on=["Scheduled"], prepare=True),
    ]
    run = Running(tmp_path, hooks)
    running.append(run)
    run.observe(observed("Scheduled"))
    run.observe(observed("Started"))  # while the first hook still runs
    run.settle()
    assert [h for _, h in ran(tmp_path)] == ["slow"]
    assert {r.hook: r.status for r in run.journal.runs()} == {
        "slow": "succeeded",
        "checkpoint": "skipped",
    }
    assert run.outbox.envelopes == []


def test_a_damaged_journal_is_set_aside_and_a_fresh_one_started(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_FILE).write_bytes(b"this is not a database" * 100)
    journal = Journal(tmp_path)
    assert journal.runs() == [] and journal.load().view is None
    assert list(tmp_path.glob(f"{JOURNAL_FILE}.corrupt-*"))
    journal.close()


def test_an_updated_that_drops_this_vm_ends_its_preparation(
    tmp_path: Path, running: list[Running]
) -> None:
    hooks = [recorder_hook(tmp_path, "checkpoint", on=["Scheduled"], prepare=True, body="sleep 1")]
    run = Running(tmp_path, hooks)
    running.append(run)
    run.observe(observed("Scheduled"))
    run.observe(observed("Updated", resources=["web-2"]))  # while the checkpoint runs
    run.settle()
    time.sleep(0.3)
    assert run.outbox.envelopes == []  # no longer this VM's event: nothing to prepare
    record = run.journal.preparation(observed("Scheduled").event.key)
    assert record is not None and record.ended
