"""The admit script's schedule at a domain's full rate (issue 31), read from the slots and
waits it hands out, which are exact: no wall-clock throughput is asserted. Windows of a minute
keep every decision far from the test's own timing."""

from __future__ import annotations

import redis

from common.core.config import Settings
from common.store.keys import rate_log_key, rate_slot_key
from common.web.ratelimit import Rate, RateLimiter

DOMAIN = "pace.example"
TWO_A_MINUTE = Rate(2, 60_000)
ONE_A_MINUTE = Rate(1, 60_000)


def _limiter(settings: Settings, redis_client: redis.Redis, guard: float = 0.0) -> RateLimiter:
    return RateLimiter(redis_client, settings.with_overrides(rate_limit_guard=guard))


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_a_full_window_frees_a_place_exactly_one_span_after_its_oldest_permit(
        settings, redis_client):
    limiter = _limiter(settings, redis_client, guard=0.02)  # span 61,200 ms
    first = limiter.admit(DOMAIN, TWO_A_MINUTE)
    assert first.go and limiter.admit(DOMAIN, TWO_A_MINUTE).go
    oldest = int(redis_client.zscore(first.permit.log_key, first.permit.member))

    third = limiter.admit(DOMAIN, TWO_A_MINUTE, queue=True)

    # Not a millisecond later: at 2/s that millisecond a window was 30 ms over 60 pages.
    assert not third.go and third.slot_ms == oldest + 61_200


def test_a_booked_url_back_before_its_slot_waits_for_it_even_in_an_empty_window(
        settings, redis_client):
    limiter = _limiter(settings, redis_client)
    booked = _redis_ms(redis_client) + 5_000

    early = limiter.admit(DOMAIN, ONE_A_MINUTE, booked_ms=booked)

    assert not early.go and early.slot_ms == booked and 4_000 < early.wait_ms <= 5_000
    assert redis_client.zcard(rate_log_key(DOMAIN)) == 0  # no permit taken


def test_a_booked_url_back_early_to_a_full_window_keeps_its_slot_instead_of_a_new_one(
        settings, redis_client):
    limiter = _limiter(settings, redis_client)
    assert limiter.admit(DOMAIN, ONE_A_MINUTE).go
    second = limiter.admit(DOMAIN, ONE_A_MINUTE, queue=True)
    assert not second.go
    next_free = int(redis_client.get(rate_slot_key(DOMAIN)))

    back = limiter.admit(DOMAIN, ONE_A_MINUTE, booked_ms=second.slot_ms)

    assert not back.go and back.slot_ms == second.slot_ms
    assert int(redis_client.get(rate_slot_key(DOMAIN))) == next_free  # nothing booked again


def test_a_page_without_a_slot_queues_behind_booked_urls_while_robots_txt_takes_the_place(
        settings, redis_client):
    limiter = _limiter(settings, redis_client)
    first = limiter.admit(DOMAIN, ONE_A_MINUTE)
    booked = limiter.admit(DOMAIN, ONE_A_MINUTE, queue=True)
    assert first.go and not booked.go
    # The first request leaves the window early (as if a minute had passed): a free place,
    # which is the booked URL's.
    redis_client.zrem(first.permit.log_key, first.permit.member)

    page = limiter.admit(DOMAIN, ONE_A_MINUTE, queue=True)

    assert not page.go and page.slot_ms == booked.slot_ms + 60_000  # behind it, not before
    robots = limiter.admit(DOMAIN, ONE_A_MINUTE)  # robots.txt, a sitemap: no queue
    assert robots.go
