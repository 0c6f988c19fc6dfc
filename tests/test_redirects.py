"""Redirects under the same rules as every request (common/work/redirects.py), against real
RabbitMQ and Redis and loopback sites: a hop to another host waits for that host's robots.txt
and rate limit, scope is judged from the URL the producer accepted, credentials in a target
are never sent or recorded, chains are bounded, and a worker killed with kill -9 mid-crawl
loses no URL, original or target."""

from __future__ import annotations

import gzip
import json
import signal
from collections import Counter

import pytest

from common.broker import topology
from common.intake.producer import Producer
from common.store.keys import COUNTERS
from devtools.testsite import TestSite, start_sites
from tests.helpers import (
    WorkerThread,
    drain,
    results,
    start_worker_process,
    wait_for,
    wait_workers_ok,
)


def _seed(settings, redis_client, urls: list[str]) -> None:
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()


def _moved(target: str, status: int = 302):
    return lambda _record: (status, {"Location": target}, b"")


def _by_url(redis_client) -> dict[str, dict]:
    found = results(redis_client)
    assert len({r["url"] for r in found}) == len(found), Counter(r["url"] for r in found)
    return {r["url"]: r for r in found}


def _failures(redis_client) -> list[dict]:
    return [json.loads(f[b"json"]) for _id, f in redis_client.xrange("failures")]


def _run(settings, **overrides) -> None:
    with WorkerThread(settings.with_overrides(idle_exit_s=1.5, **overrides)) as worker:
        assert worker.join(90) == 0


def test_a_redirect_to_another_host_waits_for_that_hosts_robots_txt_and_rate_limit(
        settings, redis_client, own_sites):
    here, there = start_sites(2, robots_txt=None)
    own_sites.extend([here, there])
    there.robots_txt = "User-agent: *\nDisallow: /private\n"
    n = 8
    for i in range(n):
        here.route(f"/old/{i}", _moved(there.page_url(i + 1)))
    here.route("/secret-move", _moved(there.url("/private/1")))
    urls = [here.url(f"/old/{i}") for i in range(n)] + [here.url("/secret-move")]
    _seed(settings, redis_client, urls)
    _run(settings, rate_limit=(2, 1000), rate_limit_guard=0.0)

    by_url = _by_url(redis_client)
    for i in range(n):
        old = by_url[here.url(f"/old/{i}")]
        assert (old["status"], old["redirect_to"], old["redirect"]) == (
            302, there.page_url(i + 1), "queued")
        new = by_url[there.page_url(i + 1)]
        assert new["status"] == 200 and new["title"]
    # The other host's robots.txt came first, and its disallowed path was never asked for.
    log = there.log
    assert log[0].path == "/robots.txt"
    assert not any(r.path.startswith("/private") for r in log)
    assert [(d["url"], d["failure"]) for d in _failures(redis_client)] == [(there.url("/private/1"),
                                                          "robots_disallowed")]
    assert by_url[here.url("/secret-move")]["redirect"] == "queued"
    # The other host's own rate limit (2/s, no guard): no three of its requests within 1 s.
    times = [r.monotonic_s for r in log]
    assert len(times) == n + 1
    assert min(b - a for a, b in zip(times, times[2:], strict=False)) >= 0.95, times


def test_a_redirect_within_the_origin_is_followed_in_the_same_fetch(settings, redis_client,
                                                                    site):
    _seed(settings, redis_client, [site.url("/redirect/2")])
    _run(settings)
    [record] = results(redis_client)
    assert (record["url"], record["final_url"], record["status"], record["redirects"]) == (
        site.url("/redirect/2"), site.page_url(1), 200, 2)
    assert "redirect_to" not in record


def test_credentials_in_a_redirect_target_are_never_sent_or_recorded(settings, redis_client,
                                                                     own_sites, tmp_path):
    here, there = start_sites(2)
    own_sites.extend([here, there])
    password = "hunter2-never-sent"
    target = there.page_url(3).replace("://", f"://alice:{password}@")
    here.route("/login-move", _moved(target))
    same_origin = here.page_url(2).replace("://", f"://bob:{password}@")
    here.route("/inline-move", _moved(same_origin))
    _seed(settings, redis_client, [here.url("/login-move"), here.url("/inline-move")])
    _run(settings, archive="warc", archive_dir=str(tmp_path))

    by_url = _by_url(redis_client)
    assert by_url[here.url("/login-move")]["redirect_to"] == there.page_url(3)
    assert by_url[there.page_url(3)]["status"] == 200
    assert by_url[here.url("/inline-move")]["final_url"] == here.page_url(2)
    for record in [*here.log, *there.log]:
        assert "Authorization" not in record.headers and password not in record.path
    stored = b"".join(v for _id, f in redis_client.xrange("results") for v in f.values())
    assert password.encode() not in stored
    archived = b"".join(gzip.decompress(p.read_bytes()) for p in tmp_path.rglob("*.warc.gz"))
    assert b"Location: " + there.page_url(3).encode() in archived  # the hop, kept without them
    assert password.encode() not in archived


