"""Schedule phrases, their error messages, and next-occurrence arithmetic across DST."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from think_jobs.errors import ScheduleError
from think_jobs.scheduling import (
    IntervalSchedule,
    Schedule,
    WallClockSchedule,
    next_occurrence,
    parse_schedule,
)

LONDON = "Europe/London"
NEW_YORK = "America/New_York"
LORD_HOWE = "Australia/Lord_Howe"
SANTIAGO = "America/Santiago"


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def occurrences(schedule: str | Schedule, *, now: datetime, count: int) -> list[datetime]:
    """``count`` successive runs, each computed from the one before as ``previous``."""
    runs: list[datetime] = []
    previous: datetime | None = None
    for _ in range(count):
        previous = next_occurrence(schedule, now=now, previous=previous)
        runs.append(previous)
        now = previous
    return runs


def schedule_error(text: str, **kwargs: Any) -> str:
    with pytest.raises(ScheduleError) as info:
        parse_schedule(text, **kwargs)
    assert isinstance(info.value, ValueError)
    return str(info.value)


# --- accepted phrases ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "every_s", "unit", "count", "canonical"),
    [
        ("every 1 minute", 60, "minute", 1, "every 1 minute"),
        ("every 5 minutes", 300, "minute", 5, "every 5 minutes"),
        ("every 1 hour", 3600, "hour", 1, "every 1 hour"),
        ("every 2 hours", 7200, "hour", 2, "every 2 hours"),
        ("every 90 minutes", 5400, "minute", 90, "every 90 minutes"),
        ("every 05 minutes", 300, "minute", 5, "every 5 minutes"),
        ("EVERY 15 MINUTES", 900, "minute", 15, "every 15 minutes"),
        ("  Every   3\tHours \n", 10800, "hour", 3, "every 3 hours"),
    ],
)
def test_interval_phrases(text: str, every_s: int, unit: str, count: int, canonical: str) -> None:
    schedule = parse_schedule(text)
    assert schedule == IntervalSchedule(text.strip(), every_s, unit, count)  # type: ignore[arg-type]
    assert schedule.describe() == canonical


def test_interval_ignores_default_timezone() -> None:
    schedule = parse_schedule("every 5 minutes", default_timezone=LONDON)
    assert isinstance(schedule, IntervalSchedule)


@pytest.mark.parametrize(
    ("text", "kwargs", "kind", "hour", "minute", "days", "zone"),
    [
        ("every day at 09:00 in Europe/London", {}, "day", 9, 0, (0, 1, 2, 3, 4, 5, 6), LONDON),
        ("every day at 9:05", {"timezone": "UTC"}, "day", 9, 5, (0, 1, 2, 3, 4, 5, 6), "UTC"),
        ("every day at 00:00", {"default_timezone": "Asia/Tokyo"}, "day", 0, 0, None, None),
        ("every weekday at 23:59 in Asia/Tokyo", {}, "weekday", 23, 59, (0, 1, 2, 3, 4), None),
        ("EVERY WEEKDAY AT 07:30 IN Europe/London", {}, "weekday", 7, 30, None, LONDON),
        ("every week on monday at 08:00 in UTC", {}, "week", 8, 0, (0,), "UTC"),
        ("every week on friday,monday at 08:00 in UTC", {}, "week", 8, 0, (0, 4), "UTC"),
        ("every week on Monday, Friday at 08:00 in UTC", {}, "week", 8, 0, (0, 4), "UTC"),
        ("every week on sunday ,  saturday at 08:00 in UTC", {}, "week", 8, 0, (5, 6), "UTC"),
        ("  every  week  on  tuesday,wednesday,thursday  at  8:00  ", {"timezone": "UTC"},
         "week", 8, 0, (1, 2, 3), "UTC"),
        ("every day at 09:00 in Europe/London", {"timezone": LONDON}, "day", 9, 0, None, LONDON),
        ("every day at 09:00 in Europe/London", {"default_timezone": "UTC"}, "day", 9, 0, None,
         LONDON),
        ("every day at 09:00", {"timezone": LONDON, "default_timezone": "UTC"}, "day", 9, 0,
         None, LONDON),
    ],
)  # fmt: skip
def test_wall_clock_phrases(
    text: str,
    kwargs: dict[str, str],
    kind: str,
    hour: int,
    minute: int,
    days: tuple[int, ...] | None,
    zone: str | None,
) -> None:
    schedule = parse_schedule(text, **kwargs)
    assert isinstance(schedule, WallClockSchedule)
    assert (schedule.text, schedule.kind, schedule.hour, schedule.minute) == (
        text.strip(),
        kind,
        hour,
        minute,
    )
    if days is not None:
        assert schedule.days == days
    expected_zone = zone or kwargs.get("timezone") or kwargs.get("default_timezone")
    if expected_zone is None:
        expected_zone = text.rsplit(" in ", 1)[1]
    assert schedule.timezone == expected_zone


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("Every Day At 9:00 in Europe/London", "every day at 09:00 in Europe/London"),
        ("every weekday at 07:05 in UTC", "every weekday at 07:05 in UTC"),
        (
            "every week on friday, Monday at 9:00 in Europe/London",
            "every week on monday,friday at 09:00 in Europe/London",
        ),
    ],
)
def test_describe_is_canonical_and_parses_back(text: str, canonical: str) -> None:
    schedule = parse_schedule(text)
    assert schedule.describe() == canonical
    again = parse_schedule(canonical)
    assert again.describe() == canonical
    assert again == WallClockSchedule(canonical, *_fields_after_text(schedule))


def _fields_after_text(schedule: Schedule) -> tuple[Any, ...]:
    assert isinstance(schedule, WallClockSchedule)
    return schedule.kind, schedule.hour, schedule.minute, schedule.days, schedule.timezone


# --- error messages ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "hourly",
        "every",
        "every minute",
        "every 0 minutes",
        "every -1 minutes",
        "every 1.5 hours",
        "every five minutes",
        "every 5 seconds",
        "every 5 days",
        "every 2 weeks",
        "every 5 mins",
        "every 5 minutess",
        "every day",
        "every day at",
        "every day at 9am",
        "every day at 9",
        "every day at 09:0",
        "every day at 009:00",
        "every day at 09:00:00",
        "every day at noon",
        "every day 09:00",
        "every weekend at 09:00",
        "every week at 09:00",
        "every week on at 09:00",
        "every week on monday",
        "every week on monday,,friday at 09:00",
        "every week on monday, at 09:00",
        "every day at 09:00 in",
        "every day at 09:00 in Europe/London please",
        "at 09:00 every day",
        "every \uff11 minute",
    ],
)
def test_unsupported_phrases(text: str) -> None:
    assert schedule_error(text, timezone="UTC") == f'Unsupported schedule DSL "{text.strip()}"'


def test_unsupported_keeps_the_trimmed_original_text() -> None:
    assert (
        schedule_error("  Every  FIVE minutes ") == 'Unsupported schedule DSL "Every  FIVE minutes"'
    )


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("every day at 25:00", "25:00"),
        ("every day at 24:00", "24:00"),
        ("every weekday at 12:60", "12:60"),
        ("every week on monday at 99:99", "99:99"),
        ("every day at 7:75 in Europe/London", "7:75"),
    ],
)
def test_invalid_time(text: str, token: str) -> None:
    expected = f'Invalid schedule time "{token}"; expected HH:mm'
    assert schedule_error(text, timezone="UTC") == expected


@pytest.mark.parametrize(
    "text", ["every day at 09:00", "every weekday at 9:00", "every week on monday at 09:00"]
)
def test_wall_clock_requires_a_timezone(text: str) -> None:
    expected = f'Schedule "{text}" requires a timezone; add " in <IANA zone>" or pass timezone='
    assert schedule_error(f"  {text} ") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("every 1 minutes", 'Use singular unit "minute" for an interval of 1'),
        ("every 1 hours", 'Use singular unit "hour" for an interval of 1'),
        ("every 01 Hours", 'Use singular unit "hour" for an interval of 1'),
        ("every 5 minute", 'Use plural unit "minutes" for an interval of 5'),
        ("every 2 hour", 'Use plural unit "hours" for an interval of 2'),
        ("every 30 MINUTE", 'Use plural unit "minutes" for an interval of 30'),
    ],
)
def test_unit_number(text: str, expected: str) -> None:
    assert schedule_error(text) == expected


@pytest.mark.parametrize(
    ("text", "kwargs", "zone"),
    [
        ("every day at 09:00 in Mars/Olympus", {}, "Mars/Olympus"),
        ("every day at 09:00 in europe/london", {}, "europe/london"),
        ("every day at 09:00", {"timezone": "Not/AZone"}, "Not/AZone"),
        ("every day at 09:00", {"timezone": ""}, ""),
        ("every day at 09:00", {"timezone": "../etc/passwd"}, "../etc/passwd"),
        ("every day at 09:00", {"default_timezone": "Nowhere"}, "Nowhere"),
        ("every day at 09:00 in Bad/Zone", {"timezone": LONDON}, "Bad/Zone"),
        ("every day at 09:00 in Europe/London", {"timezone": "Bad/Zone"}, "Bad/Zone"),
    ],
)
def test_invalid_timezone(text: str, kwargs: dict[str, str], zone: str) -> None:
    assert schedule_error(text, **kwargs) == f'Invalid timezone "{zone}"'


def test_default_timezone_is_only_validated_when_used() -> None:
    schedule = parse_schedule("every day at 09:00 in UTC", default_timezone="Nowhere")
    assert isinstance(schedule, WallClockSchedule)


@pytest.mark.parametrize(
    ("text", "task_zone"),
    [
        ("every day at 09:00 in Europe/London", "UTC"),
        ("every weekday at 09:00 in UTC", LONDON),
        ("every week on monday at 09:00 in Europe/Paris", LONDON),
    ],
)
def test_suffix_must_match_task_timezone(text: str, task_zone: str) -> None:
    suffix = text.rsplit(" in ", 1)[1]
    expected = f'Schedule timezone "{suffix}" does not match task timezone "{task_zone}"'
    assert schedule_error(text, timezone=task_zone) == expected


@pytest.mark.parametrize(
    ("text", "kwargs"),
    [
        ("every 5 minutes in Europe/London", {}),
        ("every 1 hour in UTC", {}),
        ("every 1 hour in Not/AZone", {}),
        ("every 5 minutes", {"timezone": LONDON}),
        ("every 5 minutes", {"timezone": LONDON, "default_timezone": LONDON}),
    ],
)
def test_interval_cannot_specify_timezone(text: str, kwargs: dict[str, str]) -> None:
    assert schedule_error(text, **kwargs) == "Interval schedules cannot specify a timezone"


@pytest.mark.parametrize(
    ("days", "expected"),
    [
        ("monday,monday", 'Duplicate schedule day "monday"'),
        ("Monday, friday, MONDAY", 'Duplicate schedule day "monday"'),
        ("funday", 'Invalid schedule day "funday"'),
        ("monday,Funday", 'Invalid schedule day "Funday"'),
        ("mon", 'Invalid schedule day "mon"'),
        ("monday and friday", 'Invalid schedule day "monday and friday"'),
    ],
)
def test_schedule_days(days: str, expected: str) -> None:
    assert schedule_error(f"every week on {days} at 09:00 in UTC") == expected


# --- intervals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "now", "expected"),
    [
        ("every 1 hour", utc(2026, 5, 1, 10, 0, 1), utc(2026, 5, 1, 11)),
        ("every 1 hour", utc(2026, 5, 1, 10), utc(2026, 5, 1, 11)),
        ("every 1 minute", utc(2026, 5, 1, 10, 0, 59), utc(2026, 5, 1, 10, 1)),
        ("every 15 minutes", utc(2026, 5, 1, 10, 44, 59), utc(2026, 5, 1, 10, 45)),
        ("every 2 hours", utc(2026, 5, 1, 11, 30), utc(2026, 5, 1, 12)),
        ("every 7 minutes", utc(1970, 1, 1, 0, 6), utc(1970, 1, 1, 0, 7)),
    ],
)
def test_interval_without_previous_is_aligned_to_the_unix_epoch(
    text: str, now: datetime, expected: datetime
) -> None:
    assert next_occurrence(text, now=now) == expected


def test_interval_with_previous_advances_by_whole_intervals() -> None:
    previous = utc(2026, 5, 1, 10, 7, 30)
    assert next_occurrence("every 15 minutes", now=previous, previous=previous) == utc(
        2026, 5, 1, 10, 22, 30
    )
    later = utc(2026, 5, 1, 10, 30)
    assert next_occurrence("every 15 minutes", now=later, previous=previous) == utc(
        2026, 5, 1, 10, 37, 30
    )


def test_interval_after_long_downtime_gives_one_next_run_after_now() -> None:
    previous = utc(2025, 1, 1, 0, 3)
    now = utc(2026, 6, 15, 12, 0)
    result = next_occurrence("every 5 minutes", now=now, previous=previous)
    assert result == utc(2026, 6, 15, 12, 3)
    assert (result - previous) % timedelta(minutes=5) == timedelta(0)


def test_interval_previous_in_the_future_steps_once_from_it() -> None:
    previous = utc(2026, 5, 1, 12)
    assert next_occurrence("every 1 hour", now=utc(2026, 5, 1, 9), previous=previous) == utc(
        2026, 5, 1, 13
    )


def test_interval_across_dst_is_plain_utc_arithmetic() -> None:
    runs = occurrences("every 2 hours", now=utc(2026, 3, 28, 23, 30), count=4)
    assert runs == [
        utc(2026, 3, 29, 0),
        utc(2026, 3, 29, 2),
        utc(2026, 3, 29, 4),
        utc(2026, 3, 29, 6),
    ]
    autumn = occurrences("every 2 hours", now=utc(2026, 10, 24, 23, 30), count=3)
    assert [b - a for a, b in pairwise(autumn)] == [timedelta(hours=2)] * 2


# --- wall clock ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hhmm", "now", "expected"),
    [
        # spring forward: 2026-03-29 01:00 GMT -> 02:00 BST; 01:30 does not exist
        ("01:30", utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 0)),
        ("01:30", utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)),
        ("01:00", utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 0)),
        ("01:59", utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 0)),
        ("02:00", utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 0)),
        ("09:00", utc(2026, 3, 28, 12), utc(2026, 3, 29, 8, 0)),
        ("09:00", utc(2026, 3, 28, 8, 59), utc(2026, 3, 28, 9, 0)),
        # fall back: 2026-10-25 02:00 BST -> 01:00 GMT; 01:30 happens twice
        ("01:30", utc(2026, 10, 24, 12), utc(2026, 10, 25, 0, 30)),
        ("01:30", utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)),
        ("01:30", utc(2026, 10, 25, 0, 45), utc(2026, 10, 26, 1, 30)),
        ("09:00", utc(2026, 10, 24, 12), utc(2026, 10, 25, 9, 0)),
        ("09:00", utc(2026, 10, 24, 7, 59), utc(2026, 10, 24, 8, 0)),
    ],
)
def test_london_daily_across_dst(hhmm: str, now: datetime, expected: datetime) -> None:
    result = next_occurrence(f"every day at {hhmm} in {LONDON}", now=now)
    assert result == expected
    assert result.tzinfo is UTC


def test_fall_back_day_fires_once() -> None:
    schedule = parse_schedule("every day at 01:30", timezone=LONDON)
    runs = occurrences(schedule, now=utc(2026, 10, 24, 12), count=3)
    assert runs == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)]


def test_spring_forward_sequence_is_daily() -> None:
    schedule = parse_schedule("every day at 01:30 in Europe/London")
    runs = occurrences(schedule, now=utc(2026, 3, 27, 12), count=4)
    assert runs == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 30, 0, 30),
        utc(2026, 3, 31, 0, 30),
    ]


@pytest.mark.parametrize(
    ("hhmm", "zone", "now", "expected"),
    [
        # America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST
        ("02:30", NEW_YORK, utc(2026, 3, 7, 12), utc(2026, 3, 8, 7, 0)),
        ("03:00", NEW_YORK, utc(2026, 3, 7, 12), utc(2026, 3, 8, 7, 0)),
        ("01:30", NEW_YORK, utc(2026, 10, 31, 12), utc(2026, 11, 1, 5, 30)),
        ("01:30", NEW_YORK, utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)),
        # Australia/Lord_Howe (+10:30 / +11:00): 2026-10-04 02:00 -> 02:30, 04-05 02:00 -> 01:30
        ("02:15", LORD_HOWE, utc(2026, 10, 3), utc(2026, 10, 3, 15, 30)),
        ("02:00", LORD_HOWE, utc(2026, 10, 3), utc(2026, 10, 3, 15, 30)),
        ("02:30", LORD_HOWE, utc(2026, 10, 3), utc(2026, 10, 3, 15, 30)),
        ("01:45", LORD_HOWE, utc(2026, 4, 4), utc(2026, 4, 4, 14, 45)),
        ("01:45", LORD_HOWE, utc(2026, 4, 4, 14, 45), utc(2026, 4, 5, 15, 15)),
        # America/Santiago springs forward at midnight: 2026-09-06 00:00 -04 -> 01:00 -03
        ("00:00", SANTIAGO, utc(2026, 9, 5, 12), utc(2026, 9, 6, 4, 0)),
        ("00:30", SANTIAGO, utc(2026, 9, 5, 12), utc(2026, 9, 6, 4, 0)),
    ],
)  # fmt: skip
def test_other_zones_gaps_and_overlaps(
    hhmm: str, zone: str, now: datetime, expected: datetime
) -> None:
    assert next_occurrence(f"every day at {hhmm} in {zone}", now=now) == expected


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (utc(2026, 3, 27, 8, 59), utc(2026, 3, 27, 9, 0)),  # Friday before 09:00 GMT
        (utc(2026, 3, 27, 9, 0), utc(2026, 3, 30, 8, 0)),  # Friday at 09:00 -> Monday (BST)
        (utc(2026, 3, 28, 12), utc(2026, 3, 30, 8, 0)),  # Saturday -> Monday
        (utc(2026, 3, 29, 23), utc(2026, 3, 30, 8, 0)),  # Sunday night -> Monday
        (utc(2026, 3, 30, 8, 0), utc(2026, 3, 31, 8, 0)),  # Monday at 09:00 -> Tuesday
    ],
)
def test_weekday_skips_the_weekend(now: datetime, expected: datetime) -> None:
    assert next_occurrence("every weekday at 09:00 in Europe/London", now=now) == expected


def test_weekday_run_of_a_fortnight() -> None:
    runs = occurrences("every weekday at 09:00 in UTC", now=utc(2026, 6, 1), count=10)
    assert [run.date().weekday() for run in runs] == [0, 1, 2, 3, 4] * 2
    assert {run.time() for run in runs} == {time(9, 0)}


def test_weekly_multi_day() -> None:
    schedule = "every week on friday, monday,wednesday at 18:15 in America/New_York"
    runs = occurrences(schedule, now=utc(2026, 6, 1), count=6)  # Monday 2026-06-01
    assert runs == [
        utc(2026, 6, 1, 22, 15),
        utc(2026, 6, 3, 22, 15),
        utc(2026, 6, 5, 22, 15),
        utc(2026, 6, 8, 22, 15),
        utc(2026, 6, 10, 22, 15),
        utc(2026, 6, 12, 22, 15),
    ]


def test_weekly_single_day_waits_a_week_after_firing() -> None:
    monday = utc(2026, 6, 1, 9)
    assert next_occurrence("every week on monday at 09:00 in UTC", now=monday) == utc(2026, 6, 8, 9)


def test_wall_clock_previous_later_than_now_wins() -> None:
    result = next_occurrence(
        "every day at 09:00 in UTC", now=utc(2026, 6, 1, 8), previous=utc(2026, 6, 1, 9)
    )
    assert result == utc(2026, 6, 2, 9)


def test_wall_clock_previous_far_in_the_past_gives_the_next_run_after_now() -> None:
    result = next_occurrence(
        "every day at 09:00 in UTC", now=utc(2026, 6, 10, 12), previous=utc(2025, 1, 1, 9)
    )
    assert result == utc(2026, 6, 11, 9)


def test_string_schedule_uses_timezone_argument() -> None:
    result = next_occurrence("every day at 09:00", now=utc(2026, 5, 31, 23), timezone="Asia/Tokyo")
    assert result == utc(2026, 6, 1, 0)


def test_string_schedule_errors_propagate() -> None:
    with pytest.raises(ScheduleError, match="requires a timezone"):
        next_occurrence("every day at 09:00", now=utc(2026, 6, 1))


def test_aware_non_utc_now_returns_utc() -> None:
    now = datetime(2026, 6, 1, 10, 30, tzinfo=ZoneInfo("Asia/Kolkata"))  # 05:00 UTC
    result = next_occurrence("every 1 hour", now=now)
    assert result == utc(2026, 6, 1, 6)
    assert result.tzinfo is UTC


@pytest.mark.parametrize(
    ("now", "previous", "name"),
    [
        (datetime(2026, 6, 1, 9), None, "now"),
        (utc(2026, 6, 1, 9), datetime(2026, 6, 1, 8), "previous"),
    ],
)
@pytest.mark.parametrize("text", ["every 1 hour", "every day at 09:00 in UTC"])
def test_naive_datetimes_are_refused(
    text: str, now: datetime, previous: datetime | None, name: str
) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be timezone-aware"):
        next_occurrence(text, now=now, previous=previous)


# --- properties over a seeded sample -------------------------------------------------------

ZONES = [
    LONDON,
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Asia/Kolkata",
    "Pacific/Chatham",
    "UTC",
]


def _exists(day: date, hhmm: time, zone: ZoneInfo) -> bool:
    wall = datetime.combine(day, hhmm)
    return wall.replace(tzinfo=zone).astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall


def _transitions(zone: ZoneInfo, year: int) -> list[datetime]:
    """The UTC hours in ``year`` during which ``zone`` changes its offset."""
    hours = [utc(year, 1, 1) + timedelta(hours=n) for n in range(366 * 24)]
    return [
        hour
        for hour in hours[1:]
        if hour.astimezone(zone).utcoffset()
        != (hour - timedelta(hours=1)).astimezone(zone).utcoffset()
    ]


def _first_existing_run_between(
    schedule: WallClockSchedule, start: datetime, end: datetime
) -> datetime | None:
    """Brute force: the first whole minute in (start, end) showing the schedule's wall time."""
    zone, minute = ZoneInfo(schedule.timezone), timedelta(minutes=1)
    moment = start.replace(second=0, microsecond=0) + minute
    while moment < end:
        local = moment.astimezone(zone)
        wanted = (schedule.hour, schedule.minute, 0)
        if (local.hour, local.minute, local.fold) == wanted and local.weekday() in schedule.days:
            return moment
        moment += minute
    return None


