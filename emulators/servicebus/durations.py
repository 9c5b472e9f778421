"""ISO 8601 durations as they appear in the emulator's Config.json (PT1M, P1D, P7D, PT1H30M).

Only the day-time subset is accepted: years and months have no fixed length, so a config that
uses them would be honoured differently here than by Azure; it is refused instead.
"""

from __future__ import annotations

import re

_DURATION = re.compile(
    r"^P(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


class DurationError(ValueError):
    """A duration string that is not ISO 8601 day-time (PnW, PnD, PTnH, PTnM, PTnS)."""


def parse_duration(text: str) -> float:
    """Return the duration in seconds; raise DurationError on anything else."""
    if not isinstance(text, str):
        raise DurationError(f"expected an ISO 8601 duration string, got {text!r}")
    match = _DURATION.match(text.strip())
    if not match or text.strip() in {"P", "PT"} or text.strip().endswith("T"):
        raise DurationError(f"not an ISO 8601 day-time duration: {text!r} (examples: PT1M, P1D)")
    parts = {k: float(v) if v else 0.0 for k, v in match.groupdict().items()}
    return (
        parts["weeks"] * 7 * 86400
        + parts["days"] * 86400
        + parts["hours"] * 3600
        + parts["minutes"] * 60
        + parts["seconds"]
    )
