"""Politeness, measured where it matters: in the test sites' own request logs.

Shared per-domain rate limit (across worker processes), per-domain overrides that delay
without dropping or blocking other domains, robots.txt (disallow, Crawl-delay, 404, 503),
and the response cache.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import load_settings
from common.core.urls import fingerprint
from common.intake.producer import Producer
from common.store.dedupe import SeenSet
from common.store.keys import COUNTERS, DONE_PREFIX, content_key
from devtools.site_process import LoggedRequest, SitesProcess
from devtools.testsite import RequestRecord, TestSite
from tests.helpers import (
    TEST_ENV,
    WorkerThread,
    drain,
    publish_raw,
    queue_depth,
    results,
    start_worker_process,
    wait_workers_ok,
)

SERVER_GAP_TOLERANCE_S = 0.02  # clock/scheduling slack allowed on a 1 s server-side spacing


def _seed(settings, redis_client, urls: Sequence[str]) -> None:
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()


def _counters(redis_client) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in redis_client.hgetall(COUNTERS).items()}


def _times(log: Sequence[RequestRecord | LoggedRequest]) -> list[float]:
    return sorted(r.monotonic_s for r in log)


#: How late a test site may log a request: its process shares 2 cores with 4 workers,
#: RabbitMQ and Redis (the workers run at nice 10).
SITE_LOG_TOLERANCE_S = 0.02


def _max_in_window(times: Sequence[float], window_s: float = 1.0) -> int:
    """Most requests in any half-open window [t, t + window_s)."""
    best = 0
    j = 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] - start < window_s:
            j += 1
        best = max(best, j - i)
    return best


def _run_worker(settings, timeout_s: float = 60, **overrides) -> None:
    with WorkerThread(settings.with_overrides(**overrides)) as worker:
        assert worker.join(timeout_s) == 0


# -- the shared rate limit -------------------------------------------------------------------


@pytest.mark.slow
def _lower_priority() -> None:
    os.nice(10)


def test_four_worker_processes_share_one_limit_per_site_as_measured_by_the_sites(
        settings, redis_client, amqp_channel):
    per_site = 16
    # The sites stand in for remote servers, which nothing of ours can pause: they run in a
    # process of their own (devtools/site_process.py), so their log records arrivals. In the
    # pytest process, with the suite's heap and threads, a site now and then logged a request
    # up to ~80 ms late, which reads as two requests closer than they were sent (NOTES.md #11).
    # Hosts of their own: 127.0.0.1 is shared with the session test site and the services.
    with SitesProcess(5, "127.0.0.21", pages=20) as sites:
        urls = [sites.page_url(i, n) for n in range(1, per_site + 1) for i in range(5)]
        _seed(settings, redis_client, urls)
        # The guard is pinned at the 3% these margins were measured with (the default became
        # 2% on 2026-11-22, checked by the bench's politeness phase).
        procs = [start_worker_process(settings, "--idle-exit", "3", "--concurrency", "4",
                                      env={"RATE_LIMIT": "2/second", "RATE_LIMIT_GUARD": "0.03",
                                           "WORKER_ID": f"w{i}"},
                                      preexec_fn=_lower_priority)
                 for i in range(4)]
        wait_workers_ok(procs, 90)
        logs = sites.stop()

    figures = []
    for host, log in logs.items():
        times = _times(log)  # every request, /robots.txt included
        # The fastest any schedule can go under "at most 2 in any 1 s": request k (0-based)
        # cannot come before request k-2 plus 1 s, so the last one is at ((R-1) // 2) s.
        ideal_s = float((len(times) - 1) // 2)
        actual_s = times[-1] - times[0]
        gaps = [round(times[i + 2] - times[i], 3) for i in range(len(times) - 2)]
        figures.append((host, _max_in_window(times), min(gaps), actual_s, ideal_s))
        print(f"\n{host}: {len(times)} requests, max {_max_in_window(times)} in any 1 s, "
              f"min t[i+2]-t[i] {min(gaps):.3f} s (at i={gaps.index(min(gaps))}), "
              f"first->last {actual_s:.2f} s, ideal {ideal_s:.2f} s ({actual_s / ideal_s:.1%})",
              end="")
    total_actual = sum(f[3] for f in figures)
    total_ideal = sum(f[4] for f in figures)
    all_times = _times([r for log in logs.values() for r in log])
    print(f"\noverall: sum first->last {total_actual:.2f} s vs ideal {total_ideal:.2f} s "
          f"({total_actual / total_ideal:.1%}); all sites done in {all_times[-1] - all_times[0]:.2f} s")

    done = Counter(r["url"] for r in results(redis_client))
    assert set(done) == set(urls)
    assert [u for u, n in done.items() if n != 1] == []
    assert queue_depth(amqp_channel, "failed_urls") == 0
    assert len({r["worker"] for r in results(redis_client)}) > 1  # the limit really was shared
    for host, log in logs.items():
        paths = [r.path for r in log]
        assert paths.count("/robots.txt") == 1 and len(paths) == per_site + 1, (host, paths)

    # Politeness first (never more than 2 requests in any 1 s), then efficiency (within 10%).
    over_limit = [(host, n, gap) for host, n, gap, _a, _i in figures
                  if gap < 1.0 - SITE_LOG_TOLERANCE_S]
    assert over_limit == [], "(host, max requests in 1 s, min t[i+2]-t[i])"
    too_slow = [(host, round(actual_s, 2), ideal_s) for host, _n, _g, actual_s, ideal_s in figures
                if actual_s > 1.10 * ideal_s]
    assert too_slow == [], "(host, first->last s, ideal s)"
    assert total_actual <= 1.10 * total_ideal


def test_an_over_limit_domain_is_delayed_not_dropped_and_does_not_hold_up_another(
        settings, redis_client, amqp_channel):
    # The sites in a process of their own, as in the four-worker test: in the pytest process a
    # site now and then logged robots.txt late, which read as a short first gap (a CI run).
    with SitesProcess(2, "127.0.0.31", pages=40) as sites:
        fast_host, slow_host = sites.hosts  # sites 0 and 1
        limited = load_settings({"RABBITMQ_URL": settings.rabbitmq_url,
                                 "REDIS_URL": settings.redis_url, **TEST_ENV,
                                 "RATE_LIMITS": f"{slow_host}=1/second"})
        slow_urls = [sites.page_url(1, n) for n in range(1, 7)]
        fast_urls = [sites.page_url(0, n) for n in range(1, 31)]
        # The slow domain first: its URLs reach the worker before the fast ones.
        _seed(settings, redis_client, slow_urls)
        _seed(settings, redis_client, fast_urls)

        _run_worker(limited, idle_exit_s=2.0, concurrency=4)
        logs = sites.stop()

    done = Counter(r["url"] for r in results(redis_client))
    assert set(done) == set(slow_urls + fast_urls) and max(done.values()) == 1
    slow_times, fast_times = _times(logs[slow_host]), _times(logs[fast_host])
    gaps = [round(b - a, 3) for a, b in zip(slow_times, slow_times[1:], strict=False)]
    assert min(gaps) >= 1.0 - SERVER_GAP_TOLERANCE_S, gaps
    assert len(slow_times) == 7 and len(fast_times) == 31  # robots.txt + pages
    # Every fast page was fetched before the slow site had seen its third request (~2 s in).
    assert fast_times[-1] < slow_times[2], (fast_times[-1] - slow_times[0], gaps)
    assert _counters(redis_client).get("rate_limited", 0) > 0
    assert queue_depth(amqp_channel, "failed_urls") == 0
    for name in (topology.NORMAL_QUEUE, topology.PRIORITY_QUEUE,
                 *(topology.hold_name(level) for level in topology.HOLD_LEVELS_MS)):
        assert queue_depth(amqp_channel, name) == 0, name


# -- robots.txt ------------------------------------------------------------------------------


def _private_page(record: RequestRecord) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "text/html; charset=utf-8"}, (
        f"<html><head><title>secret {record.path}</title></head><body>no</body></html>".encode())


def test_disallowed_urls_are_dead_lettered_unfetched_and_robots_txt_is_fetched_once(
        settings, redis_client, amqp_channel, own_sites):
    site = TestSite("127.0.0.3", pages=30,
                    robots_txt="User-agent: *\nDisallow: /private\n").start()
    own_sites.append(site)
    private = [site.url(f"/private/{n}") for n in range(1, 5)]
    for url in private:
        site.route(url[len(site.base_url):], _private_page)
    allowed = [site.page_url(n) for n in range(1, 21)]
    _seed(settings, redis_client, [*private[:2], *allowed, *private[2:]])

    first, second = (WorkerThread(settings.with_overrides(idle_exit_s=1.5, concurrency=4,
                                                          worker_id=f"robots-{i}"))
                     for i in range(2))
    with first, second:
        assert first.join(60) == 0 and second.join(60) == 0

    robots_requests = site.requests_for("/robots.txt")
    assert len(robots_requests) == 1, [(r.monotonic_s, r.method, r.client, r.user_agent)
                                       for r in robots_requests]
    assert site.requests_for("/private") == []
    records = results(redis_client)
    assert sorted(r["url"] for r in records) == sorted(allowed)
    dead = drain(amqp_channel, "failed_urls")
    assert sorted(WorkMessage.from_json(body).url for _m, _p, body in dead) == sorted(private)
    assert {p.headers["reason"] for _m, p, _b in dead} == {"robots_disallowed"}
    counters = _counters(redis_client)
    assert counters.get("robots_blocked") == 4
    assert counters.get("dead_lettered:robots_disallowed") == 4
    # Both workers took part, so "once" held across workers, not just inside one.
    assert {r["worker"] for r in records} == {"robots-0", "robots-1"}


def test_crawl_delay_spaces_requests_to_the_site_even_under_a_generous_rate_limit(
        settings, redis_client, own_sites):
    site = TestSite("127.0.0.4", pages=10, robots_txt="User-agent: *\nCrawl-delay: 1\n").start()
    own_sites.append(site)
    urls = [site.page_url(n) for n in range(1, 4)]
    _seed(settings, redis_client, urls)

    _run_worker(settings, idle_exit_s=2.0, concurrency=4)  # RATE_LIMIT is 1000/second here

    assert sorted(r["url"] for r in results(redis_client)) == sorted(urls)
    log = sorted(site.log, key=lambda r: r.monotonic_s)
    gaps = [round(b.monotonic_s - a.monotonic_s, 3) for a, b in zip(log, log[1:], strict=False)]
    assert min(gaps) >= 1.0 - SERVER_GAP_TOLERANCE_S, list(zip([r.path for r in log], [0, *gaps],
                                                             strict=True))
    assert len(log) == 4  # robots.txt + 3 pages
    assert _counters(redis_client).get("rate_limited", 0) > 0


def test_a_missing_robots_txt_allows_every_url(settings, redis_client, amqp_channel, site):
    urls = [site.page_url(n) for n in range(1, 6)]
    _seed(settings, redis_client, urls)

    _run_worker(settings, idle_exit_s=1.0, concurrency=4)

    assert sorted(r["url"] for r in results(redis_client)) == sorted(urls)
    assert site.count("/robots.txt") == 1
    assert sorted(r.path for r in site.requests_for("/page/")) == sorted(
        f"/page/{n}" for n in range(1, 6))
    assert queue_depth(amqp_channel, "failed_urls") == 0
    assert _counters(redis_client).get("robots_blocked", 0) == 0


def test_an_unavailable_robots_txt_holds_the_url_back_then_gives_up_after_the_retries(
        settings, redis_client, amqp_channel, own_sites):
    site = TestSite("127.0.0.5", pages=5).start()
    own_sites.append(site)
    site.route("/robots.txt", lambda _r: (503, {"Content-Type": "text/plain"}, b"down"))
    url = site.page_url(1)
    _seed(settings, redis_client, [url])

    _run_worker(settings, idle_exit_s=1.0, concurrency=2, max_retries=2, retry_base_s=0.05)

    assert site.requests_for("/page/") == []  # never fetched without robots.txt
    assert site.count("/robots.txt") >= 1
    assert results(redis_client) == []
    counters = _counters(redis_client)
    assert counters.get("retries") == 2  # parked and retried, not dropped at once
    assert counters.get("dead_lettered:max_retries") == 1
    [(_method, props, body)] = drain(amqp_channel, "failed_urls")
    assert WorkMessage.from_json(body).url == url
    assert props.headers["reason"] == "max_retries"
    assert props.headers["failure"] == "robots_unavailable"
    assert "503" in props.headers["last_error"]
    for name in (topology.NORMAL_QUEUE,
                 *(topology.hold_name(level) for level in topology.HOLD_LEVELS_MS)):
        assert queue_depth(amqp_channel, name) == 0, name


# -- the response cache ----------------------------------------------------------------------
# A URL's outcome is recorded once (the done-set, NOTES.md #14): a plain redelivery of a done URL
# is acked before the cache is even read. To reach the cache, the tests clear the URL's done mark
# the way DLQ replay does (common/ops/dlq.py), then deliver it again within CACHE_TTL_S.


def _crawl_once(settings, redis_client, url: str) -> dict:
    _seed(settings, redis_client, [url])
    _run_worker(settings, idle_exit_s=1.0, concurrency=2)
    [record] = results(redis_client)
    assert record["url"] == url
    return record


def _deliver_again(settings, redis_client, url: str, *, clear_done_mark: bool) -> None:
    """Send ``url`` once more (the seen-set stops the producer, so publish directly)."""
    if clear_done_mark:
        done = SeenSet(redis_client, settings.seen_buckets, prefix=DONE_PREFIX)
        assert done.remove_many([fingerprint(url)]) == 1
    publish_raw(settings, topology.NORMAL_QUEUE, [WorkMessage(url=url).to_json()])
    _run_worker(settings, idle_exit_s=1.0, concurrency=2)


def test_a_url_delivered_again_within_the_cache_ttl_is_answered_from_the_cache(
        settings, redis_client, site):
    url = site.page_url(7)
    first = _crawl_once(settings, redis_client, url)
    site.clear_log()

    _deliver_again(settings, redis_client, url, clear_done_mark=True)

    assert site.log == []  # no request at all, robots.txt included
    assert len(results(redis_client)) == 2
    second = results(redis_client)[-1]
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["url"] == url and second["status"] == 200
    assert second["title"] == first["title"] == "Page 7"
    assert second["content_hash"] == first["content_hash"]
    counters = _counters(redis_client)
    assert counters.get("cache_hits") == 1 and counters.get("cache_misses") == 1


def test_with_a_zero_cache_ttl_a_url_delivered_again_is_fetched_again(settings, redis_client,
                                                                      site):
    url = site.page_url(8)
    no_cache = settings.with_overrides(cache_ttl_s=0)
    first = _crawl_once(no_cache, redis_client, url)
    site.clear_log()

    _deliver_again(no_cache, redis_client, url, clear_done_mark=True)

    assert [r.path for r in site.log] == ["/page/8"]
    assert len(results(redis_client)) == 2
    second = results(redis_client)[-1]
    assert (first["cached"], second["cached"]) == (False, False)
    assert redis_client.exists(content_key(url)) == 0
    counters = _counters(redis_client)
    assert counters.get("cache_hits", 0) == 0 and counters.get("cache_misses", 0) == 0


def test_a_redelivered_url_that_is_already_done_sends_no_request_and_gets_no_second_result(
        settings, redis_client, site):
    url = site.page_url(9)
    _crawl_once(settings, redis_client, url)
    site.clear_log()

    _deliver_again(settings, redis_client, url, clear_done_mark=False)

    assert site.log == []
    assert [r["url"] for r in results(redis_client)] == [url]
    assert _counters(redis_client).get("cache_hits", 0) == 0
