"""No module of the demo imports one that imports it back, at the top or inside a function
(emulators/demo.py and emulators/demo_hooks.py did: the vm-side scenario imported the demo's
stack, and the demo's command line imported the vm-side scenario)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(module: str) -> set[str]:
    """The project modules ``module`` imports, anywhere in its source (a function's lazy import
    closes a circle as surely as a top-level one)."""
    path = module_file(module)
    assert path is not None, module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        found |= {n for n in names if module_file(n) is not None and n != module}
    return found


def cycles(prefix: str) -> list[list[str]]:
    """Every circle among the modules whose names start with ``prefix`` (``emulators.demo``:
    the package and, before it was one, demo_hooks.py and its siblings)."""
    parent = REPO.joinpath(*prefix.split(".")[:-1])
    files = [  # os.walk follows links: sebridge/forwarder is a link to forwarder/
        Path(top, name)
        for top, _, names in os.walk(parent, followlinks=True)
        for name in names
        if name.endswith(".py")
    ]
    names = (
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for p in files
    )
    modules = sorted(n for n in names if n.startswith(prefix))
    graph = {m: {i for i in imports_of(m) if i.startswith(prefix)} for m in modules}
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in modules:
        if module not in state:
            visit(module, [module])
    return found


def test_the_demo_modules_import_each_other_in_one_direction() -> None:
    assert cycles("emulators.demo") == []


def test_the_forwarder_modules_import_each_other_in_one_direction() -> None:
    """forwarder.observability.metrics imported MetricsError from telemetry, which imports
    metrics (lazily, only with --metrics-port): the error lives in observability.errors."""
    found = cycles("sebridge.forwarder")
    assert found == []


def test_the_check_finds_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "circle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from circle import b\n")
    (package / "b.py").write_text("from circle.a import f\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["REPO"]), "REPO", tmp_path)
    assert cycles("circle") == [["circle.a", "circle.b", "circle.a"]]
