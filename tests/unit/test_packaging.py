"""The deployment package: what the Function App installs and ships."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_requirements_txt_matches_the_runtime_dependencies() -> None:
    """Functions deploys from requirements.txt; pyproject.toml is what everything else uses."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = (REPO / "requirements.txt").read_text().splitlines()
    shipped = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert sorted(shipped) == sorted(declared)


def test_funcignore_keeps_local_and_test_code_out_of_the_package() -> None:
    ignored = set((REPO / ".funcignore").read_text().split())
    for path in (
        "tests/",
        "infra/",
        "emulators/",
        "forwarder/",
        "benchmarks/",
        ".venv*",
        "local.settings.json",
        ".ci/",
    ):
        assert path in ignored, path
    # ...but never what the app imports.
    for package in ("functions/", "sebridge/"):
        assert package not in ignored
