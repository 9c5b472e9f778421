"""The observability package's errors, in a module of their own: telemetry (which wires the
metrics in) and metrics (which raises them) both import it, and neither imports the other at
the top (tests/unit/test_import_cycles.py)."""

from __future__ import annotations


class MetricsError(ValueError):
    """The metrics endpoint cannot be served (the port is taken, the address is wrong)."""
