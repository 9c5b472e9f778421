"""The emulator's reactor selector (emulators/servicebus/polling.py) against Proton's own.

Proton's ``IO.Selector.update`` walks every selectable to recompute the earliest deadline; the
emulator replaces it with one that folds in the updated selectable alone. A stateful
hypothesis test drives two selectors with the same sequence of operations (add, change a
deadline and update, change reading/writing and update, remove, a select's reset) on
stand-in selectables, one with Proton's update and one with the emulator's, and compares
what the reactor reads from them after each step: the deadline and the reading and writing
sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from proton import _io

from emulators.servicebus import polling
from tests.support.budget import examples

polling.install_into_proton()
PROTON_UPDATE: Any = polling.proton_update
assert PROTON_UPDATE is not None and PROTON_UPDATE is not polling.incremental_update

DEADLINES = st.one_of(st.none(), st.floats(min_value=1.0, max_value=1000.0))


@dataclass(eq=False)
class Stand:
    """What the selector reads of a selectable."""

    reading: bool = False
    writing: bool = False
    deadline: float | None = None
    number: int = field(default=0)

    def fileno(self) -> int:  # pragma: no cover - the selector never polls here
        return -1


class SelectorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.proton = _io.IO.Selector()
        self.ours = _io.IO.Selector()
        self.live: list[Stand] = []

    def _both(self, method: str, stand: Stand) -> None:
        if method == "update":
            PROTON_UPDATE(self.proton, stand)
            polling.incremental_update(self.ours, stand)
        else:
            getattr(self.proton, method)(stand)
            getattr(self.ours, method)(stand)

    @rule(reading=st.booleans(), writing=st.booleans(), deadline=DEADLINES)
    def add(self, reading: bool, writing: bool, deadline: float | None) -> None:
        stand = Stand(reading, writing, deadline, len(self.live))
        self.live.append(stand)
        self._both("add", stand)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), deadline=DEADLINES)
    def new_deadline(self, data: st.DataObject, deadline: float | None) -> None:
        stand = data.draw(st.sampled_from(self.live))
        stand.deadline = deadline  # as transport.tick() sets it, then update()
        self._both("update", stand)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), reading=st.booleans(), writing=st.booleans())
    def new_interest(self, data: st.DataObject, reading: bool, writing: bool) -> None:
        stand = data.draw(st.sampled_from(self.live))
        stand.reading, stand.writing = reading, writing
        self._both("update", stand)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        stand = data.draw(st.sampled_from(self.live))
        self.live.remove(stand)
        self._both("remove", stand)

    @rule()
    def select_resets(self) -> None:
        # What select() does after waiting: forget the deadline, recompute it from all.
        for selector in (self.proton, self.ours):
            selector._deadline = None
            selector.update_deadline()

    @invariant()
    def the_reactor_reads_the_same(self) -> None:
        assert self.ours._deadline == self.proton._deadline
        assert self.ours._reading == self.proton._reading
        assert self.ours._writing == self.proton._writing


SelectorMachine.TestCase.settings = settings(
    max_examples=examples(300), stateful_step_count=40, deadline=None
)
TestSelector = SelectorMachine.TestCase
TestSelector.pytestmark = [pytest.mark.slow]


def test_the_emulator_installs_the_incremental_update() -> None:
    assert _io.IO.Selector.update is polling.incremental_update
    assert _io.IO.select is polling.select_by_poll
