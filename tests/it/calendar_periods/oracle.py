#!/usr/bin/env python3
"""An oracle for tollgate's calendar periods (`rate_limit.time_zone`), independent of
its code: Python's own date arithmetic and its `zoneinfo` (the system's IANA database),
where tollgate uses chrono and the database compiled into chrono-tz.

The definition it implements (docs/configuration.md, `time_zone`): a period is
`every` consecutive days, weeks (from Monday), months or years of the zone's calendar,
counted from the first of 1970 (weeks from Monday 1969-12-29); it starts at the first
instant the zone's clocks read its first day (midnight; the first of two midnights when
clocks go back across it; the jump when they skip it); the period holding an instant
is the last one that started at or before it.

Prints one line per probe, all times in milliseconds since the epoch:

    ZONE UNIT EVERY NOW PREV_START START END NEXT_END

The probes sit around the instants where periods are easiest to get wrong, in 2024
and 2025: every offset change of each zone (found by scanning, not listed by hand),
the local midnights that start and end the days of those changes and the weeks
holding them, every month's first day, the leap day, and the years' ends; each probed
a second and a millisecond before, at, and a millisecond after.
"""

import functools
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

ZONES = [
    "Asia/Kolkata",  # +05:30, no daylight saving
    "Australia/Adelaide",  # +09:30 / +10:30, southern summer
    "Australia/Lord_Howe",  # +10:30 / +11:00: a half-hour change
    "America/St_Johns",  # -03:30 / -02:30
    "Europe/Berlin",
    "America/New_York",
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/Santiago",  # changes at midnight: skipped in September, twice in April
    "America/Havana",  # midnight skipped in March, twice in November
    "UTC",
]
UNITS = [("day", 1), ("day", 2), ("week", 1), ("week", 2), ("month", 1), ("month", 3), ("year", 1)]
FROM, UNTIL = datetime(2024, 1, 1, tzinfo=timezone.utc), datetime(2026, 1, 1, tzinfo=timezone.utc)
EPOCH = date(1970, 1, 1)
FIRST_MONDAY = date(1969, 12, 29)


def local_date(zone, second):
    return datetime.fromtimestamp(second, ZoneInfo(zone)).date()


@functools.lru_cache(maxsize=None)
def day_start(zone, day):
    """Milliseconds: the first instant whose local date in `zone` is `day`."""
    tz = ZoneInfo(zone)
    wall = datetime(day.year, day.month, day.day)
    readings = [wall.replace(tzinfo=tz, fold=fold).timestamp() for fold in (0, 1)]
    exact = [t for t in readings if datetime.fromtimestamp(t, tz).replace(tzinfo=None) == wall]
    if exact:
        return int(min(exact)) * 1000
    # Midnight does not exist: the clocks jump over it, somewhere between the two
    # readings of it (one with each offset). The first second reading `day`:
    lo, hi = int(min(readings)) - 1, int(max(readings))
    assert local_date(zone, lo) < day <= local_date(zone, hi), (zone, day)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if local_date(zone, mid) >= day:
            hi = mid
        else:
            lo = mid
    return hi * 1000


def first_day(unit, every, index):
    n = index * every
    if unit == "day":
        return EPOCH + timedelta(days=n)
    if unit == "week":
        return FIRST_MONDAY + timedelta(weeks=n)
    if unit == "month":
        years, month = divmod(n, 12)
        return date(1970 + years, month + 1, 1)
    return date(1970 + n, 1, 1)


def index_of(unit, every, day):
    """The period whose days include the local date `day`."""
    if unit == "day":
        k = (day - EPOCH).days
    elif unit == "week":
        k = (day - FIRST_MONDAY).days // 7
    elif unit == "month":
        k = (day.year - 1970) * 12 + day.month - 1
    else:
        k = day.year - 1970
    return k // every


def period(zone, unit, every, now_ms):
    start = lambda i: day_start(zone, first_day(unit, every, i))  # noqa: E731
    i = index_of(unit, every, local_date(zone, now_ms // 1000))
    # Where clocks go back across midnight the local date runs backwards for a while:
    # the period holding `now` is the last that started at or before it.
    while start(i) > now_ms:
        i -= 1
    while start(i + 1) <= now_ms:
        i += 1
    return start(i - 1), start(i), start(i + 1), start(i + 2)


def offset_changes(zone):
    """Seconds at which `zone`'s UTC offset changes (the first second of the new one)."""
    tz = ZoneInfo(zone)
    offset = lambda s: datetime.fromtimestamp(s, tz).utcoffset()  # noqa: E731
    changes = []
    second, end = int(FROM.timestamp()), int(UNTIL.timestamp())
    while second < end:
        nxt = second + 3600
        if offset(second) != offset(nxt):
            lo, hi = second, nxt
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if offset(mid) == offset(lo):
                    lo = mid
                else:
                    hi = mid
            changes.append(hi)
        second = nxt
    return changes


def boundaries(zone):
    """Milliseconds worth probing in `zone`."""
    out = set()
    for change in offset_changes(zone):
        out.add(change * 1000)
        day = local_date(zone, change)
        monday = day - timedelta(days=day.weekday())
        for d in (day - timedelta(days=1), day, day + timedelta(days=1), day + timedelta(days=2),
                  monday, monday + timedelta(weeks=1)):
            out.add(day_start(zone, d))
    for year in (2024, 2025, 2026):
        for month in range(1, 13):
            if date(year, month, 1) <= date(2026, 1, 1):
                out.add(day_start(zone, date(year, month, 1)))
    for d in (date(2024, 2, 28), date(2024, 2, 29), date(2024, 3, 1), date(2025, 3, 1)):
        out.add(day_start(zone, d))
    return sorted(out)


def main():
    lines = []
    for zone in ZONES:
        for edge in boundaries(zone):
            for now in (edge - 1000, edge - 1, edge, edge + 1):
                for unit, every in UNITS:
                    bounds = period(zone, unit, every, now)
                    lines.append(f"{zone} {unit} {every} {now} " + " ".join(map(str, bounds)))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
