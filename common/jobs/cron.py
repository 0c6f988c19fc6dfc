"""Cron expressions of scheduled jobs, through croniter (five fields, UTC).

croniter parses and steps the standard five-field syntax (ranges, lists, steps, names); a
hand-written parser would be a second, untested one. Times are UTC epoch seconds.
"""

from __future__ import annotations

from datetime import UTC, datetime

from croniter import CroniterBadCronError, CroniterBadDateError, croniter


def check_cron(expression: str) -> None:
    """Raises ValueError naming what is wrong with a five-field cron expression."""
    if len(expression.split()) != 5:
        raise ValueError(f"expected five fields (minute hour day month weekday), got "
                         f"{expression!r}")
    try:
        croniter(expression, datetime.now(UTC))
    except (CroniterBadCronError, CroniterBadDateError, ValueError, KeyError) as exc:
        raise ValueError(f"{expression!r}: {exc}") from None


def next_after(expression: str, after_s: float) -> float:
    """The first time strictly after ``after_s`` (epoch seconds) the expression matches."""
    start = datetime.fromtimestamp(after_s, UTC)
    return croniter(expression, start).get_next(float)
