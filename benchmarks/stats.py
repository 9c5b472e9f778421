"""What every benchmark here reports: nearest-rank percentiles and one summary line."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """The value at rank ``q`` percent of ``values`` (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    """Seconds as one line in milliseconds: p50, p95, p99, max and mean."""
    ms = [v * 1000 for v in values]
    return (
        f"p50 {percentile(ms, 50):.0f} ms, p95 {percentile(ms, 95):.0f} ms, "
        f"p99 {percentile(ms, 99):.0f} ms, max {max(ms):.0f} ms, mean {statistics.mean(ms):.0f} ms"
    )
