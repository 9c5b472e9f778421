"""Tests that need root (root-owned hooks files, tmpfs mounts, useradd --root) skip elsewhere
with a reason that starts with :data:`NEEDS_ROOT`; under ``CI=true`` such a skip fails the run
(tests/conftest.py), so CI can never pass without them."""

from __future__ import annotations

import ast
import os
import re

import pytest

NEEDS_ROOT = "needs root"


def is_root() -> bool:
    return os.geteuid() == 0


def requires_root(why: str) -> pytest.MarkDecorator:
    """``@requires_root("a hooks file must be root-owned")``: skip unless root."""
    return pytest.mark.skipif(not is_root(), reason=f"{NEEDS_ROOT}: {why}")


def skip_unless_root(why: str) -> None:
    """The same inside a test or fixture."""
    if not is_root():
        pytest.skip(f"{NEEDS_ROOT}: {why}")


def skip_needing_root(why: str) -> None:
    """Skip for a reason only root (with its capabilities) could remove: a failed mount."""
    pytest.skip(f"{NEEDS_ROOT}: {why}")


# -- the rule, checked over the suite (tests/unit/test_suite_rules.py) -------------------------

_ROOT_WORDS = re.compile(r"\broot\b|uid\b|geteuid|is_root", re.IGNORECASE)
_IDENTITY = re.compile(r"\bget(e)?uid\b|\bis_root\b")


def _says_needs_root(reason: ast.expr | None) -> bool:
    """Whether a skip's reason is NEEDS_ROOT-prefixed: f"{NEEDS_ROOT}: ..." or "needs root..."."""
    if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
        return reason.value.startswith(NEEDS_ROOT)
    if isinstance(reason, ast.JoinedStr) and reason.values:
        first = reason.values[0]
        if isinstance(first, ast.FormattedValue):
            return isinstance(first.value, ast.Name) and first.value.id == "NEEDS_ROOT"
        return _says_needs_root(first)
    return False


def _skip_reason(call: ast.Call) -> tuple[str, ast.expr | None] | None:
    """(kind, reason) of a ``pytest.skip(...)``/``...skipif(...)`` call, else None."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    keywords = {k.arg: k.value for k in call.keywords}
    if name == "skip":
        return name, call.args[0] if call.args else keywords.get("reason", keywords.get("msg"))
    if name == "skipif":
        return name, keywords.get("reason")
    return None


def root_rule_violations(source: str, path: str) -> list[str]:
    """Where a test in ``source`` could skip or pass for want of root without saying
    NEEDS_ROOT (so that CI=true would not fail it): a ``skip``/``skipif`` about root, uid or
    geteuid whose reason does not start with NEEDS_ROOT, or an ``if`` on the process's uid
    (a test that drops its root-only assertions as non-root). Use :func:`requires_root`,
    :func:`skip_unless_root` or :func:`skip_needing_root`, and give the root part its own
    test."""
    if not _ROOT_WORDS.search(source):  # _IDENTITY's words are among them
        return []  # two files in three: no need to parse them
    out = []
    # ast.unparse, not ast.get_source_segment: that one splits the whole source at every call
    # (4.5 s of make check for the suite's 240 files).
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Call) and (found := _skip_reason(node)) is not None:
            kind, reason = found
            if _ROOT_WORDS.search(ast.unparse(node)) and not _says_needs_root(reason):
                out.append(f"{path}:{node.lineno}: {kind} about root without NEEDS_ROOT")
        elif isinstance(node, ast.If) and _IDENTITY.search(ast.unparse(node.test)):
            out.append(f"{path}:{node.lineno}: branches on the uid (use skip_unless_root)")

    return sorted(out, key=lambda line: int(line.split(":")[1]))
