"""What each deliverable is made of, read from the project's own files (no build here; the
builds are tried in tests/e2e/test_deliverables.py)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

from tests.support import docs

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
    assert set(vm) == {"forwarder", "approve", "status", "doctor"}
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


# How the deliverables are named wherever a version is written out: the wheel's file name, a
# pinned requirement, the Function App zip. Every one of them in the README's examples and the
# installer's help must be the version being built, or a newcomer copies a stale one.
_VERSIONED_NAMES = re.compile(
    r"scheduled_events_bridge-(?P<wheel>\d+\.\d+\.\d+[^-\s]*)-py3"
    r"|scheduled-events-bridge==(?P<pin>\d+\.\d+\.\d+[^\s`'\"),]*)"
    r"|function-app-(?P<zip>\d+\.\d+\.\d+[^\s`'\"]*?)\.zip"
)


def versions_written_in(text: str) -> list[str]:
    return [next(v for v in m.groups() if v) for m in _VERSIONED_NAMES.finditer(text)]


def test_the_version_pattern_finds_each_kind_of_name() -> None:
    text = (
        "x/scheduled_events_bridge-0.1.0-py3-none-any.whl 'scheduled-events-bridge==0.3.1' "
        "--src dist/function-app-1.2.3.zip, and scheduled-events-bridge==<version>"
    )
    assert versions_written_in(text) == ["0.1.0", "0.3.1", "1.2.3"]


def test_every_version_in_the_readme_and_the_installer_is_the_packages() -> None:
    version = PYPROJECT["project"]["version"]
    assert LOCAL["project"]["version"] == version, "the local tools carry the same version"
    for path in (*docs.pages(), REPO / "infra" / "scripts" / "install-forwarder.sh"):
        written = versions_written_in(path.read_text())
        stale = sorted(set(written) - {version})
        assert not stale, f"{path.name} names version(s) {stale}; the package is {version}"
    assert version in versions_written_in((REPO / "README.md").read_text())
