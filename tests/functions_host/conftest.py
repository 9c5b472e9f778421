"""Shared fixtures for the functions-host tests."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
APPS = HERE / "apps"

# The test apps import each other as `apps.<module>`; make that work however pytest was started.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