def _assert_occurrence_properties(schedule: WallClockSchedule, now: datetime) -> None:
    zone, hhmm = ZoneInfo(schedule.timezone), time(schedule.hour, schedule.minute)
    result = next_occurrence(schedule, now=now)
    local = result.astimezone(zone)
    assert result.tzinfo is UTC
    assert now < result <= now + timedelta(days=7, hours=3)
    assert local.weekday() in schedule.days
    if local.time() == hhmm:
        assert local.fold == 0  # the earlier instant of an overlap
    else:  # a nonexistent wall time: we fire exactly at the end of the gap
        assert not _exists(local.date(), hhmm, zone)
        before = (result - timedelta(seconds=1)).astimezone(zone)
        assert before.utcoffset() != local.utcoffset()
        wall = datetime.combine(local.date(), hhmm)
        assert before.replace(tzinfo=None) < wall < local.replace(tzinfo=None)
    if result - now <= timedelta(days=2):
        assert _first_existing_run_between(schedule, now, result) is None


def _random_schedule(rng: random.Random, zone: str) -> WallClockSchedule:
    days = tuple(sorted(rng.sample(range(7), rng.randint(1, 7))))
    hour, minute = rng.randrange(24), rng.choice([0, 1, 15, 30, 45, 59])
    return WallClockSchedule("sample", "week", hour, minute, days, zone)


