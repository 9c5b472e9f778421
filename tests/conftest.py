"""Options and hooks for the whole suite."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest
from hypothesis import settings

from tests.contract.remote import on_a_remote_namespace
from tests.support import budget
from tests.support.root import NEEDS_ROOT

# make check (SEBRIDGE_TEST_BUDGET=check): the property tests that write no count run
# budget.examples(100) of hypothesis's default 100; those that write one call budget.examples.
settings.register_profile("check", max_examples=budget.examples(100))
if budget.CHECK:
    settings.load_profile("check")

# tests/unit/test_suite_rules.py runs small pytest sessions with this file's hooks.
pytest_plugins = ("pytester",)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-runs",
        type=int,
        default=20,
        help="kill -9 runs in tests/reliability (default 20, the CI bound; more for soak runs)",
    )


# Parallel runs (make test: pytest-xdist, --dist loadgroup) take the tests in this order: the
# tests marked slow first, so that the long ones never start last, then the rest. Within each of
# the two, the layers are merged in proportion, so that every stretch of the run holds the same
# mix: the real-process layers spend most of their time waiting (on a 30 s outage, a kill -9
# loop, a broker), the in-process ones on the CPU, and taken one layer after the other, six
# workers waiting at once left the cores half idle for minutes (1,045 worker-seconds of the
# integration layer used 130 s of CPU). The waiting layers end by WAITING_SPAN of the rest, so
# that its last stretch is only quick in-process tests, which fill the gaps at the end.
# pytest-xdist hands out the worker groups below (tests that share a stand-in, one unit each)
# before the single tests, the largest first (--loadscope-reorder), and the single tests in this
# order. In one process (no xdist) the tests keep their collection order: mixing would start a
# module's stand-in again at every switch.
LAYERS = (
    "reliability",
    "e2e",
    "integration",
    "eventgrid",
    "functions_host",
    "contract",
    "forwarder",
    "infra",
    "functions",
    "unit",
)
WAITING_LAYERS = frozenset(
    {"reliability", "e2e", "integration", "eventgrid", "functions_host", "contract"}
)
WAITING_SPAN = 0.85
# Tests that share one expensive session fixture run in one worker (xdist_group), so the
# fixture runs once, not once per worker: checkov scans infra/ for 10-70 s of CPU.
SHARED_SESSION_FIXTURES = {"checkov_report": "checkov", "checkov_reports": "checkov"}


def _layer(item: pytest.Item) -> str:
    parts = item.nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""


def run_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` in the order above; within a layer, the collection order."""
    places: dict[tuple[bool, str], list[pytest.Item]] = {}
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        places.setdefault((not slow, _layer(item)), []).append(item)
    keyed = []
    for (rest, layer), members in places.items():
        span = WAITING_SPAN if rest and layer in WAITING_LAYERS else 1.0
        rank = LAYERS.index(layer) if layer in LAYERS else len(LAYERS)
        for index, item in enumerate(members):
            keyed.append(((rest, span * index / len(members), rank, index), item))
    keyed.sort(key=lambda pair: pair[0])
    return [item for _, item in keyed]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = _shared_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: see run_order
        items[:] = run_order(items)


# The contract suite against one namespace of someone else's (docs/reliability.md, "The
# contract suite against Azure"): its entities have fixed names and each worker drains them
# once, so two workers would receive each other's messages and drain each other's. There,
# every contract test runs in one worker; locally each worker starts an emulator of its own.
SHARED_NAMESPACE_GROUP = "contract-shared-namespace"


def _on_a_shared_namespace(item: pytest.Item) -> bool:
    parts = item.nodeid.split("/")
    in_contract = len(parts) > 2 and parts[:2] == ["tests", "contract"]
    return in_contract and on_a_remote_namespace()


def _shared_group(item: pytest.Item) -> str | None:
    """The worker group of a test that shares an expensive fixture with others: checkov's
    session report, or a stand-in its module starts once (a module-scoped fixture: the
    deliverables' wheel and virtual environments, a module's emulator or simulator), which
    every worker taking some of the module's tests would otherwise start again; or the
    contract suite's tests, when they share one namespace."""
    if _on_a_shared_namespace(item):
        return SHARED_NAMESPACE_GROUP
    names = getattr(item, "fixturenames", ())
    for fixture, group in SHARED_SESSION_FIXTURES.items():
        if fixture in names:
            return group
    info = getattr(item, "_fixtureinfo", None)
    definitions = getattr(info, "name2fixturedefs", {})
    for name in names:
        defs = definitions.get(name)
        if defs and defs[-1].scope == "module":
            return item.nodeid.split("::")[0]
    return None


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


def in_ci() -> bool:
    """CI=true, as CI services set it (and .ci/run does)."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: <reason>")
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr or "")


def _fail_a_root_skip_in_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under CI=true, a test that skips because it needs root fails instead: the full-disk and
    read-only rows of the README's Reliability table and the hooks tests need root, and a CI
    run that skipped them would pass without them."""
    if not (report.skipped and in_ci()):
        return
    reason = _skip_reason(report)
    if reason.startswith(NEEDS_ROOT):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true, where every test must run: {reason} "
            "(run the suite as root, as .ci/run does)"
        )


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A whole module skipped for want of root (``pytest.skip(..., allow_module_level=True)``)
    is a collection report, which pytest_runtest_makereport never sees: it fails too."""
    report = yield
    _fail_a_root_skip_in_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _fail_a_root_skip_in_ci(report)
    report.sections = [(title, _encodable(text)) for title, text in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        if _encodable(text) != text:
            report.longrepr = _encodable(text)
    return report