def test_crawl_scope_is_judged_from_the_url_the_producer_accepted(settings, redis_client,
                                                                  own_sites):
    here, elsewhere = start_sites(2)
    other_port = TestSite("127.0.0.1", pages=5).start()  # the same host, another origin
    own_sites.extend([here, elsewhere, other_port])
    here.route("/away", _moved(elsewhere.page_url(1)))
    here.route("/across", _moved(other_port.page_url(1)))
    _seed(settings, redis_client, [here.url("/away"), here.url("/across")])
    _run(settings, crawl_enabled=True, crawl_max_depth=1)

    by_url = _by_url(redis_client)
    assert by_url[here.url("/away")]["redirect"] == "out_of_scope"
    assert [r.path for r in elsewhere.log] == []  # never asked, not even robots.txt
    assert by_url[here.url("/across")]["redirect"] == "queued"
    landed = by_url[other_port.page_url(1)]
    assert landed["redirected_from"] == here.url("/across")
    # The landed page's links (on 127.0.0.1, the accepted URL's host) were followed.
    assert landed["followed"] >= 1
    assert any(url.startswith(other_port.url("/page/")) and url != other_port.page_url(1)
               for url in by_url)


def test_a_chain_of_redirects_across_hosts_ends_after_max_redirects(settings, redis_client,
                                                                    own_sites):
    a, b = start_sites(2)
    own_sites.extend([a, b])
    for i in range(10):
        (a if i % 2 == 0 else b).route(f"/hop/{i}", _moved((b if i % 2 == 0 else a)
                                                          .url(f"/hop/{i + 1}")))
    _seed(settings, redis_client, [a.url("/hop/0")])
    _run(settings, max_redirects=3)

    by_url = _by_url(redis_client)
    assert [by_url[u]["redirect"] for u in (a.url("/hop/0"), b.url("/hop/1"),
                                            a.url("/hop/2"))] == ["queued"] * 3
    assert [(d["url"], d["failure"]) for d in _failures(redis_client)] == [(b.url("/hop/3"),
                                                          "fetch_too_many_redirects")]
    assert not any(r.path == "/hop/4" for r in a.log)


def test_a_target_already_seen_is_not_fetched_twice(settings, redis_client, own_sites):
    here, there = start_sites(2)
    own_sites.extend([here, there])
    for i in range(3):
        here.route(f"/alias/{i}", _moved(there.page_url(1)))
    _seed(settings, redis_client, [here.url(f"/alias/{i}") for i in range(3)])
    _run(settings, concurrency=1)

    by_url = _by_url(redis_client)
    outcomes = sorted(by_url[here.url(f"/alias/{i}")]["redirect"] for i in range(3))
    assert outcomes == ["duplicate", "duplicate", "queued"]
    assert there.count("/page/1") == 1


@pytest.mark.slow
def test_a_worker_killed_while_handing_off_redirects_loses_no_url(settings, redis_client,
                                                                  own_sites, amqp_channel):
    n = 200
    here, there = start_sites(2, pages=n)
    own_sites.extend([here, there])
    for i in range(n):
        here.route(f"/m/{i}", _moved(there.url(f"/page/{i + 1}")))
    urls = [here.url(f"/m/{i}") for i in range(n)]
    _seed(settings, redis_client, urls)
    env = {"RATE_LIMIT": "150/second"}
    first = start_worker_process(settings, "--concurrency", "4", env={**env, "WORKER_ID": "k1"})
    assert wait_for(lambda: redis_client.xlen("results") >= n // 3, timeout_s=60)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    second = start_worker_process(settings, "--idle-exit", "2", "--concurrency", "4",
                                  env={**env, "WORKER_ID": "k2"})
    wait_workers_ok([second], 120)

    by_url = _by_url(redis_client)  # asserts one record per URL
    targets = [there.url(f"/page/{i + 1}") for i in range(n)]
    assert set(by_url) == set(urls) | set(targets)
    assert {by_url[u]["redirect"] for u in urls} <= {"queued", "duplicate"}
    assert all(by_url[t]["status"] == 200 for t in targets)
    assert redis_client.xlen("failures") == 0
    assert drain(amqp_channel, topology.FAILED_QUEUE) == []
    assert not [k for k in redis_client.hkeys(COUNTERS) if k.startswith(b"dead_lettered")]
    print(f"{len(urls)} redirects, {sum(by_url[u]['redirect'] == 'duplicate' for u in urls)} "
          "found their target already queued after the kill")
