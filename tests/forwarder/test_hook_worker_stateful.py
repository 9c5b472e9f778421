"""Hypothesis state machine: transitions, stops in the middle of hooks and restarts, in any
order. Every hook of every transition finishes at least once, and one that finished before a
restart never runs again."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sebridge.forwarder.local.hooks_file import parse_hooks
from sebridge.forwarder.local.journal import Journal
from tests.forwarder.local_support import Parts, observed, script
from tests.support.budget import examples
from tests.support.waiting import wait_until

EVENTS = [f"{c * 8}-0000-4000-8000-00000000000{i}" for i, c in enumerate("abc")]
TRANSITIONS = ["Scheduled", "Updated", "Started", "Completed", "Cancelled"]


class HookRestarts(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="hooks-sm-"))
        self.log = self.dir / "done.log"
        line = f'echo "$SEBRIDGE_EVENT_MESSAGE_ID $SEBRIDGE_HOOK_NAME" >> {self.log}'
        self.hooks = parse_hooks(
            {
                "hooks": [
                    {
                        "name": "quick",
                        "on": TRANSITIONS,
                        "command": [script(self.dir, "quick.sh", line)],
                    },
                    {
                        "name": "slow",
                        "on": ["Scheduled", "Started"],
                        "prepare": False,
                        "command": [script(self.dir, "slow.sh", f"sleep 0.2\n{line}")],
                    },
                ]
            }
        )
        self.expected: set[tuple[str, str]] = set()
        self.finished_before_restart: dict[tuple[str, str], int] = {}
        self.appearance = 1
        self._start()

    def _start(self) -> None:
        self.parts = Parts(self.dir, self.hooks, max_parallel=2, kill_grace=0.2)
        self.journal = self.parts.journal
        assert self.parts.worker is not None
        self.worker = self.parts.worker
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.worker.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def _halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()
        self.journal.close()

    def done(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        if self.log.exists():
            for entry in self.log.read_text().splitlines():
                message_id, hook = entry.split(" ")
                counts[(message_id, hook)] = counts.get((message_id, hook), 0) + 1
        return counts

    @rule(
        event=st.sampled_from(EVENTS), transition=st.sampled_from(TRANSITIONS), again=st.booleans()
    )
    def transition(self, event: str, transition: str, again: bool) -> None:
        item = observed(transition, event, appearance=self.appearance)
        self.parts.apply(item)
        if again:
            self.parts.apply(item)  # derived again (e.g. after a crash before the save)
        for hook in self.hooks.matching(transition, item.event.event_type, True):
            self.expected.add((item.message_id, hook.name))

    @rule(pause=st.sampled_from([0.0, 0.05, 0.25]))
    def restart(self, pause: float) -> None:
        self.stop.wait(pause)
        self._halt()
        finished = {
            (r.message_id, r.hook) for r in Journal(self.dir).runs() if r.status == "succeeded"
        }
        counts = self.done()
        for key in finished:
            self.finished_before_restart.setdefault(key, counts.get(key, 0))
        self._start()
        self.worker.resume()

    @precondition(lambda self: self.appearance < 3)
    @rule()
    def comes_back(self) -> None:
        self.appearance += 1

    @invariant()
    def finished_hooks_never_run_again(self) -> None:
        counts = self.done()
        for key, count in self.finished_before_restart.items():
            assert counts.get(key, 0) == count, f"{key} ran again after it had finished"

    def teardown(self) -> None:
        try:
            wait_until(lambda: self.worker.pending() == 0, 60, "the hooks to finish")
            counts = self.done()
            missing = self.expected - set(counts)
            assert not missing, f"never finished: {sorted(missing)}"
            self.finished_hooks_never_run_again()
        finally:
            self._halt()
            shutil.rmtree(self.dir, ignore_errors=True)


HookRestarts.TestCase.settings = settings(
    max_examples=examples(12),
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_hook_restarts = pytest.mark.timeout(600)(HookRestarts.TestCase)
test_hook_restarts.pytestmark = [pytest.mark.slow]
