"""Tests that need root (root-owned hooks files, tmpfs mounts, useradd --root) skip elsewhere
with a reason that starts with :data:`NEEDS_ROOT`; under ``CI=true`` such a skip fails the run
(tests/conftest.py), so CI can never pass without them."""

from __future__ import annotations

import os

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