@pytest.mark.parametrize("seed", range(10))
def test_wall_clock_properties_at_random_times(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(20):
        schedule = _random_schedule(rng, rng.choice(ZONES))
        now = utc(2020, 1, 1, second=rng.randrange(60)) + timedelta(
            minutes=rng.randrange(10 * 366 * 24 * 60)
        )
        _assert_occurrence_properties(schedule, now)


@pytest.mark.parametrize("zone", [zone for zone in ZONES if zone not in ("UTC", "Asia/Kolkata")])
def test_wall_clock_properties_around_dst_transitions(zone: str) -> None:
    transitions = _transitions(ZoneInfo(zone), 2026)
    assert len(transitions) == 2
    for transition in transitions:
        for quarter in range(0, 24 * 4):
            hour, minute = divmod(quarter * 15, 60)
            daily = WallClockSchedule("sample", "day", hour, minute, tuple(range(7)), zone)
            _assert_occurrence_properties(daily, transition - timedelta(hours=13))
            _assert_occurrence_properties(daily, transition - timedelta(minutes=1))


@pytest.mark.parametrize("zone", ZONES)
def test_daily_runs_are_a_day_apart_give_or_take_dst(zone: str) -> None:
    for hhmm in ("00:00", "00:30", "01:30", "02:15", "02:45", "09:00", "23:59"):
        runs = occurrences(f"every day at {hhmm} in {zone}", now=utc(2026, 1, 1), count=366)
        gaps = {b - a for a, b in pairwise(runs)}
        assert min(gaps) >= timedelta(hours=22), (hhmm, sorted(gaps)[:3])
        assert max(gaps) <= timedelta(hours=26), (hhmm, sorted(gaps)[-3:])
        local_dates = [run.astimezone(ZoneInfo(zone)).date() for run in runs]
        assert len(set(local_dates)) == len(local_dates)
