"""``scrape-fleet status`` on a Redis Cluster (issue 31 follow-up): every shard's part read.

Real processes on loopback: a Redis Cluster of 3 primaries with a replica each, the session
RabbitMQ, four test sites whose domains fall on more than one primary, one worker that knows
Redis only as ``redis+cluster://``. After a 40-page crawl, ``stats.py --json`` and the table
give the single-node answers: every result counted once, across the results stream's parts.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest
import redis

from common.core.config import load_settings
from common.intake.producer import Producer
from common.ops import status_counts
from common.store import slots
from common.store.connection import connect_redis
from common.store.keys import RESULTS_STREAM
from devtools.services import reset_state
from devtools.testsite import TestSite, running_sites
from tests.helpers import TEST_ENV, output_of, start_worker_process, wait_for

#: 127.0.0.7 .. 127.0.0.10: their domain shards are on more than one primary.
SITES, PAGES, FIRST_HOST = 4, 10, "127.0.0.7"


@pytest.fixture
def sites() -> Iterator[list[TestSite]]:
    with running_sites(SITES, first_host=FIRST_HOST, pages=PAGES) as started:
        yield started


def _appended(client: redis.cluster.RedisCluster) -> int:
    """Results appended to every part of the results stream (the test's own count)."""
    return sum(int(client.xlen(part)) for part in slots.parts(RESULTS_STREAM)
               if client.exists(part))


def test_status_on_a_cluster_counts_every_shard_s_results_once(services, cluster, sites,
                                                                 run_cli):
    cluster.flush()
    settings = load_settings({**TEST_ENV, **cluster.env, "RABBITMQ_URL": services.rabbitmq_url})
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)  # the topology fresh
    client = connect_redis(settings)
    urls = [site.page_url(n) for site in sites for n in range(1, PAGES + 1)]
    with Producer(settings, client) as producer:
        assert producer.submit(urls).new == len(urls)
    worker = start_worker_process(settings, "--concurrency", "4",
                                  env={**cluster.env, "WORKER_ID": "status-cluster-w1"})
    try:
        assert wait_for(lambda: _appended(client) >= len(urls), 60), output_of(worker)[-3000:]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    shards = {part for part in slots.parts(RESULTS_STREAM) if client.exists(part)}
    assert len(shards) > 1, "the crawl's results span several shards' parts"

    result = run_cli("stats.py", "--json", env=cluster.env)
    assert result.returncode == 0, result.stderr[-3000:]
    snapshot = json.loads(result.stdout)
    assert snapshot["results"] == len(urls)
    assert snapshot["results_detail"]["in_stream"] == len(urls)
    assert snapshot["seen"] == len(urls)
    progress = snapshot["progress"]
    assert (progress["done"], progress["failed"], progress["to_do"], progress["total"],
            progress["state"]) == (len(urls), 0, 0, len(urls), "done"), progress
    assert progress["pages_per_s"] > 0, "the rate reads every part's entries"
    assert snapshot["dead_letters"]["now"] == 0
    counted = snapshot["counters"]  # stats:counters' shard parts, summed
    assert counted.get("cache_misses", 0) + counted.get("cache_hits", 0) == len(urls), counted

    text = run_cli("stats.py", env=cluster.env)
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"results: {len(urls)} recorded" in text.stdout, text.stdout

    merged = status_counts.counters(client)
    shard_parts = sum(int(client.hlen(part)) for part in slots.parts("stats:counters"))
    assert shard_parts > 0, "the record script wrote its shards' parts of stats:counters"
    assert merged.get("cache_misses", 0) + merged.get("cache_hits", 0) >= len(urls), merged
