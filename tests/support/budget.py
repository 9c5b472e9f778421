"""How many examples a property test runs (hypothesis).

``make test`` and CI run every property test at the count written in it. ``make check``, the
loop inside a change, runs the same tests at a tenth of that count (at least ``MIN_CHECK``,
never more than written): it sets ``SEBRIDGE_TEST_BUDGET=check``, which also loads
hypothesis's ``check`` profile (tests/conftest.py) for the tests that write no count. A failing
example is saved in .hypothesis/ and replayed first by either run.

Every ``max_examples`` in tests/ goes through :func:`examples` (tests/unit/test_suite_rules.py).
"""

from __future__ import annotations

import os

CHECK = os.environ.get("SEBRIDGE_TEST_BUDGET") == "check"
CHECK_SHARE = 10  # make check runs 1/CHECK_SHARE of each count
MIN_CHECK = 5


def examples(count: int) -> int:
    """``count`` under make test and CI; a tenth of it (at least MIN_CHECK) under make check."""
    if not CHECK:
        return count
    return min(count, max(MIN_CHECK, count // CHECK_SHARE))
