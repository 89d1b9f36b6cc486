"""Schedule phrases and the arithmetic of their next occurrence.

An agent's scheduled task says *when* in plain words (``every 15 minutes``,
``every weekday at 09:00 in Europe/London``). This module turns a phrase into a typed
``Schedule`` and answers "when is the next run after ``now``?" as an aware UTC datetime.
It is pure — no clock, no I/O — so the beat process, workers and tests all agree on the
same instants.

Grammar (trimmed, runs of spaces collapsed, case-insensitive; zone names keep their case)::

    every N minute(s) | every N hour(s)           no timezone allowed
    every day at HH:MM [in <IANA zone>]
    every weekday at HH:MM [in <IANA zone>]
    every week on monday[,friday...] at HH:MM [in <IANA zone>]

Occurrence rules:

* Intervals are UTC arithmetic. After a ``previous`` run the next one is ``previous`` plus
  the smallest whole number of intervals that lands after ``now`` (downtime is not
  backfilled). Without ``previous`` the grid starts at the Unix epoch, so every process
  computes the same instants (``every 1 hour`` fires on the hour UTC).
* Wall-clock times are read in their zone. A time that does not exist (spring-forward gap)
  fires at the first instant after the gap; a time that happens twice (fall-back overlap)
  fires once, at the earlier instant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Final, Literal, TypeAlias
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from think_jobs.errors import ScheduleError

IntervalUnit: TypeAlias = Literal["minute", "hour"]
WallClockKind: TypeAlias = Literal["day", "weekday", "week"]

DAY_NAMES: Final[tuple[str, ...]] = (
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
)
UNIT_SECONDS: Final[dict[str, int]] = {"minute": 60, "hour": 3600}

_EVERY_DAY: Final[tuple[int, ...]] = (0, 1, 2, 3, 4, 5, 6)
_WEEKDAYS: Final[tuple[int, ...]] = (0, 1, 2, 3, 4)
_DAILY_KINDS: Final[dict[str, tuple[WallClockKind, tuple[int, ...]]]] = {
    "day": ("day", _EVERY_DAY),
    "weekday": ("weekday", _WEEKDAYS),
}
_UNIX_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_SECOND: Final = timedelta(seconds=1)
_SEARCH_DAYS: Final = 9  # the day before "now" (gaps can push it forward) plus a full week

_ZONE_SUFFIX: Final = re.compile(r"(?P<body>.+?) in (?P<zone>\S+)", re.IGNORECASE)
_INTERVAL: Final = re.compile(r"every (?P<count>\S+) (?P<unit>\S+)", re.IGNORECASE)
_DAILY: Final = re.compile(r"every (?P<kind>day|weekday) at (?P<time>\S+)", re.IGNORECASE)
_WEEKLY: Final = re.compile(r"every week on (?P<days>.+?) at (?P<time>\S+)", re.IGNORECASE)
_DIGITS: Final = re.compile(r"[0-9]+")
_CLOCK: Final = re.compile(r"(?P<hour>[0-9]{1,2}):(?P<minute>[0-9]{2})")


@dataclass(frozen=True)
class IntervalSchedule:
    """``every <count> <unit>(s)``: a fixed step of ``every_s`` seconds on the UTC timeline."""

    text: str
    every_s: int
    unit: IntervalUnit
    count: int

    def describe(self) -> str:
        """The canonical phrase, e.g. ``every 5 minutes``."""
        plural = "" if self.count == 1 else "s"
        return f"every {self.count} {self.unit}{plural}"


@dataclass(frozen=True)
class WallClockSchedule:
    """A local ``hour:minute`` on the allowed ``days`` (0=Monday..6=Sunday) in ``timezone``."""

    text: str
    kind: WallClockKind
    hour: int
    minute: int
    days: tuple[int, ...]
    timezone: str

    def describe(self) -> str:
        """The canonical phrase, e.g. ``every week on monday,friday at 09:00 in Europe/London``."""
        at = f"at {self.hour:02d}:{self.minute:02d} in {self.timezone}"
        if self.kind == "week":
            return f"every week on {','.join(DAY_NAMES[day] for day in self.days)} {at}"
        return f"every {self.kind} {at}"


Schedule: TypeAlias = IntervalSchedule | WallClockSchedule


def parse_schedule(
    text: str, *, timezone: str | None = None, default_timezone: str | None = None
) -> Schedule:
    """Parse a schedule phrase; raise ``ScheduleError`` with a message naming what is wrong.

    ``timezone`` is the task's own zone; ``default_timezone`` (the agent's) applies only to
    wall-clock phrases that have neither an ``in <zone>`` suffix nor ``timezone``.
    """
    if not isinstance(text, str):
        raise ScheduleError(f"Unsupported schedule DSL {_quoted(repr(text))}")
    trimmed = text.strip()
    body, suffix_zone = _split_zone_suffix(" ".join(trimmed.split()))
    interval = _match_interval(body, trimmed)
    if interval is not None:
        if suffix_zone is not None or timezone is not None:
            raise ScheduleError("Interval schedules cannot specify a timezone")
        return interval
    kind, hour, minute, days = _parse_wall_clock(body, trimmed)
    zone = _resolve_zone(trimmed, suffix_zone, timezone, default_timezone)
    return WallClockSchedule(trimmed, kind, hour, minute, days, zone)


def next_occurrence(
    schedule: Schedule | str,
    *,
    now: datetime,
    timezone: str | None = None,
    previous: datetime | None = None,
) -> datetime:
    """The first occurrence strictly after ``now`` (and after ``previous``), as aware UTC.

    A ``str`` schedule is parsed with ``parse_schedule(schedule, timezone=timezone)``;
    ``timezone`` is not used when ``schedule`` is already parsed. ``now`` and ``previous``
    must be timezone-aware.
    """
    parsed = parse_schedule(schedule, timezone=timezone) if isinstance(schedule, str) else schedule
    now_utc = _as_utc(now, "now")
    previous_utc = None if previous is None else _as_utc(previous, "previous")
    if isinstance(parsed, IntervalSchedule):
        return _next_interval(parsed, now_utc, previous_utc)
    after = now_utc if previous_utc is None else max(now_utc, previous_utc)
    return _next_wall_clock(parsed, after)


# --- parsing -------------------------------------------------------------------------------


def _quoted(text: str) -> str:
    return f'"{text}"'


def _unsupported(text: str) -> ScheduleError:
    return ScheduleError(f"Unsupported schedule DSL {_quoted(text)}")


def _split_zone_suffix(normal: str) -> tuple[str, str | None]:
    match = _ZONE_SUFFIX.fullmatch(normal)
    if match is None:
        return normal, None
    return match["body"], match["zone"]


def _match_interval(body: str, text: str) -> IntervalSchedule | None:
    match = _INTERVAL.fullmatch(body)
    if match is None:
        return None
    count_text, unit_text = match["count"], match["unit"].lower()
    unit = unit_text.removesuffix("s")
    if not _DIGITS.fullmatch(count_text) or int(count_text) < 1 or unit not in UNIT_SECONDS:
        raise _unsupported(text)
    count = int(count_text)
    _check_unit_number(unit, plural=unit_text != unit, count=count)
    return IntervalSchedule(text, count * UNIT_SECONDS[unit], _interval_unit(unit), count)


def _interval_unit(unit: str) -> IntervalUnit:
    return "minute" if unit == "minute" else "hour"


def _check_unit_number(unit: str, *, plural: bool, count: int) -> None:
    if count == 1 and plural:
        raise ScheduleError(f'Use singular unit "{unit}" for an interval of 1')
    if count != 1 and not plural:
        raise ScheduleError(f'Use plural unit "{unit}s" for an interval of {count}')


def _parse_wall_clock(body: str, text: str) -> tuple[WallClockKind, int, int, tuple[int, ...]]:
    daily = _DAILY.fullmatch(body)
    if daily is not None:
        kind, days = _DAILY_KINDS[daily["kind"].lower()]
        hour, minute = _parse_time(daily["time"], text)
        return kind, hour, minute, days
    weekly = _WEEKLY.fullmatch(body)
    if weekly is not None:
        days = _parse_days(weekly["days"], text)
        hour, minute = _parse_time(weekly["time"], text)
        return "week", hour, minute, days
    raise _unsupported(text)


def _parse_time(token: str, text: str) -> tuple[int, int]:
    match = _CLOCK.fullmatch(token)
    if match is None:
        raise _unsupported(text)
    hour, minute = int(match["hour"]), int(match["minute"])
    if hour > 23 or minute > 59:
        raise ScheduleError(f"Invalid schedule time {_quoted(token)}; expected HH:mm")
    return hour, minute


def _parse_days(days_text: str, text: str) -> tuple[int, ...]:
    days: list[int] = []
    for given in (part.strip() for part in days_text.split(",")):
        if not given:
            raise _unsupported(text)
        day = _day_number(given)
        if day in days:
            raise ScheduleError(f"Duplicate schedule day {_quoted(DAY_NAMES[day])}")
        days.append(day)
    return tuple(sorted(days))


def _day_number(given: str) -> int:
    name = given.lower()
    if name not in DAY_NAMES:
        raise ScheduleError(f"Invalid schedule day {_quoted(given)}")
    return DAY_NAMES.index(name)


def _resolve_zone(
    text: str, suffix_zone: str | None, timezone: str | None, default_timezone: str | None
) -> str:
    for explicit in (suffix_zone, timezone):
        if explicit is not None:
            _load_zone(explicit)
    if suffix_zone is not None and timezone is not None and suffix_zone != timezone:
        raise ScheduleError(
            f"Schedule timezone {_quoted(suffix_zone)} does not match task timezone "
            f"{_quoted(timezone)}"
        )
    chosen = next((z for z in (suffix_zone, timezone, default_timezone) if z is not None), None)
    if chosen is None:
        raise ScheduleError(
            f'Schedule {_quoted(text)} requires a timezone; add " in <IANA zone>" or pass timezone='
        )
    _load_zone(chosen)
    return chosen


def _load_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError) as exc:
        raise ScheduleError(f"Invalid timezone {_quoted(str(name))}") from exc


# --- occurrences ---------------------------------------------------------------------------


def _as_utc(moment: datetime, name: str) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ScheduleError(f"{name} must be timezone-aware, got naive {moment.isoformat()}")
    return moment.astimezone(UTC)


def _next_interval(
    schedule: IntervalSchedule, now_utc: datetime, previous_utc: datetime | None
) -> datetime:
    start = _UNIX_EPOCH if previous_utc is None else previous_utc
    step = timedelta(seconds=schedule.every_s)
    whole_steps = max(0, (now_utc - start) // step) + 1
    return start + whole_steps * step


def _next_wall_clock(schedule: WallClockSchedule, after_utc: datetime) -> datetime:
    zone = _load_zone(schedule.timezone)
    first_day = after_utc.astimezone(zone).date() - timedelta(days=1)
    candidates = (
        _local_instant(day, schedule.hour, schedule.minute, zone)
        for day in (first_day + timedelta(days=n) for n in range(_SEARCH_DAYS))
        if day.weekday() in schedule.days
    )
    return min(instant for instant in candidates if instant > after_utc)


def _local_instant(day: date, hour: int, minute: int, zone: ZoneInfo) -> datetime:
    """``day`` at ``hour:minute`` in ``zone`` as UTC: the earlier instant in an overlap,
    the end of the gap when the wall time does not exist."""
    wall = datetime.combine(day, time(hour, minute))
    instant = wall.replace(tzinfo=zone).astimezone(UTC)  # fold=0: earlier of an overlap
    if instant.astimezone(zone).replace(tzinfo=None) == wall:
        return instant
    # In a gap, fold=1 reads the wall time with the offset after the jump (an instant before
    # it) and fold=0 with the offset before (an instant after it).
    return _transition_between(wall.replace(tzinfo=zone, fold=1).astimezone(UTC), instant, zone)


def _transition_between(before: datetime, after: datetime, zone: ZoneInfo) -> datetime:
    """The first whole second in (before, after] whose UTC offset differs from ``before``'s."""
    offset = before.astimezone(zone).utcoffset()
    while after - before > _ONE_SECOND:
        middle = before + ((after - before) // _ONE_SECOND // 2) * _ONE_SECOND
        if middle.astimezone(zone).utcoffset() == offset:
            before = middle
        else:
            after = middle
    return after


__all__ = [
    "DAY_NAMES",
    "UNIT_SECONDS",
    "IntervalSchedule",
    "IntervalUnit",
    "Schedule",
    "WallClockKind",
    "WallClockSchedule",
    "next_occurrence",
    "parse_schedule",
]
