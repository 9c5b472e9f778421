"""history as a state machine: messages of two appearances of one event delivered in any order,
again and again, while another writer slips in between a writer's read and its write.

The invariant after every step: the stored summary is the one the delivered set of messages
yields, whatever the order, the duplicates and the races. Without the ETag on the summary
(``save_summary`` writing whatever it read), the interleaved writer's entry is lost from the
summary and the invariant fails.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from functions.history.core import (
    EntryRead,
    History,
    PurgeSchedule,
    entry_for,
    summarize,
)
from sebridge.contract.events import Envelope
from tests.functions.history_support import (
    T0,
    Lifecycle,
    MemoryHistoryStore,
    scope_key,
    stored,
    verified,
)
from tests.support.budget import examples

KEY = scope_key()


def _messages() -> list[Envelope]:
    life = Lifecycle()
    life.transition("Scheduled", DurationInSeconds=120)
    life.transition("Updated", NotBefore="Sun, 22 Nov 2026 02:00:00 GMT")
    life.held()
    life.transition("Updated", NotBefore="Sun, 22 Nov 2026 03:00:00 GMT")
    life.prepared()
    life.approved()
    life.transition("Started")
    life.transition("Completed", impact={"measuredSeconds": 4.5, "method": "reboot-gap"})
    life.transition("Scheduled", NotBefore="Sun, 22 Nov 2026 09:00:00 GMT")
    life.transition("Cancelled")
    return life.messages


MESSAGES = _messages()


class Interleaving(MemoryHistoryStore):
    """A store that, once armed, lets another writer record a message between this writer's
    read of the entries and its write of the summary."""

    def __init__(self) -> None:
        super().__init__()
        self.armed: Envelope | None = None
        self.other: History | None = None

    def entries(self, key: str) -> EntryRead:
        seen = super().entries(key)
        if self.armed is not None and self.other is not None:
            message, self.armed = self.armed, None
            self.other.record(verified(message), T0)
        return seen


class HistoryMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.store = Interleaving()
        self.history = History(self.store, timedelta(days=3650), PurgeSchedule())
        self.store.other = History(self.store, timedelta(days=3650), PurgeSchedule())
        self.delivered: set[int] = set()

    def _record(self, index: int) -> None:
        message = MESSAGES[index]
        self.history.record(verified(message), T0)
        self.delivered.add(index)

    @rule(index=st.integers(0, len(MESSAGES) - 1))
    def deliver(self, index: int) -> None:
        self._record(index)

    @rule(index=st.integers(0, len(MESSAGES) - 1), other=st.integers(0, len(MESSAGES) - 1))
    def deliver_while_another_writes(self, index: int, other: int) -> None:
        self.store.armed = MESSAGES[other]
        self._record(index)
        self.delivered.add(other)

    @invariant()
    def the_summary_is_the_delivered_set(self) -> None:
        if not self.delivered:
            return
        entries = [e for i in sorted(self.delivered) if (e := entry_for(verified(MESSAGES[i]), T0))]
        assert stored(self.store, KEY) == summarize(entries)


HistoryMachine.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=25, deadline=None
)
TestHistoryMachine = HistoryMachine.TestCase
TestHistoryMachine.pytestmark = [pytest.mark.slow]  # about 8 s or more
