"""A Redis primary killed mid-crawl (issue 14): the fleet follows Sentinel to the new primary.

Real processes on loopback: a Redis primary with two replicas and three sentinels (the
session's ``sentinel_group``), the session RabbitMQ, a farm of three test sites, two worker
processes that know Redis only through REDIS_SENTINELS and ack a result only once a replica
has it (REDIS_MIN_REPLICAS=1). The primary is ``kill -9``-ed when a third of the farm is
crawled. Then: the sentinels promote a replica, the workers' next connections go there and
the crawl goes on within seconds; every URL ends with exactly one result (or a dead letter),
none twice; the seen-set survived, so the same URLs seeded again are all duplicates.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from common.broker import topology
from common.core.config import Settings, load_settings
from common.core.errors import REDIS_UNAVAILABLE
from common.core.urls import canonicalize
from common.intake.producer import Producer
from common.store.connection import connect_redis
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM
from devtools.services import reset_state
from devtools.services.redis_sentinel import SentinelGroup
from devtools.testsite import TestSite, running_sites
from tests.helpers import (
    TEST_ENV,
    drain,
    output_of,
    own_channel,
    queue_depth,
    results,
    start_worker_process,
    stop_workers,
    wait_for,
)

SITES, PAGES = 3, 150
LATENCY_S = 0.1  # a page takes a while: the crawl lasts long enough to be cut in the middle
WORKERS, CONCURRENCY = 2, 4
#: Longest the fleet may take, from the new primary's promotion, to record a result again.
RESUME_WITHIN_S = 10.0
PENDING_QUEUES = (*topology.WORK_QUEUES, *(topology.hold_name(level)
                                           for level in topology.HOLD_LEVELS_MS),
                  topology.EXPIRED_QUEUE)


@pytest.fixture
def farm() -> Iterator[list[TestSite]]:
    with running_sites(SITES, pages=PAGES, latency_s=LATENCY_S) as sites:
        yield sites


def _recorded(client: redis.Redis) -> int:
    """Results and failure records: every URL's outcome is in one of the two streams (0 while
    the test's own client still meets the old primary's closed connections)."""
    try:
        return int(client.xlen(RESULTS_STREAM)) + int(client.xlen(FAILURES_STREAM))
    except REDIS_UNAVAILABLE:
        return 0


def _first_result_after(client: redis.Redis, when: float) -> float | None:
    """The time (from its stream id) of the first result appended after ``when``."""
    try:
        entries = client.xrange(RESULTS_STREAM, min=f"{int(when * 1000)}-0", max="+", count=1)
    except REDIS_UNAVAILABLE:
        return None
    if not entries:
        return None
    entry_id = entries[0][0].decode()
    return int(entry_id.split("-")[0]) / 1000


def _rate(client: redis.Redis, start: float, end: float) -> float:
    """Results per second appended between ``start`` and ``end`` (stream ids' clock)."""
    entries = client.xrange(RESULTS_STREAM, min=f"{int(start * 1000)}-0",
                            max=f"{int(end * 1000)}-0")
    return len(entries) / max(end - start, 1e-3)


@pytest.mark.slow
def test_a_killed_redis_primary_is_followed_through_sentinel_and_no_result_is_lost_or_doubled(
        services, sentinels, farm):
    fleet_env = {**sentinels.env, "REDIS_MIN_REPLICAS": "1", "REDIS_WAIT_TIMEOUT_MS": "1000",
                 "PRESSURE_CHECK_S": "0.5"}
    settings: Settings = load_settings({**TEST_ENV, **fleet_env,
                                        "RABBITMQ_URL": services.rabbitmq_url})
    reset_state(services.rabbitmq_url, sentinels.url)  # the topology fresh, Redis empty
    client = connect_redis(settings)  # the test's own view goes through Sentinel too
    urls = [site.page_url(n) for site in farm for n in range(1, PAGES + 1)]
    with Producer(settings, client) as producer:
        assert producer.submit(urls).new == len(urls)

    workers = [start_worker_process(settings, "--concurrency", str(CONCURRENCY),
                                    env={**fleet_env, "WORKER_ID": f"failover-w{i}"})
               for i in range(WORKERS)]
    try:
        started = time.time()
        assert wait_for(lambda: _recorded(client) >= len(urls) // 3, 120), \
            [output_of(w)[-2000:] for w in workers]
        old = sentinels.primary_address()
        before = _rate(client, started, time.time())
        killed_at = sentinels.kill_primary()
        new, promoted_at = sentinels.wait_for_failover(old, timeout_s=30)
        assert new != old

        assert wait_for(lambda: _first_result_after(client, promoted_at) is not None, 30), \
            "no result since the failover"
        resumed_at = _first_result_after(client, promoted_at) or 0.0
        assert wait_for(lambda: _recorded(client) >= len(urls), 180), \
            _diagnosis(settings, client, sentinels, workers)
        finished_at = time.time()
        time.sleep(1.0)  # a second result for some URL would show up now
        logs = stop_workers(workers)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=10)

    # The fleet was back within seconds of the promotion.
    assert resumed_at - promoted_at < RESUME_WITHIN_S, (killed_at, promoted_at, resumed_at)
    # Exactly one outcome per URL: a result, or (none expected here) a dead letter.
    per_url = Counter(record["url"] for record in results(client))
    with own_channel(settings) as channel:
        dead = [canonicalize(_url_of(body)) for _m, _p, body in
                drain(channel, topology.FAILED_QUEUE)]
        left = {name: queue_depth(channel, name) for name in PENDING_QUEUES}
    assert [url for url, count in per_url.items() if count > 1] == [], "no URL twice"
    assert dead == [], dead
    assert per_url == Counter(canonicalize(url) for url in urls), "nothing lost"
    assert set(left.values()) == {0}, left
    # The seen-set came through the failover: the same URLs again are all duplicates.
    with Producer(settings, client) as producer:
        again = producer.submit(urls)
    assert (again.new, again.duplicate) == (0, len(urls)), again.line()
    after = _rate(client, resumed_at, finished_at)
    print(f"\nkill -9 of the primary -> new primary in {promoted_at - killed_at:.1f} s; first "
          f"result {resumed_at - promoted_at:.2f} s after the promotion "
          f"({resumed_at - killed_at:.1f} s after the kill); {before:.0f} pages/s before, "
          f"{after:.0f} after; {len(per_url)} URLs, one result each; deliveries held "
          f"{logs.count('holding delivery')} times ({logs.count('not acked, waiting')} for WAIT, "
          f"{logs.count('returning the delivery')} given back), "
          f"{logs.count('already_done')} redelivered ones already done")


def _diagnosis(settings: Settings, client: redis.Redis, sentinels: SentinelGroup,
               workers: list) -> str:
    """What a stalled crawl left: outcomes, queues, what the sentinels say, the workers' logs
    without their per-page lines."""
    with own_channel(settings) as channel:
        depths = {name: queue_depth(channel, name)
                  for name in (*PENDING_QUEUES, topology.FAILED_QUEUE)}
    roles = [(s.master_state()["ip"], s.master_state()["port"]) for s in sentinels.sentinels]
    logs = ["\n".join(line for line in output_of(w).splitlines() if " -> result " not in line)
            [-3000:] for w in workers]
    return f"recorded {_recorded(client)}; queues {depths}; sentinels name {roles}\n" + \
        "\n".join(logs)


def _url_of(body: bytes) -> str:
    return json.loads(body)["url"]
