"""Retry delays: exponential backoff with jitter, and the server's Retry-After."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime


def compute_backoff_s(failures: int, *, base_s: float, max_s: float,
                      rng: random.Random | None = None) -> float:
    """Delay before retry number ``failures`` (1-based): base·2^(n-1), capped, "equal jitter"
    (half fixed, half random) so retries of many URLs that failed together spread out but
    never come back at once."""
    ceiling = min(max_s, base_s * 2 ** max(0, failures - 1))
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


def parse_retry_after_s(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds asked for by a Retry-After header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def retry_delay_s(failures: int, retry_after: str | None, *, base_s: float, max_s: float,
                  retry_after_max_s: float) -> float:
    """The delay before the next attempt: the backoff, or the server's Retry-After (capped at
    ``retry_after_max_s``) when that asks for longer."""
    delay = compute_backoff_s(failures, base_s=base_s, max_s=max_s)
    asked = parse_retry_after_s(retry_after)
    if asked is not None:
        delay = max(delay, min(asked, retry_after_max_s))
    return delay
