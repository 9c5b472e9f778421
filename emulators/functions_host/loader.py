"""Find and import the function app, and index it the way the Python worker does.

The worker puts the app's directory first on sys.path, imports function_app.py, finds the
FunctionApp instance among its globals and asks it for its functions; each function reports
its bindings as function.json-style JSON. This module does the same and nothing more.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from azure.functions.decorators.function_app import Function, FunctionRegister

from emulators.functions_host.bindings import FunctionMetadata

DEFAULT_SCRIPT = "function_app.py"


class AppLoadError(Exception):
    """The app could not be found, imported or indexed."""


@dataclass(frozen=True)
class AppLocation:
    """Where the app lives, known before importing it (settings must be applied first)."""

    target: str
    directory: Path
    path: Path | None  # a script path, or None for a module name


@dataclass(frozen=True)
class IndexedFunction:
    metadata: FunctionMetadata
    user_function: Any  # the Python callable the worker would invoke
    directory: Path


def locate(target: str | None, cwd: Path) -> AppLocation:
    """PATH (a .py file or a directory holding function_app.py) or a dotted module name."""
    text = target or DEFAULT_SCRIPT
    candidate = (cwd / text).resolve()
    if candidate.is_dir():
        candidate = candidate / DEFAULT_SCRIPT
    if candidate.suffix == ".py" or "/" in text or candidate.exists():
        if not candidate.is_file():
            raise AppLoadError(f"no function app at {candidate}")
        return AppLocation(target=text, directory=candidate.parent, path=candidate)
    # A module name resolves from the working directory, as `python -m` would.
    if str(cwd) not in sys.path:
        sys.path.insert(0, str(cwd))
    try:
        spec = importlib.util.find_spec(text)
    except (ImportError, ValueError) as exc:
        raise AppLoadError(f"cannot find module {text!r}: {exc}") from exc
    if spec is None or spec.origin is None:
        raise AppLoadError(f"no module named {text!r} (and no file {candidate})")
    return AppLocation(target=text, directory=Path(spec.origin).resolve().parent, path=None)


def import_app(location: AppLocation) -> ModuleType:
    if location.path is None:
        try:
            return importlib.import_module(location.target)
        except Exception as exc:
            raise AppLoadError(f"importing {location.target!r} failed: {exc!r}") from exc
    # Like the worker: the script root goes first on sys.path so the app's own packages
    # (functions/, shared code) import by their plain names.
    root = str(location.directory)
    if root not in sys.path:
        sys.path.insert(0, root)
    name = location.path.stem
    existing = sys.modules.get(name)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == (
        location.path
    ):
        return existing
    spec = importlib.util.spec_from_file_location(name, location.path)
    if spec is None or spec.loader is None:
        raise AppLoadError(f"cannot import {location.path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise AppLoadError(f"importing {location.path} failed: {exc!r}") from exc
    return module


def find_app(module: ModuleType) -> FunctionRegister:
    apps = [v for v in vars(module).values() if isinstance(v, FunctionRegister)]
    unique = list({id(a): a for a in apps}.values())
    if not unique:
        raise AppLoadError(
            f"{module.__name__} defines no azure.functions.FunctionApp (expected `app = "
            "func.FunctionApp()` at module level)"
        )
    if len(unique) > 1:
        raise AppLoadError(f"{module.__name__} defines {len(unique)} FunctionApp objects; keep one")
    return unique[0]


# FunctionApp.get_functions() records the names it validated and refuses a second call as
# "not unique", so each app object is indexed once per process and the result reused.
_indexed: weakref.WeakKeyDictionary[FunctionRegister, list[Function]] = weakref.WeakKeyDictionary()


def index(app: FunctionRegister, directory: Path) -> list[IndexedFunction]:
    if app not in _indexed:
        try:
            _indexed[app] = app.get_functions()
        except Exception as exc:
            raise AppLoadError(f"indexing the function app failed: {exc}") from exc
    result: list[IndexedFunction] = []
    for function in _indexed[app]:
        bindings = tuple(json.loads(raw) for raw in function.get_raw_bindings())
        name = function.get_function_name() or function.get_user_function().__name__
        result.append(
            IndexedFunction(
                metadata=FunctionMetadata(name=name, bindings=bindings),
                user_function=function.get_user_function(),
                directory=directory,
            )
        )
    return result
