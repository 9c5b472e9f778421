"""What each deliverable is made of, read from the project's own files (no build here; the
builds are tried in tests/e2e/test_deliverables.py)."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCAL = tomllib.loads((REPO / "emulators" / "pyproject.toml").read_text())


def _load_build_dist():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_loader(
        "build_dist",
        importlib.machinery.SourceFileLoader("build_dist", str(REPO / "scripts" / "build-dist")),
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for r in requirements}


def test_the_vm_package_depends_on_the_servicebus_sdk_and_identity_only() -> None:
    # ... and prometheus-client for --metrics-port (issue 14; imported only when it is on),
    # websocket-client for --servicebus-transport websocket (imported only then).
    assert _names(PYPROJECT["project"]["dependencies"]) == {
        "azure-servicebus",
        "azure-identity",
        "prometheus-client",
        "websocket-client",
    }
    assert "optional-dependencies" not in PYPROJECT["project"]


def test_the_vm_package_is_sebridge_alone_with_forwarder_mapped_into_it() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert {p.split(".")[0] for p in setuptools["packages"]} == {"sebridge"}
    assert setuptools["package-dir"] == {"sebridge.forwarder": "forwarder"}
    # In a checkout the same import name reaches the same files.
    link = REPO / "sebridge" / "forwarder"
    assert link.is_symlink() and link.resolve() == (REPO / "forwarder").resolve()


def test_subcommands_are_registered_by_the_distribution_that_ships_them() -> None:
    vm = PYPROJECT["project"]["entry-points"]["sebridge.commands"]
    local = LOCAL["project"]["entry-points"]["sebridge.commands"]
    assert set(vm) == {"forwarder", "approve", "status"}
    assert set(local) == {"demo", "imds-sim", "servicebus-emulator", "functions-host", "fakes"}
    assert all(target.startswith("sebridge.forwarder:") for target in vm.values())
    assert all(target.startswith("emulators:") for target in local.values())
    cli = (REPO / "sebridge" / "cli.py").read_text()
    assert "emulators" not in cli.replace("emulators/", "")  # the kernel's CLI knows none


def test_requirements_txt_is_the_function_apps_dependency_list() -> None:
    """Azure reads requirements.txt only: the runtime plus what the kernel's adapter and the
    workflows import; nothing of the local tools or the test tools."""
    lines = (REPO / "requirements.txt").read_text().splitlines()
    shipped = _names([line for line in lines if line.strip() and not line.startswith("#")])
    assert shipped >= {"azure-functions", "azure-servicebus", "azure-identity", "requests"}
    assert not shipped & {"python-qpid-proton", "pytest", "hypothesis", "mypy", "ruff"}


def test_the_function_app_zip_holds_the_app_and_the_kernel_but_no_forwarder() -> None:
    build_dist = _load_build_dist()
    names = [name for _, name in build_dist.app_members()]
    assert {"function_app.py", "host.json", "requirements.txt"} <= set(names)
    assert any(n.startswith("functions/teams/") for n in names)
    assert "sebridge/contract/schemas/scheduled-event-data.v1.json" in names
    assert not [n for n in names if n.startswith(("sebridge/forwarder", "forwarder/"))]
    assert not [n for n in names if n.startswith(("emulators/", "tests/", "infra/"))]


def test_funcignore_keeps_local_and_test_code_out_of_the_package() -> None:
    ignored = set((REPO / ".funcignore").read_text().split())
    for path in (
        "tests/",
        "infra/",
        "emulators/",
        "forwarder/",
        "sebridge/forwarder",
        "benchmarks/",
        ".venv*",
        "local.settings.json",
        ".ci/",
        "dist/",
    ):
        assert path in ignored, path
    # ...but never what the app imports.
    for package in ("functions/", "sebridge/"):
        assert package not in ignored
