"""Options for the whole suite."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-runs",
        type=int,
        default=20,
        help="kill -9 runs in tests/reliability (default 20, the CI bound; more for soak runs)",
    )


@pytest.fixture
def reliability_runs(request: pytest.FixtureRequest) -> int:
    runs: int = request.config.getoption("--reliability-runs")
    if runs < 1:
        raise pytest.UsageError("--reliability-runs must be at least 1")
    return runs
