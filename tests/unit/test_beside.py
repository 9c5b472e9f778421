"""scripts/beside: make test's way to run ruff and mypy beside pytest."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

BESIDE = Path(__file__).resolve().parents[2] / "scripts" / "beside"


def beside(background: str, *foreground: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BESIDE), background, *foreground], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("background", "foreground", "code"),
    [
        ("exit 0", "true", 0),
        ("exit 3", "true", 3),  # a failed check fails the run even when the tests pass
        ("exit 0", "false", 1),
        ("exit 3", "false", 1),  # the tests' own exit status comes first
    ],
)
def test_either_failing_fails_the_whole(background: str, foreground: str, code: int) -> None:
    assert beside(background, foreground).returncode == code


def test_the_background_output_comes_after_the_foreground_output(tmp_path: Path) -> None:
    marker = tmp_path / "background-ran"
    # The foreground waits until the background has written: both ran at the same time...
    done = beside(
        f"echo from-the-checks; touch {marker}",
        "bash",
        "-c",
        f"for i in $(seq 200); do [ -e {marker} ] && break; sleep 0.05; done; "
        f"[ -e {marker} ] && echo from-the-tests",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # ...and what the checks printed is shown after what the tests printed, under a header.
    lines = done.stdout.splitlines()
    assert lines[0] == "from-the-tests"
    assert lines[1].startswith("== beside it: echo from-the-checks")
    assert lines[2] == "from-the-checks"


def test_no_kept_output_is_left_behind(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BESIDE), "echo kept", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0
    assert "kept" in done.stdout
    assert list(tmp_path.iterdir()) == []
