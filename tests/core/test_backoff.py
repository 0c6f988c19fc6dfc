"""Unit tests of common/core/backoff.py and the status classification of common/core/errors.py."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from common.core.backoff import compute_backoff_s, parse_retry_after_s, retry_delay_s
from common.core.errors import OK, PERMANENT, TRANSIENT, classify_status

NOW = datetime(2024, 11, 22, 12, 0, 0, tzinfo=UTC)


class _HighRng(random.Random):
    """Always draws the top of the range: the backoff equals its ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


class _LowRng(random.Random):
    """Always draws the bottom of the range: the backoff equals half its ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return a


# -- compute_backoff_s ------------------------------------------------------------------------

def test_backoff_ceiling_doubles_with_each_failure_until_the_cap():
    delays = [compute_backoff_s(n, base_s=1.0, max_s=10.0, rng=_HighRng()) for n in range(1, 8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_backoff_floor_is_half_the_ceiling():
    delays = [compute_backoff_s(n, base_s=1.0, max_s=10.0, rng=_LowRng()) for n in range(1, 6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 5.0]


def test_backoff_never_exceeds_the_cap_even_after_many_failures():
    assert compute_backoff_s(200, base_s=2.0, max_s=300.0, rng=_HighRng()) == 300.0


def test_backoff_treats_failure_zero_like_the_first_failure():
    assert compute_backoff_s(0, base_s=3.0, max_s=100.0, rng=_HighRng()) == 3.0


@pytest.mark.parametrize("failures", [1, 2, 3, 5, 9, 30])
def test_backoff_jitter_stays_between_half_the_ceiling_and_the_ceiling(failures):
    base_s, max_s = 0.5, 20.0
    ceiling = min(max_s, base_s * 2 ** (failures - 1))
    rng = random.Random(failures)
    delays = [compute_backoff_s(failures, base_s=base_s, max_s=max_s, rng=rng)
              for _ in range(2000)]
    assert all(ceiling / 2 <= d <= ceiling for d in delays)
    # Jitter actually spreads the delays over the range rather than picking one value.
    assert max(delays) - min(delays) > ceiling / 4


def test_backoff_without_an_rng_uses_the_module_random_within_bounds():
    delays = [compute_backoff_s(4, base_s=1.0, max_s=100.0) for _ in range(500)]
    assert all(4.0 <= d <= 8.0 for d in delays)


# -- parse_retry_after_s ----------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    ("0", 0.0), ("2", 2.0), ("120", 120.0), (" 30 ", 30.0), ("86400", 86400.0),
])
def test_retry_after_in_delta_seconds_is_read_as_seconds(value, expected):
    assert parse_retry_after_s(value, now=NOW) == expected


def test_retry_after_as_an_http_date_gives_the_seconds_until_that_date():
    value = format_datetime(NOW + timedelta(seconds=90), usegmt=True)
    assert value.endswith("GMT")
    assert parse_retry_after_s(value, now=NOW) == pytest.approx(90.0)


def test_retry_after_as_an_http_date_in_the_past_means_no_wait():
    value = format_datetime(NOW - timedelta(hours=1), usegmt=True)
    assert parse_retry_after_s(value, now=NOW) == 0.0


def test_retry_after_http_date_defaults_to_the_current_time():
    value = format_datetime(datetime.now(UTC) + timedelta(seconds=600), usegmt=True)
    # HTTP-dates have whole seconds, and a little time passes between the two calls.
    assert 595.0 <= parse_retry_after_s(value) <= 600.0


@pytest.mark.parametrize("value", [
    None, "", "   ", "soon", "-5", "1.5", "2 days", "Wed, 99 Foo 2020 99:99:99 GMT", "0x10",
])
def test_garbage_retry_after_is_ignored(value):
    assert parse_retry_after_s(value, now=NOW) is None


@pytest.mark.parametrize("value", ["\u00b2", "\u00b9\u00b3"])
def test_retry_after_of_latin1_superscript_digits_is_ignored_not_an_exception(value):
    # requests decodes header values as ISO-8859-1, so a server sending the byte 0xB2 gives
    # the string "²": str.isdigit() accepts it but float() does not.
    assert parse_retry_after_s(value, now=NOW) is None


# -- retry_delay_s ----------------------------------------------------------------------------

def test_retry_delay_is_the_backoff_when_there_is_no_retry_after():
    delays = [retry_delay_s(3, None, base_s=1.0, max_s=100.0, retry_after_max_s=3600.0)
              for _ in range(200)]
    assert all(2.0 <= d <= 4.0 for d in delays)


def test_retry_delay_follows_a_retry_after_longer_than_the_backoff():
    assert retry_delay_s(1, "30", base_s=0.05, max_s=1.0, retry_after_max_s=3600.0) == 30.0


def test_retry_delay_keeps_the_backoff_when_retry_after_asks_for_less():
    delays = [retry_delay_s(4, "1", base_s=1.0, max_s=100.0, retry_after_max_s=3600.0)
              for _ in range(200)]
    assert all(4.0 <= d <= 8.0 for d in delays)


def test_retry_delay_caps_retry_after_at_retry_after_max():
    assert retry_delay_s(1, "7200", base_s=0.05, max_s=1.0, retry_after_max_s=60.0) == 60.0


def test_retry_delay_caps_an_http_date_retry_after_too():
    value = format_datetime(datetime.now(UTC) + timedelta(days=2), usegmt=True)
    assert retry_delay_s(1, value, base_s=0.05, max_s=1.0, retry_after_max_s=120.0) == 120.0


def test_retry_delay_may_exceed_the_backoff_cap_up_to_retry_after_max():
    delay = retry_delay_s(10, "500", base_s=1.0, max_s=300.0, retry_after_max_s=3600.0)
    assert delay == 500.0


def test_retry_delay_ignores_a_garbage_retry_after():
    delays = [retry_delay_s(2, "later please", base_s=1.0, max_s=100.0,
                            retry_after_max_s=3600.0) for _ in range(200)]
    assert all(1.0 <= d <= 2.0 for d in delays)


# -- classify_status --------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "verdict"), [
    (200, OK),
    (301, OK),
    (404, PERMANENT),
    (410, PERMANENT),
    (403, PERMANENT),
    (408, TRANSIENT),
    (429, TRANSIENT),
    (500, TRANSIENT),
    (503, TRANSIENT),
])
def test_status_is_classified_as_ok_permanent_or_transient(status, verdict):
    assert classify_status(status) == verdict


def test_a_very_long_streak_of_failures_still_waits_at_most_the_cap():
    from common.core.backoff import reconnect_delay_s

    for attempt in (1_000, 5_000, 10**9):
        assert 0 < reconnect_delay_s(attempt) <= 5.0
