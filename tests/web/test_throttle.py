"""The adaptive per-domain throttle (common/web/throttle.py) inside the admit script, against
real Redis: blocks on the curve or until Retry-After, one escalation per incident,
forgiveness, AIMD on timeouts, slow and healthy answers, MAX_WAIT_S, the Crawl-delay cap, and
what it costs a healthy domain in round trips."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from common.core.config import Settings
from common.store.keys import THROTTLED, rate_slot_key, throttle_key
from common.store.marks import Retime
from common.web.fetch import FetchResult
from common.web.ratelimit import Rate, RateLimiter
from common.work import metrics
from common.work.outcome import Failure

DOMAIN = "throttled.example"
URL = f"http://{DOMAIN}/page"
TEN_PER_S = Rate(10, 1000)


def _limiter(settings: Settings, redis_client: redis.Redis, **overrides: object) -> RateLimiter:
    knobs = {"throttle_block_start_s": 2.0, "throttle_block_factor": 2.0,
             "throttle_block_max_s": 5.0, "throttle_jitter": 0.0, "rate_limit_guard": 0.0,
             **overrides}
    return RateLimiter(redis_client, settings.with_overrides(**knobs))


def _report(limiter: RateLimiter, client: redis.Redis, failure: Failure,
            sent_at: float | None = None, url: str = URL) -> None:
    """Report a failed attempt the way the processor does: inside its failure pipeline."""
    pipe = client.pipeline(transaction=True)
    limiter.report(pipe, url, failure, Retime(None, time.time() if sent_at is None else sent_at))
    pipe.execute()


def _state(client: redis.Redis, domain: str = DOMAIN) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(throttle_key(domain)).items()}


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def _answer(elapsed_ms: float, status: int = 200, sent_at: float | None = None) -> FetchResult:
    return FetchResult(URL, URL, status, "text/html", b"<html></html>", elapsed_ms,
                       sent_at=time.time() if sent_at is None else sent_at)


HTTP_429 = Failure("http_429", status=429)
HTTP_503 = Failure("http_503", status=503)
TIMEOUT = Failure("fetch_timeout", error="timeout: read timed out")


def test_a_429_blocks_the_whole_domain_and_no_other(settings, redis_client):
    limiter = _limiter(settings, redis_client)
    assert limiter.admit(DOMAIN, TEN_PER_S).go

    _report(limiter, redis_client, HTTP_429)

    other_url = limiter.admit(DOMAIN, TEN_PER_S)
    assert not other_url.go and 1900 <= other_url.wait_ms <= 2000, other_url
    assert other_url.throttle is not None and other_url.throttle.blocked_ms > 1900
    assert other_url.throttle.reason == "http_429" and other_url.throttle.status == 429
    assert limiter.admit("elsewhere.example", TEN_PER_S).go


def test_a_503_with_retry_after_blocks_until_then_capped_at_retry_after_max(settings,
                                                                            redis_client):
    limiter = _limiter(settings, redis_client, retry_after_max_s=4.0)
    _report(limiter, redis_client, Failure("http_503", status=503, retry_after="3"))
    assert 2900 <= limiter.admit(DOMAIN, TEN_PER_S).wait_ms <= 3000

    _report(limiter, redis_client, Failure("http_503", status=503, retry_after="86400"))
    admission = limiter.admit(DOMAIN, TEN_PER_S)
    assert 3900 <= admission.wait_ms <= 4100, admission
    assert admission.throttle.reason == "http_503, Retry-After 4 s"
    assert _state(redis_client)["level"] == "0"  # the server said how long: not the curve


def test_a_retry_after_on_another_transient_status_blocks_too_and_a_plain_500_does_not(
        settings, redis_client):
    limiter = _limiter(settings, redis_client)
    _report(limiter, redis_client, Failure("http_500", status=500))
    assert limiter.admit(DOMAIN, TEN_PER_S).go

    _report(limiter, redis_client, Failure("http_502", status=502, retry_after="3"))
    assert 2900 <= limiter.admit(DOMAIN, TEN_PER_S).wait_ms <= 3000


def test_answers_to_requests_sent_before_the_block_are_one_incident(settings, redis_client):
    limiter = _limiter(settings, redis_client)
    sent = time.time()
    for _in_flight in range(4):  # four requests in flight when the site started refusing
        _report(limiter, redis_client, HTTP_429, sent_at=sent)

    state = _state(redis_client)
    assert state["level"] == "1"
    assert 1900 <= int(state["until"]) - _redis_ms(redis_client) <= 2000
    assert float(state["rate"]) == 1.0  # a block is a pause, not a slower rate afterwards


def test_each_new_incident_doubles_the_block_up_to_the_cap(settings, redis_client):
    limiter = _limiter(settings, redis_client)
    blocks = []
    for _incident in range(4):
        until = int(_state(redis_client).get("until", 0))
        # A request sent once the previous block was over: a new incident.
        _report(limiter, redis_client, HTTP_503, sent_at=until / 1000 if until else None)
        blocks.append(int(_state(redis_client)["until"]) - _redis_ms(redis_client))
    assert [round(b / 1000) for b in blocks] == [2, 4, 5, 5], blocks  # 2 s, doubling, cap 5 s
    assert _state(redis_client)["level"] == "4"


def test_jitter_adds_up_to_its_fraction_to_a_block_from_the_curve(settings, redis_client):
    limiter = _limiter(settings, redis_client, throttle_jitter=0.5)
    blocks = set()
    for n in range(8):
        domain = f"j{n}.example"
        _report(limiter, redis_client, HTTP_429, url=f"http://{domain}/")
        blocks.add(int(_state(redis_client, domain)["until"]) - _redis_ms(redis_client))
    assert all(1900 <= b <= 3000 for b in blocks), blocks
    assert len(blocks) > 1  # not all the same: domains blocked together come back apart


def test_a_quiet_domain_is_forgiven_its_curve_and_then_its_state(settings, redis_client):
    limiter = _limiter(settings, redis_client, throttle_block_start_s=0.2,
                       throttle_forgive_s=0.5)
    _report(limiter, redis_client, HTTP_429)
    _report(limiter, redis_client, HTTP_429,
            sent_at=int(_state(redis_client)["until"]) / 1000)
    assert _state(redis_client)["level"] == "2"
    ttl_ms = redis_client.pttl(throttle_key(DOMAIN))
    assert 0 < ttl_ms <= 400 + 500  # the block left + forgive

    time.sleep(0.45 + 0.55)  # the block over, then quiet for longer than THROTTLE_FORGIVE_S

    assert _state(redis_client) == {}  # expired by itself: the configured rate is back
    assert redis_client.zscore(THROTTLED, DOMAIN) is None or (
        redis_client.zscore(THROTTLED, DOMAIN) < _redis_ms(redis_client))
    assert limiter.admit(DOMAIN, TEN_PER_S).go
    _report(limiter, redis_client, HTTP_429)
    assert _state(redis_client)["level"] == "1"  # the curve starts over


def test_urls_of_a_blocked_domain_book_staggered_slots_from_the_block_end(settings,
                                                                        redis_client):
    limiter = _limiter(settings, redis_client)
    _report(limiter, redis_client, HTTP_429)
    block_end = int(_state(redis_client)["until"])

    slots = [limiter.admit(DOMAIN, Rate(2, 1000)).slot_ms for _ in range(3)]

    # From the block's end on, at the configured spacing: the rate is back at once.
    assert slots == [block_end, block_end + 500, block_end + 1000]


def test_a_timeout_halves_the_rate_once_per_round_and_healthy_answers_raise_it_back(
        settings, redis_client):
    limiter = _limiter(settings, redis_client, throttle_increase=0.25,
                       throttle_rate_floor=0.2)
    _report(limiter, redis_client, TIMEOUT)
    _report(limiter, redis_client, TIMEOUT, sent_at=time.time() - 5)  # sent before the cut
    assert float(_state(redis_client)["rate"]) == 0.5
    first = limiter.admit(DOMAIN, TEN_PER_S)
    second = limiter.admit(DOMAIN, TEN_PER_S)
    assert first.go and not second.go and 190 <= second.wait_ms <= 210  # 5/s, no burst
    assert first.throttle.rate == 0.5 and first.throttle.reason == "fetch_timeout"

    for _round in range(3):  # three more rounds: 0.25, then the floor
        time.sleep(0.005)
        _report(limiter, redis_client, TIMEOUT)
    assert float(_state(redis_client)["rate"]) == 0.2

    for _healthy in range(3):
        limiter.throttle.observe(DOMAIN, _answer(20))
    assert limiter.admit(DOMAIN, TEN_PER_S).throttle.rate == pytest.approx(0.95)
    limiter.throttle.observe(DOMAIN, _answer(20))
    recovered = limiter.admit(DOMAIN, TEN_PER_S)
    assert recovered.throttle.rate == 1.0 and not recovered.throttle.active  # never above


def test_healthy_answers_to_requests_sent_before_the_cut_do_not_raise_the_rate_back(
        settings, redis_client):
    limiter = _limiter(settings, redis_client, throttle_increase=0.25)
    before_cut = time.time() - 1
    _report(limiter, redis_client, TIMEOUT)
    for _answered in range(3):  # sent before the site slowed, answered after the cut
        limiter.throttle.observe(DOMAIN, _answer(20, sent_at=before_cut))
    assert limiter.admit(DOMAIN, TEN_PER_S).throttle.rate == 0.5
    limiter.throttle.observe(DOMAIN, _answer(20))  # one sent after it counts
    assert limiter.admit(DOMAIN, TEN_PER_S).throttle.rate == 0.75


def test_a_domain_whose_rate_comes_back_still_gets_no_more_than_its_limit_in_any_window(
        settings, redis_client):
    limiter = _limiter(settings, redis_client, throttle_increase=0.5)
    five_per_s = Rate(5, 1000)  # spacing 200 ms; slowed to half: one per 400 ms
    _report(limiter, redis_client, TIMEOUT)
    permits = []
    for _slowed in range(3):
        admission = limiter.admit(DOMAIN, five_per_s)
        assert admission.go, admission
        permits.append(time.monotonic())
        time.sleep(0.41)
    limiter.throttle.observe(DOMAIN, _answer(20))  # the rate is back: 5 in any second again

    while (admission := limiter.admit(DOMAIN, five_per_s)).go:
        permits.append(time.monotonic())
    assert admission.throttle.rate == 1.0
    # The permits given while slowed still count in the configured window (a gate of 400 ms
    # must not forget them): 5 in the last second, not 3 more on top of the slowed ones.
    in_last_second = [t for t in permits if t > permits[-1] - 1.0]
    assert len(in_last_second) <= 5, [round(t - permits[0], 3) for t in permits]
    assert len(permits) == 6  # 3 slowed, then 3 more: 5 in the window from the second one


def test_a_slow_answer_against_the_domain_median_cuts_the_rate_at_the_next_admit(
        settings, redis_client):
    limiter = _limiter(settings, redis_client, throttle_slow_factor=4.0,
                       throttle_slow_min_s=0.5)
    for _usual in range(5):
        limiter.throttle.observe(DOMAIN, _answer(100))
    limiter.throttle.observe(DOMAIN, _answer(350))  # slower, but under 4 x the median
    assert limiter.admit(DOMAIN, TEN_PER_S).throttle is None  # healthy: no state at all

    limiter.throttle.observe(DOMAIN, _answer(900))

    admission = limiter.admit(DOMAIN, TEN_PER_S)
    assert admission.throttle is not None and admission.throttle.rate == 0.5
    assert admission.throttle.reason.startswith("slow: 0.90 s, median 0.10 s")
    assert limiter.throttle.admit_args(DOMAIN)[2:4] == [0, 0]  # told once, then cleared


def test_429_and_503_answers_are_left_to_the_failure_report_not_the_latency_sample(
        settings, redis_client):
    limiter = _limiter(settings, redis_client)
    limiter.throttle.observe(DOMAIN, _answer(10, status=429))
    limiter.throttle.observe(DOMAIN, _answer(10, status=503))
    assert limiter.throttle.admit_args(DOMAIN)[2] == 0


def test_a_url_whose_turn_would_come_after_its_wait_limit_books_nothing(settings,
                                                                       redis_client):
    limiter = _limiter(settings, redis_client)
    one_per_s = Rate(1, 1000)
    assert limiter.admit(DOMAIN, one_per_s).go
    booked = limiter.admit(DOMAIN, one_per_s, max_wait_ms=5000)
    assert not booked.go and not booked.too_late and booked.slot_ms
    next_slot = redis_client.get(rate_slot_key(DOMAIN))

    late = limiter.admit(DOMAIN, one_per_s, max_wait_ms=1500)

    assert late.too_late and not late.go and late.wait_ms > 1500
    assert redis_client.get(rate_slot_key(DOMAIN)) == next_slot  # no slot wasted on it
    _report(limiter, redis_client, HTTP_429)  # a 2 s block
    assert limiter.admit(DOMAIN, one_per_s, max_wait_ms=1000).too_late


def test_a_crawl_delay_of_a_year_is_capped_at_robots_max_crawl_delay(settings, redis_client):
    assert RateLimiter(redis_client, settings).rate_for(DOMAIN, 31536000.0) == Rate(1, 30_000)
    capped = RateLimiter(redis_client, settings.with_overrides(robots_max_crawl_delay_s=2.0))
    assert capped.rate_for(DOMAIN, 31536000.0) == Rate(1, 2000)
    assert capped.rate_for(DOMAIN, 1.5) == Rate(1, 1500)  # shorter ones as the site asked


def test_the_status_rows_show_each_throttled_domain_its_block_or_rate_and_why(settings,
                                                                          redis_client):
    limiter = _limiter(settings, redis_client)
    _report(limiter, redis_client, Failure("http_503", status=503, retry_after="30"))
    _report(limiter, redis_client, TIMEOUT, url="http://slowed.example/x")

    rows = {row["domain"]: row for row in limiter.throttled()}

    assert set(rows) == {DOMAIN, "slowed.example"}
    blocked, slowed = rows[DOMAIN], rows["slowed.example"]
    assert blocked["blocked_s"] > 28 and blocked["last_status"] == 503
    assert blocked["text"].startswith("blocked 30 s more") and "Retry-After 30 s" in blocked["text"]
    # RATE_LIMIT is 1000/second in the tests: half of it.
    assert slowed["blocked_s"] == 0 and slowed["rate"] == 0.5 and slowed["rate_per_s"] == 500
    assert slowed["reason"] == "fetch_timeout" and slowed["since"]
    assert "50% of its rate" in slowed["text"]


def test_the_metrics_export_a_throttled_domain_and_drop_it_once_healthy(settings,
                                                                        redis_client):
    limiter = _limiter(settings, redis_client, throttle_increase=0.5)
    _report(limiter, redis_client, TIMEOUT)
    admission = limiter.admit(DOMAIN, TEN_PER_S)
    metrics.show_throttle(DOMAIN, admission.throttle)
    sample = metrics.REGISTRY.get_sample_value
    labels = {"domain": DOMAIN, "reason": "fetch_timeout"}
    assert sample("fleet_throttled_domain_rate_ratio", labels) == 0.5
    assert sample("fleet_throttled_domain_since_seconds", labels) == pytest.approx(
        time.time(), abs=5)

    limiter.throttle.observe(DOMAIN, _answer(10))
    metrics.show_throttle(DOMAIN, limiter.admit(DOMAIN, TEN_PER_S).throttle)

    assert sample("fleet_throttled_domain_rate_ratio", labels) is None


class _RoundTrips(redis.Connection):
    """Counts what goes over the wire: one packed send is one round trip."""

    sent: list[int] = []

    def send_packed_command(self, command, check_health=True):  # noqa: ANN001 - redis-py's
        _RoundTrips.sent.append(1)
        return super().send_packed_command(command, check_health)


@pytest.fixture
def counted(settings: Settings) -> Iterator[redis.Redis]:
    pool = redis.ConnectionPool.from_url(settings.redis_url, connection_class=_RoundTrips)
    client = redis.Redis(connection_pool=pool)
    try:
        yield client
    finally:
        client.close()
        pool.disconnect()


def test_a_healthy_domain_costs_one_admit_round_trip_and_leaves_no_state(settings, counted):
    limiter = _limiter(settings, counted)
    assert limiter.admit(DOMAIN, TEN_PER_S).go  # loads the script (NOSCRIPT once)
    _RoundTrips.sent.clear()
    for _page in range(5):
        limiter.throttle.observe(DOMAIN, _answer(20))
        assert limiter.admit(DOMAIN, TEN_PER_S).go
    assert len(_RoundTrips.sent) == 5
    assert counted.exists(throttle_key(DOMAIN)) == 0 and counted.zcard(THROTTLED) == 0

    _RoundTrips.sent.clear()
    pipe = counted.pipeline(transaction=True)  # the failure's own pipeline
    pipe.incr("failures:x")
    limiter.report(pipe, URL, HTTP_429, Retime(None, time.time()))
    pipe.execute()
    assert len(_RoundTrips.sent) == 1 and _state(counted)["reason"] == "http_429"
