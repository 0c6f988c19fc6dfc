"""URLs the fetch address guard blocks: ``produce`` refuses them without marking them seen and
says how to allow them, and a URL a worker dead-letters as ``fetch_blocked`` is released, so
producing it again once its network is allowed fetches it. Loopback only: refusals are shown
with loopback addresses and names left out of FETCH_ALLOW_NETWORKS (no other address is ever
connected to)."""

from __future__ import annotations

import ipaddress
import json

import pytest

from common.broker import topology
from common.core.urls import fingerprint
from common.intake.producer import Producer
from common.store.dedupe import DoneSet, SeenSet
from devtools.testsite import TestSite
from tests.helpers import WorkerThread, queue_depth, results, wait_for
from tests.intake.sitemap_bodies import urlset


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
    assert "FETCH_ALLOW_NETWORKS=127.0.0.5/32,127.0.0.0/8 " in hint  # added to what is set
    assert "scrape-fleet up --allow-network 127.0.0.0/8`" in hint
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


def test_a_producer_checks_hosts_against_the_networks_the_live_workers_allow_not_its_own(
        settings, redis_client, run_cli, blocked_site):
    """FETCH_ALLOW_NETWORKS set on the scrapers only (compose-e2e's override does): the
    workers' heartbeats say what they allow, and the producer goes by that."""
    urls = [blocked_site.page_url(n) for n in range(1, 3)]
    workers = settings.with_overrides(idle_exit_s=3.0, heartbeat_interval_s=0.2,
                                      fetch_allow_networks=(ipaddress.ip_network("127.0.0.13/32"),))
    with WorkerThread(workers) as worker:
        assert wait_for(lambda: redis_client.keys("workers:*"), 10)
        produced = run_cli("producer.py", *urls, "--json", env={"FETCH_ALLOW_NETWORKS": ""})
        assert produced.returncode == 0, produced.stderr[-2000:]
        assert json.loads(produced.stdout)["new"] == 2, produced.stdout
        assert worker.join(60) == 0
    assert sorted(r["url"] for r in results(redis_client)) == sorted(urls)
    # No worker alive: the producer's own setting decides again.
    alone = run_cli("producer.py", blocked_site.page_url(3), "--json",
                    env={"FETCH_ALLOW_NETWORKS": ""})
    assert json.loads(alone.stdout)["refused"] == 1, alone.stdout


def test_a_seed_dead_lettered_as_fetch_blocked_is_released_and_fetched_when_produced_again(
        settings, redis_client, amqp_channel, blocked_site):
    """The producer's look is not the last word (a name may resolve differently at the
    worker, dlq replay does not look): the worker's guard refuses, and a seed is released. A
    link keeps its marks: other pages linking it would each dead-letter it again."""
    site, seed, link = blocked_site, blocked_site.page_url(2), blocked_site.page_url(3)
    with TestSite("127.0.0.14", pages=1) as allowed_site:
        allowed_site.route("/page/1", lambda _r: (
            200, {"Content-Type": "text/html"}, f'<a href="{link}">b</a>'.encode()))
        with Producer(settings, redis_client) as producer:  # no host check, as dlq replay
            assert producer.submit([seed, allowed_site.page_url(1)]).new == 2
        blocked = settings.with_overrides(
            fetch_allow_networks=(ipaddress.ip_network("127.0.0.14/32"),), idle_exit_s=1.5,
            crawl_enabled=True, crawl_allowed_domains="127.0.0.13,127.0.0.14")
        with WorkerThread(blocked) as worker:
            assert wait_for(lambda: redis_client.xlen("failures") == 2, timeout_s=30)
            assert worker.join(60) == 0
    failures = {json.loads(fields[b"json"])["url"]: json.loads(fields[b"json"])
                for _id, fields in redis_client.xrange("failures")}
    assert set(failures) == {seed, link}
    assert {f["failure"] for f in failures.values()} == {"fetch_blocked"}
    assert queue_depth(amqp_channel, topology.FAILED_QUEUE) == 2
    done = DoneSet(redis_client, settings.seen_buckets)
    assert _seen(settings, redis_client, [seed, link]) == [False, True], \
        "the seed's seen mark released, the link's kept"
    assert [done.contains(done.mark_for(url)) for url in (seed, link)] == [False, True]
    assert site.log == []

    with Producer(settings, redis_client) as producer:
        assert producer.submit([seed]).new == 1, "produced again after allowing: a duplicate"
    with WorkerThread(settings.with_overrides(idle_exit_s=1.5)) as worker:
        assert worker.join(60) == 0
    assert seed in [r["url"] for r in results(redis_client)]
    assert site.count("/page/2") == 1


def test_sitemap_urls_whose_host_the_guard_blocks_are_refused_with_the_same_hint(
        settings, redis_client, run_cli, amqp_channel):
    with TestSite("127.0.0.15", pages=1) as site:  # the sitemap's host, allowed
        other = "http://127.0.0.16:9/blocked"  # listed, blocked, never connected to
        site.route("/map.xml", lambda _r: (200, {"Content-Type": "application/xml"},
                                           urlset(site.url("/ok"), other)))
        result = run_cli("sitemap_producer.py", site.url("/map.xml"),
                         env={"FETCH_ALLOW_NETWORKS": "127.0.0.15/32"})
    assert result.returncode == 1, result.stderr[-2000:]
    assert "new=1" in result.stdout and "refused=1" in result.stdout, result.stdout
    assert other in result.stderr and "FETCH_ALLOW_NETWORKS=127.0.0.15/32,127.0.0.0/8 " in result.stderr
    assert _seen(settings, redis_client, [other]) == [False]
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 1
