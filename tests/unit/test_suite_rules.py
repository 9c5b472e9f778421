"""The suite's own rules (tests/conftest.py), checked on small pytest sessions (pytester)."""

from __future__ import annotations

import os

import pytest

SESSION = """
import pytest

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
