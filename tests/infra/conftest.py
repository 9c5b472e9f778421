"""Fixtures for the infra tests: checkov runs once per session (it takes ~10 s on 2 cores)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from infra_helpers import INFRA, REPO


def checkov_executable() -> Path:
    """$SEBRIDGE_CHECKOV, else <repo>/.venv-checkov/bin/checkov; missing is a failure."""
    configured = os.environ.get("SEBRIDGE_CHECKOV")
    path = Path(configured) if configured else REPO / ".venv-checkov" / "bin" / "checkov"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"checkov not found at {path}. It needs its own venv (it conflicts with the Azure "
            "SDKs): python3 -m venv .venv-checkov && .venv-checkov/bin/pip install checkov "
            "(or `make test`), or point SEBRIDGE_CHECKOV at a checkov executable.",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def checkov_reports() -> dict[str, dict[str, Any]]:
    """One offline checkov run over infra/: {"bicep": report, "secrets": report (if any)}."""
    proc = subprocess.run(
        [
            str(checkov_executable()),
            "--directory",
            str(INFRA),
            "--framework",
            "bicep",
            "secrets",
            "--skip-download",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        # Offline: no policy download (--skip-download, BC_SKIP_MAPPING) and no check of PyPI
        # for a newer checkov (CKV_SKIP_PACKAGE_UPDATE_CHECK, read when its banner loads).
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true"},
    )
    # Exit code 1 means "failed checks" (reported one by one by the tests); others are crashes.
    assert proc.returncode in (0, 1), f"checkov crashed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout)
    # A list with one report per framework that had something to scan, else one report.
    reports = report if isinstance(report, list) else [report]
    return {r["check_type"]: r for r in reports}


@pytest.fixture(scope="session")
def checkov_report(checkov_reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    assert "bicep" in checkov_reports, f"checkov scanned no Bicep: {list(checkov_reports)}"
    return checkov_reports["bicep"]


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail(
            "systemd-analyze not found: apt-get update && apt-get install -y systemd "
            "(it verifies the forwarder's unit file).",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def systemd_units_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the host's system units, so `verify --root` finds sysinit.target & co."""
    source = Path("/usr/lib/systemd/system")
    if not source.is_dir():
        source = Path("/lib/systemd/system")
    if not source.is_dir():
        pytest.fail("no /usr/lib/systemd/system on this machine: install systemd", pytrace=False)
    target = tmp_path_factory.mktemp("systemd-units") / "system"
    shutil.copytree(source, target, symlinks=True)
    return target
