"""`make demo` / `make test` on a machine whose Python is too old, or whose install fails.

The real Makefile runs (`make install` with VENV pointed at a scratch directory), with a fake
interpreter first on PATH: one that reports Python 3.10 (as Ubuntu 22.04's python3 does), and
one that is the real 3.11 but makes environments without pip, so the installation fails. Neither
may leave an environment behind, and each says what to do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")

# What Ubuntu 22.04's python3 answers: its version, and it would happily make a venv.
PYTHON_310 = """#!/bin/sh
case "$1" in
  -c) echo 3.10.12 ;;
  -m) [ "$2" = venv ] && mkdir -p "$3/bin" ;;
esac
exit 0
"""

# The real interpreter, but its environments have no pip: every install into them fails.
PYTHON_WITHOUT_PIP = f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  exec {sys.executable} -m venv --without-pip "$3"
fi
exec {sys.executable} "$@"
"""


def make_install(
    tmp_path: Path, fake: str, *goal: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3"
    python.write_text(fake)
    python.chmod(0o755)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "MAKEFLAGS"}}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    proc = subprocess.run(
        [str(MAKE), "-C", str(REPO), f"VENV={venv}", *goal],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return proc, venv


def test_python_310_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    proc, venv = make_install(tmp_path, PYTHON_310, "install")
    assert proc.returncode != 0
    assert "Python 3.11 or later is needed, but python3 is Python 3.10.12" in proc.stderr
    assert str(tmp_path / "bin" / "python3") in proc.stderr
    assert "make PYTHON=python3.11 install" in proc.stderr
    assert not venv.exists()


@pytest.mark.parametrize("goal", ["demo", "test"])
def test_the_hint_names_the_goal_that_was_asked_for(tmp_path: Path, goal: str) -> None:
    # `make demo` depends on the environment: the check runs first and names `demo`; `make
    # test` makes its environments in a make of its own, and the hint still names `test`.
    proc, venv = make_install(tmp_path, PYTHON_310, goal, f"CHECKOV_VENV={tmp_path / 'ck'}")
    assert proc.returncode != 0
    assert f"make PYTHON=python3.11 {goal}" in proc.stderr
    assert "test-deps" not in proc.stderr.replace("make[1]", "")
    assert not venv.exists()


def test_a_missing_interpreter_is_named(tmp_path: Path) -> None:
    proc, venv = make_install(tmp_path, PYTHON_310, "install", "PYTHON=python3.99-absent")
    assert proc.returncode != 0
    assert "no 'python3.99-absent' found" in proc.stderr
    assert not venv.exists()


def test_a_failed_install_leaves_no_half_made_environment(tmp_path: Path) -> None:
    proc, venv = make_install(tmp_path, PYTHON_WITHOUT_PIP, "install")
    assert proc.returncode != 0
    assert "No module named pip" in proc.stderr
    assert f"{venv} was removed, nothing is left half-made" in proc.stderr
    assert not venv.exists()


def test_an_unfinished_environment_from_an_earlier_run_is_made_again(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")  # broken, and no marker
    proc, _ = make_install(tmp_path, PYTHON_WITHOUT_PIP, "install")
    assert f"{venv} was left unfinished by an earlier run: making it again" in proc.stderr
    assert not venv.exists()  # made again, failed again (no pip), removed
