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


def clamp(moment: datetime, earliest: datetime = EARLIEST, latest: datetime = LATEST) -> datetime:
    """``moment`` in UTC (a naive one is taken as UTC), held to ``earliest`` .. ``latest`` (by
    default the bridge's range; a store with a range of its own passes that)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:
        return earliest if moment.year < 5000 else latest
    return min(max(moment, earliest), latest)


def shifted(
    moment: datetime,
    seconds: float | timedelta,
    earliest: datetime = EARLIEST,
    latest: datetime = LATEST,
) -> datetime:
    """``moment + seconds`` held to ``earliest`` .. ``latest`` (never raises)."""
    if isinstance(seconds, timedelta):
        delta = seconds
    elif seconds != seconds:  # NaN: no shift
        return clamp(moment, earliest, latest)
    else:
        try:
            delta = timedelta(seconds=seconds)
        except OverflowError:  # more days than a timedelta holds
            return latest if seconds > 0 else earliest
    try:
        return clamp(clamp(moment, earliest, latest) + delta, earliest, latest)
    except OverflowError:
        return earliest if delta < timedelta(0) else latest


def parse_iso(value: object) -> datetime | None:
    """A time as the bridge writes it: ISO 8601 text with ``Z`` or an offset (at most 64
    characters), or an aware datetime (what a store's SDK returns); not yet converted nor
    range-checked. None for anything else, a time without a zone among them (the bridge never
    writes one, so its zone would be a guess). Callers then apply a range: :func:`stored`, or
    :func:`clamp` with a store's own."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and 0 < len(value) <= 64:
        try:
            moment = datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return moment if moment.tzinfo is not None else None


def stored(value: object) -> datetime | None:
    """The one reader of a time read back from the bridge's own records and files (a state or
    status file, a blob, a table row): in UTC and within the bridge's range, else None. Text
    that is not a time, a time without a zone or a far-off one (a damaged record) never reaches
    a comparison with an aware ``now``, where it would raise."""
    moment = parse_iso(value)
    return readable(moment) if moment is not None else None
