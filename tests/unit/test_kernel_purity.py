"""The pure layers import only the standard library and do no I/O (STYLE.md: pure core).

Two checks, both on the real source:
- static: every ``import`` in a pure module, followed through the project modules it imports,
  names a standard-library module that is not an I/O or SDK module, or another pure module;
- at run time: the pure modules import in a fresh interpreter in which every Azure package and
  ``requests`` are made unimportable.
The checker itself is shown to catch a deliberate SDK import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The kernel, the forwarder's core and the workflows' cores.
PURE_MODULES = (
    "sebridge.imds",
    "sebridge.lifecycle",
    "sebridge.retry",
    "sebridge.values",
    "sebridge.text",
    "sebridge.impact",
    "sebridge.timing",
    "sebridge.contract.cloudevents",
    "sebridge.contract.events",
    "sebridge.contract.commands",
    "sebridge.forwarder.imds.diff",
    "sebridge.forwarder.approvals.decision",
    "sebridge.forwarder.observability.health",
    "functions.shared.impact",
    "functions.shared.ports",
    "functions.shared.vms",
    "functions.approval_gate.policy",
    "functions.approval_gate.tokens",
    "functions.approval_gate.core",
    "functions.lb_pools.nic_pools",
    "functions.lb_pools.core",
    "functions.teams.cards",
    "functions.teams.core",
    "functions.history.core",
    "functions.history.calendar",
    "functions.history.endpoints",
)
# Standard-library modules that reach outside the process (or start threads to do so).
IO_MODULES = frozenset(
    {
        "asyncio",
        "ftplib",
        "http.client",
        "http.server",
        "multiprocessing",
        "os",
        "pathlib",
        "selectors",
        "shutil",
        "signal",
        "smtplib",
        "socket",
        "socketserver",
        "sqlite3",
        "ssl",
        "subprocess",
        "tempfile",
        "threading",
        "urllib.request",
        "xmlrpc",
    }
)


def module_path(name: str, root: Path = REPO) -> Path | None:
    """The source file of a project module (``None`` when it is not one of ours)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(path: Path, module: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{node.module}" if node.module else parent
            else:
                base = node.module or ""
            names.append(base)
            # `from package import module` imports a module too
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def impurities(modules: tuple[str, ...], root: Path = REPO) -> list[str]:
    """Every import, direct or through other project modules, that breaks purity."""
    problems: list[str] = []
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_path(module, root)
        if path is None:
            continue
        for name in _imported_names(path, module):
            top = name.split(".")[0]
            if module_path(name, root) is not None:
                if name.split(".")[0] in {"sebridge", "functions"}:
                    todo.append(name)
                continue
            does_io = any(name == io or name.startswith(io + ".") for io in IO_MODULES)
            if top == "__future__" or (top in sys.stdlib_module_names and not does_io):
                continue
            if module_path(top, root) is not None:
                continue  # `from functions.x import name`: the name is not a module
            problems.append(f"{module} imports {name}")
    return sorted(set(problems))


def test_the_pure_layers_import_only_pure_standard_library_modules() -> None:
    assert impurities(PURE_MODULES) == []


def test_the_checker_catches_a_deliberate_sdk_import(tmp_path: Path) -> None:
    package = tmp_path / "sebridge"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "kernel.py").write_text("from sebridge import helper\n")
    (package / "helper.py").write_text("import json\nimport azure.servicebus\nimport socket\n")
    assert impurities(("sebridge.kernel",), tmp_path) == [
        "sebridge.helper imports azure.servicebus",
        "sebridge.helper imports socket",
    ]


def test_the_pure_layers_import_without_any_azure_package_or_requests() -> None:
    script = textwrap.dedent(
        f"""
        import importlib, sys
        for blocked in ("azure", "requests", "urllib3", "azure.functions", "azure.servicebus",
                        "azure.identity", "azure.core"):
            sys.modules[blocked] = None  # import raises ImportError
        for name in {list(PURE_MODULES)!r}:
            importlib.import_module(name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("azure", "requests")
                        and sys.modules[m] is not None)
        print("leaked:", leaked)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "leaked: []"


@pytest.mark.parametrize("module", PURE_MODULES)
def test_every_listed_module_exists(module: str) -> None:
    assert module_path(module) is not None, module
