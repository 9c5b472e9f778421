"""The range of times the bridge reads, and arithmetic on them that never overflows (pure).

Python's ``datetime`` stops at years 1 and 9999: ``NotBefore - lead`` of a NotBefore in year 1,
or ``NotBefore + duration`` of one in year 9999, raises :class:`OverflowError` wherever it is
computed. So the one rule is applied where times are *read* (an IMDS NotBefore,
:func:`sebridge.imds.parse_not_before`; a message's ``time``,
:func:`sebridge.contract.cloudevents.parse_time`): a time outside :data:`EARLIEST` ..
:data:`LATEST` is not a time the bridge can act on and reads as unreadable (a NotBefore as
``None``: "at first sight"; a message's ``time`` as none, named in its warnings). Every time
that passes the rule leaves centuries of room on both sides for the leads, durations, margins
and windows added to it (each at most days), and :func:`shifted` is the arithmetic for a
caller that adds something larger or of unknown size: it saturates at the range's ends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)  # no IMDS or message time is older
LATEST = datetime(9000, 1, 1, tzinfo=UTC)  # 999 years short of datetime.max
# The largest span read from a document (a DurationInSeconds): a year, far above any real one.
MAX_SPAN_SECONDS = 366 * 86_400


def readable(moment: datetime) -> datetime | None:
    """``moment`` in UTC when it is within :data:`EARLIEST` .. :data:`LATEST` (a naive one is
    taken as UTC), else None."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:
        return None
    return moment if EARLIEST <= moment <= LATEST else None


def clamp(moment: datetime) -> datetime:
    """``moment`` in UTC, held to :data:`EARLIEST` .. :data:`LATEST`."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:
        return EARLIEST if moment.year < 5000 else LATEST
    return min(max(moment, EARLIEST), LATEST)


def shifted(moment: datetime, seconds: float | timedelta) -> datetime:
    """``moment + seconds`` held to :data:`EARLIEST` .. :data:`LATEST` (never raises)."""
    if isinstance(seconds, timedelta):
        delta = seconds
    elif seconds != seconds:  # NaN: no shift
        return clamp(moment)
    else:
        try:
            delta = timedelta(seconds=seconds)
        except OverflowError:  # more days than a timedelta holds
            return LATEST if seconds > 0 else EARLIEST
    try:
        return clamp(clamp(moment) + delta)
    except OverflowError:
        return EARLIEST if delta < timedelta(0) else LATEST
