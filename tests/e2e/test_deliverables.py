"""The two deliverables, built as `make dist` builds them and installed as Azure and the VM
installer install them: each into an empty virtual environment holding only what it declares.

- The VM wheel: only ``sebridge`` lands in site-packages, with no Functions runtime, and its
  ``sebridge forwarder --once --dry-run`` reads the IMDS simulator and prints the transitions.
- The Function App zip: unpacked into a directory, with only ``requirements.txt`` installed,
  ``function_app`` imports and registers its functions.

Dependencies come from the package index (the pip cache keeps this fast after the first run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators.imds.testing import running_simulator

REPO = Path(__file__).resolve().parents[2]

# Nothing of the checkout may leak into the fresh environments.
CLEAN_ENV = {
    k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
}


VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
APP_ZIP = f"function-app-{VERSION}.zip"
WHEEL = f"scheduled_events_bridge-{VERSION}-py3-none-any.whl"


def pip_install(python: Path, *what: str) -> None:
    """``pip install`` into the environment of ``python``, by this checkout's pip (pip
    --python): the environments are made without pip of their own, which saves pip's own
    installation (7 s of CPU each) and leaves in them only what the deliverable declares."""
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    subprocess.run(
        [*pip, "--disable-pip-version-check", "--no-input", *what],
        check=True,
        timeout=600,
        env=CLEAN_ENV,
        cwd="/",
    )


# What an earlier `make dist` left in dist/: a rollback deploys it by name, so it must stay.
EARLIER = {"function-app-0.0.1.zip": b"earlier app", "function-app.zip": b"unversioned app"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    for name, content in EARLIER.items():
        (out / name).write_bytes(content)
    (out / APP_ZIP).write_bytes(b"a stale build of this version")
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build-dist"), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=240,
    )
    return out


def test_dist_names_the_app_zip_by_version_and_keeps_earlier_builds(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == sorted([*EARLIER, APP_ZIP, WHEEL])
    for name, content in EARLIER.items():
        assert (dist / name).read_bytes() == content
    with zipfile.ZipFile(dist / APP_ZIP) as archive:  # this version was rebuilt
        assert "function_app.py" in archive.namelist()


def _venv(path: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120
    )
    return path / "bin" / "python"


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=CLEAN_ENV,
    )
    return Path(out.stdout.strip())


def _in_vm_env(program: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``program`` of the VM package's environment, run from / with only the clean environment."""
    return subprocess.run(
        [str(program), *args], capture_output=True, text=True, timeout=60, env=CLEAN_ENV, cwd="/"
    )


@pytest.fixture(scope="module")
def vm_python(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    python = _venv(tmp_path_factory.mktemp("vm") / "venv")
    wheel = dist / WHEEL
    pip_install(python, str(wheel))
    yield python


@pytest.mark.slow
def test_the_vm_wheel_puts_only_sebridge_into_site_packages(dist: Path) -> None:
    wheel = dist / WHEEL
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        top_level = archive.read(info.replace("METADATA", "top_level.txt")).decode().split()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert top_level == ["sebridge"]
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"sebridge"}
    assert "sebridge/forwarder/main.py" in names and "sebridge/imds.py" in names
    requires = sorted(
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    )
    assert [r.split(">")[0] for r in requires] == [
        "azure-identity",
        "azure-servicebus",
        "prometheus-client",
        "websocket-client",
    ]
    assert not [r for r in requires if "azure-functions" in r]
    assert "[sebridge.commands]" in entry_points and "emulators" not in entry_points
    # The MIT license travels with the package (setuptools puts it under the dist-info).
    licence = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(licence) == (REPO / "LICENSE").read_bytes()
    assert "License-Expression: MIT" in metadata


@pytest.mark.slow
def test_the_installed_vm_package_has_no_functions_runtime_nor_local_tools(
    vm_python: Path,
) -> None:
    site = _site_packages(vm_python)
    installed = {p.name for p in site.iterdir()}
    assert "sebridge" in installed
    assert not installed & {"forwarder", "functions", "emulators", "proton", "function_app.py"}
    assert not (site / "azure" / "functions").exists()
    listing = _in_vm_env(vm_python.parent / "sebridge", "--help")
    assert listing.returncode == 0, listing.stderr
    commands = {line.split()[0] for line in listing.stdout.splitlines() if line.startswith("  ")}
    assert commands == {"forwarder", "approve", "status", "doctor"}
    # --servicebus-transport websocket works with the VM package alone (websocket-client).
    websocket = _in_vm_env(
        vm_python,
        "-c",
        "from sebridge.servicebus import check_transport; check_transport('websocket')",
    )
    assert websocket.returncode == 0, websocket.stderr


@pytest.mark.timeout(120)
def test_the_installed_forwarder_reads_the_simulator_once_in_dry_run(
    vm_python: Path, tmp_path: Path
) -> None:
    with running_simulator("redeploy", speed=1.0) as sim:
        proc = _in_vm_env(
            vm_python.parent / "sebridge",
            "forwarder",
            "--once",
            "--dry-run",
            "--imds-endpoint",
            sim.base_url,
            "--state-dir",
            str(tmp_path / "state"),
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    messages = [json.loads(line) for line in proc.stdout.splitlines()]
    assert sorted(m["subject"] for m in messages) == ["Heartbeat", "Scheduled"]
    (message,) = [m for m in messages if m["subject"] == "Scheduled"]
    assert message["subject"] == "Scheduled"
    assert message["body"]["data"]["EventType"] == "Redeploy"
    assert message["message_id"].endswith(":Scheduled:1")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_function_app_zip_imports_with_requirements_txt_alone(
    dist: Path, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    with zipfile.ZipFile(dist / APP_ZIP) as archive:
        archive.extractall(app)
    python = _venv(tmp_path / "venv")
    pip_install(python, "-r", str(app / "requirements.txt"))
    settings = {
        "ServiceBusConnection__fullyQualifiedNamespace": "sb-example.servicebus.windows.net",
        "TopicName": "scheduled-events",
        "TeamsSubscriptionName": "teams",
        "LbPoolsSubscriptionName": "lb-pools",
        "ApprovalGateSubscriptionName": "approval-gate",
        "ApprovalsQueueName": "approvals",
        "TEAMS_WEBHOOK_URL": "https://example.invalid/hook",
        "APPROVAL_SIGNING_KEY": "k" * 48,
        "WEBSITE_HOSTNAME": "app.example.invalid",
        # Always set in Azure (identity-based host storage); the pool locks default to it.
        "AzureWebJobsStorage__accountName": "stexample",
    }
    script = (
        "import function_app, json; "
        "print(json.dumps(sorted(f.get_function_name() for f in function_app.app.get_functions())))"
    )
    proc = subprocess.run(
        [str(python), "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=app,
        env={**CLEAN_ENV, **settings},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == sorted(
        ["teams", "lb_pools", "approval_gate", "approve"]
    )
    # The app's environment holds the runtime, and nothing of the VM package or local tools.
    site = _site_packages(python)
    assert (site / "azure" / "functions").is_dir()
    assert not {p.name for p in site.iterdir()} & {"sebridge", "emulators", "proton"}
