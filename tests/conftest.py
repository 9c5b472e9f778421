"""Options and hooks for the whole suite."""

from __future__ import annotations

from collections.abc import Generator

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


def _encodable(text: str) -> str:
    """``text`` with lone surrogates written as escapes (``\\ud800``): pytest-xdist sends
    reports to the controller as UTF-8, and a surrogate there kills the worker
    (pytest-dev/pytest-xdist#843). Several tests feed lone surrogates on purpose, and their
    captured logs repeat them."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    report.sections = [(title, _encodable(text)) for title, text in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        if _encodable(text) != text:
            report.longrepr = _encodable(text)
    return report
