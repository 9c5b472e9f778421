"""The suite's own rules (tests/conftest.py), checked on small pytest sessions (pytester)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.root import root_rule_violations

REPO = Path(__file__).resolve().parents[2]

SESSION = """
import pytest

from tests.support.root import root_rule_violations

from tests.support.root import requires_root, skip_needing_root


@pytest.mark.skipif(True, reason="needs root: a marker's skip")
def test_marked():
    pass


def test_mount_refused():
    skip_needing_root("cannot mount a tmpfs (CAP_SYS_ADMIN): permission denied")


def test_other_reason():
    pytest.skip("tests the local emulator itself; the suite runs against another namespace")


@requires_root("a hooks file must be root-owned")
def test_root_only():
    import os

    assert os.geteuid() == 0
"""


MODULE_SKIP = """
import pytest

from tests.support.root import NEEDS_ROOT

pytest.skip(f"{NEEDS_ROOT}: a tmpfs mount", allow_module_level=True)


def test_would_need_root():
    assert False
"""


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_whole_module_skipped_for_want_of_root_fails_under_ci_and_only_there(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    """A module-level skip is a collection report, not a test's: it fails under CI too."""
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(test_module_skip=MODULE_SKIP, test_other="def test_fine():\n    pass\n")
    result = pytester.runpytest("-p", "tests.conftest", "-p", "no:cacheprovider", "-rfEs")
    outcomes = result.parseoutcomes()
    if ci:
        assert outcomes.get("errors", 0) == 1, outcomes
        assert outcomes.get("skipped", 0) == 0, outcomes
        result.stdout.fnmatch_lines(["*skipped under CI=true, where every test must run*"])
        assert result.ret != 0
    else:
        assert outcomes == {"passed": 1, "skipped": 1}, outcomes
        assert result.ret == 0


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_skip_for_want_of_root_fails_under_ci_and_only_there(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(test_session=SESSION)
    result = pytester.runpytest("-p", "tests.conftest", "-p", "no:cacheprovider", "-rfs")
    outcomes = result.parseoutcomes()
    not_root = 0 if os.geteuid() == 0 else 1  # as root, test_root_only runs and passes
    failed = outcomes.get("failed", 0) + outcomes.get("errors", 0)  # a marker's: at setup
    if ci:
        assert failed == 2 + not_root
        assert outcomes.get("skipped", 0) == 1  # another reason: skipped as before
        result.stdout.fnmatch_lines(["*skipped under CI=true, where every test must run*"])
        assert result.ret != 0
    else:
        assert failed == 0
        assert outcomes.get("skipped", 0) == 3 + not_root
        assert result.ret == 0


SHARED = """
import os

import pytest

from tests.support.root import root_rule_violations


@pytest.fixture(scope="module")
def stand_in():
    return object()


@pytest.mark.parametrize("n", range(6))
def test_uses_the_module_stand_in(stand_in, n):
    with open(os.environ["WORKERS_FILE"], "a") as out:
        out.write(os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")
"""


def test_tests_sharing_a_module_stand_in_run_in_one_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make test's --dist loadgroup with tests/conftest.py's groups: a module-scoped fixture
    is set up once, in one worker, not once in every worker that takes some of its tests
    (pytest 9.2 silently broke this: pytest-dev/pytest-xdist#1386)."""
    workers = pytester.path / "workers.txt"
    monkeypatch.setenv("WORKERS_FILE", str(workers))
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the subprocess imports tests.conftest
    pytester.makepyfile(test_shared=SHARED)
    result = pytester.runpytest_subprocess(
        "-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"
    )
    assert result.parseoutcomes().get("passed") == 6
    seen = workers.read_text().split()
    assert len(seen) == 6 and len(set(seen)) == 1, seen


def test_no_test_skips_or_passes_for_want_of_root_without_saying_needs_root() -> None:
    """CI=true fails a skip only if its reason starts with NEEDS_ROOT: a root-only test that
    skips with another reason, or drops its root assertions in ``if os.geteuid() == 0:``,
    would let CI pass without it."""
    support = REPO / "tests" / "support" / "root.py"
    found = [
        problem
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path != support
        for problem in root_rule_violations(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert found == []


def test_every_example_count_goes_through_the_budget() -> None:
    """make check runs each property test at a tenth of its examples (tests/support/budget.py):
    a count written without ``examples(...)`` would run in full there, and the loop inside a
    change would slow down with every such test. A count that sizes data rather than a test
    (drawn the same under both runs) says so: ``# fixed: ...``."""
    written = re.compile(r"max_examples\s*=\s*(?!examples\()")
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if written.search(line) and "budget.examples(" not in line and "# fixed: " not in line
    ]
    assert found == []


BREAKS_THE_ROOT_RULE = """
import os
import pytest

from tests.support.root import root_rule_violations
from tests.support.root import NEEDS_ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a hooks file: run as root")


@pytest.mark.skipif(os.geteuid() != 0, reason=f"{NEEDS_ROOT}: fine")
def test_fine():
    pytest.skip(f"{NEEDS_ROOT}: fine too")


def test_cgroup():
    pytest.skip("no cgroup v2 this process may write (needs root or a delegated cgroup)")


def test_other():
    pytest.skip("the emulator is not installed")  # not about root: fine


def test_drops_assertions():
    if os.geteuid() == 0:
        assert False
"""


def test_the_root_rule_finds_each_way_round_it() -> None:
    found = root_rule_violations(BREAKS_THE_ROOT_RULE, "t.py")
    assert [line.split(": ", 1)[0] for line in found] == ["t.py:8", "t.py:17", "t.py:25"], found


CONTRACT = """
import os

import pytest


@pytest.mark.parametrize("n", range(6))
def test_on_the_namespace(n):
    with open(os.environ["WORKERS_FILE"], "a") as out:
        out.write(os.environ.get("PYTEST_XDIST_WORKER", "none") + "\\n")
"""


def test_contract_tests_on_one_shared_namespace_run_in_one_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SEBRIDGE_CONTRACT_CONNECTION_STRING every worker would use the same fixed entities
    and receive, or drain, the others' messages (8-11 of 24 failed with -n 3 against one
    emulator): all of tests/contract runs in one worker then."""
    workers = pytester.path / "workers.txt"
    monkeypatch.setenv("WORKERS_FILE", str(workers))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("SEBRIDGE_CONTRACT_CONNECTION_STRING", "Endpoint=sb://127.0.0.1:1/")
    contract = pytester.mkdir("tests").joinpath("contract")
    contract.mkdir()
    for name in ("test_one.py", "test_two.py"):
        contract.joinpath(name).write_text(CONTRACT)
    result = pytester.runpytest_subprocess(
        "-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"
    )
    assert result.parseoutcomes().get("passed") == 12
    seen = workers.read_text().split()
    assert len(seen) == 12 and len(set(seen)) == 1, seen
