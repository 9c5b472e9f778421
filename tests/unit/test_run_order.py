"""The order parallel runs take the tests in (tests/conftest.py ``run_order``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import LAYERS, WAITING_LAYERS, WAITING_SPAN, run_order


@dataclass(frozen=True)
class FakeItem:
    nodeid: str
    slow: bool

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


ITEMS = st.lists(
    st.tuples(st.sampled_from([*LAYERS, "docs"]), st.booleans()), min_size=1, max_size=120
).map(
    lambda specs: [
        FakeItem(f"tests/{layer}/test_{i}.py::test_{i}", slow)
        for i, (layer, slow) in enumerate(specs)
    ]
)


def ordered(items: list[FakeItem]) -> list[FakeItem]:
    return run_order(items)  # type: ignore[arg-type]  # only nodeid and the slow marker are read


@given(ITEMS)
def test_every_test_once_the_slow_ones_first(items: list[FakeItem]) -> None:
    got = ordered(items)
    assert sorted(got, key=id) == sorted(items, key=id)
    slow = [item.slow for item in got]
    assert slow == sorted(slow, reverse=True)


@given(ITEMS)
def test_each_layer_keeps_its_collection_order(items: list[FakeItem]) -> None:
    got = ordered(items)
    for layer in {item.nodeid.split("/")[1] for item in items}:
        for slow in (True, False):
            mine = [i for i in items if i.nodeid.split("/")[1] == layer and i.slow == slow]
            assert [i for i in got if i in mine] == mine


def test_the_layers_are_mixed_and_the_last_stretch_is_quick_tests() -> None:
    items = [FakeItem(f"tests/integration/test_w.py::test_{i}", False) for i in range(50)]
    items += [FakeItem(f"tests/unit/test_u.py::test_{i}", False) for i in range(500)]
    got = ordered(items)
    layers = [item.nodeid.split("/")[1] for item in got]
    # Taken in turn, not one layer after the other: a waiting test in every tenth of the run...
    for tenth in range(8):
        assert "integration" in layers[tenth * 55 : (tenth + 1) * 55], tenth
    # ...but none in the last stretch.
    last_waiting = max(i for i, layer in enumerate(layers) if layer in WAITING_LAYERS)
    assert last_waiting < WAITING_SPAN * len(got) + 1


@pytest.mark.parametrize("layer", sorted(WAITING_LAYERS))
def test_the_waiting_layers_are_layers(layer: str) -> None:
    assert layer in LAYERS
