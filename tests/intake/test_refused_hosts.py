"""URLs the fetch address guard blocks: ``produce`` refuses them without marking them seen and
says how to allow them, and a URL a worker dead-letters as ``fetch_blocked`` is released, so
producing it again once its network is allowed fetches it. Loopback only: refusals are shown
with loopback addresses and names left out of FETCH_ALLOW_NETWORKS (no other address is ever
connected to)."""

from __future__ import annotations

import json

import pytest

from common.broker import topology
from common.core.urls import fingerprint
from common.intake.producer import Producer
from common.store.dedupe import DoneSet, SeenSet
from devtools.testsite import TestSite
from tests.helpers import WorkerThread, queue_depth, results, wait_for


@pytest.fixture
def blocked_site():
    with TestSite("127.0.0.13", pages=5) as site:
        yield site


def _seen(settings, redis_client, urls: list[str]) -> list[bool]:
    return SeenSet(redis_client, settings.seen_buckets).contains_many(
        [fingerprint(url) for url in urls])


def test_urls_whose_host_the_guard_blocks_are_refused_reported_and_not_marked_seen(
        settings, redis_client, run_cli, amqp_channel):
    allowed = "http://127.0.0.5:9/ok"  # only enqueued: no worker runs
    literal = "http://127.0.0.6:9/literal"
    named = "http://localhost:9/named"  # resolves to loopback, which the guard blocks
    unresolvable = "http://no-such-host.invalid/"  # left to the workers' guard
    produced = run_cli("producer.py", allowed, literal, named, unresolvable, "--json",
                       env={"FETCH_ALLOW_NETWORKS": "127.0.0.5/32"})
    assert produced.returncode == 1, produced.stderr[-2000:]  # not every URL was queued
    summary = json.loads(produced.stdout)
    assert (summary["new"], summary["refused"], summary["duplicate"]) == (2, 2, 0)
    hint = produced.stderr
    assert "refused 2 URL(s)" in hint and literal in hint and named in hint
    assert "FETCH_ALLOW_NETWORKS=127.0.0.0/8" in hint
    assert "scrape-fleet up --allow-network 127.0.0.0/8" in hint
    assert "produce them again" in hint
    assert _seen(settings, redis_client, [allowed, literal, named, unresolvable]) == [
        True, False, False, True]
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 2

    plain = run_cli("producer.py", literal, env={"FETCH_ALLOW_NETWORKS": ""})
    assert "refused=1" in plain.stdout and "new=0" in plain.stdout, plain.stdout


def test_refused_urls_produced_again_once_their_network_is_allowed_are_fetched_once(
        settings, redis_client, run_cli, blocked_site):
    urls = [blocked_site.page_url(n) for n in range(1, 5)]
    refused = run_cli("producer.py", *urls, "--json", env={"FETCH_ALLOW_NETWORKS": ""})
    assert json.loads(refused.stdout)["refused"] == 4, refused.stdout
    again = run_cli("producer.py", *urls, "--json")  # TEST_ENV allows 127.0.0.0/8
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["new"] == 4, "refused URLs stayed seen"
    with WorkerThread(settings.with_overrides(idle_exit_s=1.5)) as worker:
        assert worker.join(60) == 0
    assert sorted(r["url"] for r in results(redis_client)) == sorted(urls)
    assert all(blocked_site.count(f"/page/{n}") == 1 for n in range(1, 5))


def test_a_url_dead_lettered_as_fetch_blocked_is_released_and_fetched_when_produced_again(
        settings, redis_client, amqp_channel, blocked_site):
    """The producer's look is not the last word (a name may resolve differently at the
    worker, a producer may not check): the worker's guard refuses, and the URL is released."""
    url = blocked_site.page_url(2)
    with Producer(settings, redis_client) as producer:  # allows 127.0.0.0/8, no host check
        assert producer.submit([url]).new == 1
    blocked = settings.with_overrides(fetch_allow_networks=(), idle_exit_s=1.5)
    with WorkerThread(blocked) as worker:
        assert wait_for(lambda: redis_client.xlen("failures") == 1, timeout_s=30)
        assert worker.join(60) == 0
    [failure] = [json.loads(fields[b"json"]) for _id, fields in redis_client.xrange("failures")]
    assert failure["url"] == url and failure["failure"] == "fetch_blocked"
    assert queue_depth(amqp_channel, topology.FAILED_QUEUE) == 1
    assert _seen(settings, redis_client, [url]) == [False], "the seen mark was not released"
    assert not DoneSet(redis_client, settings.seen_buckets).contains(
        DoneSet(redis_client, settings.seen_buckets).mark_for(url))
    assert blocked_site.log == []

    with Producer(settings, redis_client) as producer:
        assert producer.submit([url]).new == 1, "produced again after allowing: a duplicate"
    with WorkerThread(settings.with_overrides(idle_exit_s=1.5)) as worker:
        assert worker.join(60) == 0
    assert [r["url"] for r in results(redis_client)] == [url]
    assert blocked_site.count("/page/2") == 1
