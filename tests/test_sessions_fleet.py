"""Cookies and sessions through the whole fleet (issue 28's Done when): real RabbitMQ and Redis,
``worker.py`` processes, loopback sites with custom routes, judged by the sites' request logs,
the results and failures streams and the WARC files.

A cookie-walled site (its first page sets a cookie, every other page answers 403 without it)
is crawled completely by two workers sharing the jar, each page fetched once, while a second
site of the same crawl never gets a Cookie header; a site that burns some of the sessions of a
pool of three gets every page through the others, none dead-lettered; kill -9 of a worker
mid-crawl of the cookie wall leaves every URL exactly one outcome; WARC records keep no cookie
value unless ARCHIVE_KEEP_COOKIES=true.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import signal
import threading
from collections import Counter

import pytest

from common.broker import topology
from common.intake.producer import Producer
from devtools.testsite import RequestRecord, TestSite, start_sites
from tests.helpers import (
    drain,
    output_of,
    results,
    start_worker_process,
    wait_for,
    wait_workers_ok,
)

pytestmark = pytest.mark.slow

SECRET = "w4ll-s3cr3t-7f1c"  # the wall's cookie value: never in a log, a record or a WARC
CRAWL = {"CRAWL_ENABLED": "true", "CRAWL_MAX_DEPTH": "3"}


def _page(title: str, links: list[str]) -> bytes:
    anchors = "".join(f'<a href="{href}">{href}</a> ' for href in links)
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head>"
            f"<body><h1>{title}</h1>{anchors}</body></html>").encode()


def _html(status: int, body: bytes, **headers: str) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "text/html; charset=utf-8", **headers}, body


def _wall(site: TestSite, n: int) -> list[str]:
    """``/wall/0`` sets the cookie and links every page; the others answer 403 without it."""
    def handler(i: int):  # noqa: ANN202
        def respond(record: RequestRecord):  # noqa: ANN202
            links = [f"/wall/{j}" for j in range(1, n)] if i == 0 else \
                [f"/wall/{(i * 7 + k) % n}" for k in range(1, 4)]
            if i == 0:
                return _html(200, _page("wall 0", links),
                             **{"Set-Cookie": f"wall={SECRET}; Path=/; HttpOnly; SameSite=Lax"})
            if f"wall={SECRET}" not in record.headers.get("Cookie", ""):
                return _html(403, _page("forbidden", []))
            return _html(200, _page(f"wall {i}", links))
        return respond

    for i in range(n):
        site.route(f"/wall/{i}", handler(i))
    return [site.url(f"/wall/{i}") for i in range(n)]


def _seed(settings, redis_client, urls: list[str]) -> None:
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()


def _failures(redis_client) -> list[dict]:
    return [json.loads(f[b"json"]) for _id, f in redis_client.xrange("failures")]


def _one_each(redis_client) -> dict[str, dict]:
    found = results(redis_client)
    counts = Counter(r["url"] for r in found)
    assert all(c == 1 for c in counts.values()), counts.most_common(3)
    return {r["url"]: r for r in found}


def _workers(settings, n: int, env: dict[str, str], *args: str) -> list:
    return [start_worker_process(settings, "--idle-exit", "3", *args,
                                 env={**env, "WORKER_ID": f"s{i}"}) for i in range(n)]


def test_a_cookie_walled_site_is_crawled_whole_by_two_workers_and_no_cookie_crosses_sites(
        settings, redis_client, own_sites, amqp_channel):
    wall, other = start_sites(2, pages=10)
    own_sites.extend([wall, other])
    n = 40
    urls = _wall(wall, n)
    # The other site sets a cookie of its own: it must come back to it, and only to it.
    other.route("/", lambda _r: _html(200, _page("other", [f"/page/{i}" for i in range(1, 11)]),
                                      **{"Set-Cookie": "mine=1; Path=/"}))
    _seed(settings, redis_client, [urls[0], other.url("/")])
    procs = _workers(settings, 2, CRAWL)
    wait_workers_ok(procs, 120)

    by_url = _one_each(redis_client)
    assert {u: by_url[u]["status"] for u in urls} == dict.fromkeys(urls, 200)
    assert [by_url[u]["title"] for u in urls] == [f"wall {i}" for i in range(n)]
    fetched = Counter(r.path for r in wall.log if r.path.startswith("/wall/"))
    assert fetched == Counter({f"/wall/{i}": 1 for i in range(n)})  # each once, none refused
    assert all(f"wall={SECRET}" in r.headers.get("Cookie", "")
               for r in wall.log if r.path.startswith("/wall/") and r.path != "/wall/0")
    other_pages = [r for r in other.log if r.path.startswith("/page/")]
    assert len(other_pages) == 10
    assert all(r.headers.get("Cookie") == "mine=1" for r in other_pages)
    assert all(SECRET not in json.dumps(r.headers) for r in other.log)
    assert all("mine=1" not in r.headers.get("Cookie", "") for r in wall.log)
    assert _failures(redis_client) == []
    assert drain(amqp_channel, topology.FAILED_QUEUE) == []
    stored = b"".join(v for _id, f in redis_client.xrange("results") for v in f.values())
    assert SECRET.encode() not in stored
    for proc in procs:
        assert SECRET not in output_of(proc)


def test_a_site_burning_sessions_gets_every_page_through_the_remaining_ones(
        settings, redis_client, own_sites, amqp_channel):
    [site] = start_sites(1, first_host="127.0.0.3")
    own_sites.append(site)
    issued = itertools.count(1)
    lock = threading.Lock()
    burnt = {"1", "2"}  # the first two sessions the site hands out are refused from then on
    refused: list[str] = []

    def respond(record: RequestRecord):  # noqa: ANN202
        match = re.search(r"sid=(\d+)", record.headers.get("Cookie", ""))
        if match is None:
            with lock:
                sid = str(next(issued))
            return _html(200, _page(f"page {record.path}", []),
                         **{"Set-Cookie": f"sid={sid}; Path=/"})
        if match.group(1) in burnt:
            with lock:
                refused.append(match.group(1))
            return _html(403, _page("blocked", []))
        return _html(200, _page(f"page {record.path}", []))

    n = 60
    urls = []
    for i in range(n):
        site.route(f"/b/{i}", respond)
        urls.append(site.url(f"/b/{i}"))
    _seed(settings, redis_client, urls)
    procs = _workers(settings, 2, {"SESSION_POOL_SIZE": "3", "RATE_LIMIT": "200/second"},
                     "--concurrency", "2")
    wait_workers_ok(procs, 120)

    by_url = _one_each(redis_client)
    assert {u: by_url[u]["status"] for u in urls} == dict.fromkeys(urls, 200)
    assert refused, "no request came with a burnt session: the test proved nothing"
    assert _failures(redis_client) == []
    assert drain(amqp_channel, topology.FAILED_QUEUE) == []
    retried = Counter(r.path for r in site.log if r.path.startswith("/b/"))
    assert sum(retried.values()) == n + len(refused)  # a refused page is fetched once more
    print(f"{len(refused)} answers refused to burnt sessions; every page recorded once")


def test_a_worker_killed_mid_crawl_of_a_cookie_wall_leaves_every_url_one_outcome(
        settings, redis_client, own_sites, amqp_channel):
    [wall] = start_sites(1, first_host="127.0.0.4")
    own_sites.append(wall)
    n = 150
    urls = _wall(wall, n)
    _seed(settings, redis_client, [urls[0]])
    env = {**CRAWL, "RATE_LIMIT": "60/second"}
    first = start_worker_process(settings, "--concurrency", "4", env={**env, "WORKER_ID": "k1"})
    assert wait_for(lambda: redis_client.xlen("results") >= n // 3, timeout_s=90)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    second = start_worker_process(settings, "--idle-exit", "3", "--concurrency", "4",
                                  env={**env, "WORKER_ID": "k2"})
    wait_workers_ok([second], 120)

    by_url = _one_each(redis_client)
    assert set(by_url) == set(urls)
    assert all(by_url[u]["status"] == 200 for u in urls)
    assert _failures(redis_client) == []
    assert drain(amqp_channel, topology.FAILED_QUEUE) == []
    assert not [r for r in wall.log if r.path.startswith("/wall/") and r.path != "/wall/0"
                and f"wall={SECRET}" not in r.headers.get("Cookie", "")]


@pytest.mark.parametrize("keep", [False, True])
def test_warc_records_keep_no_cookie_value_unless_asked(settings, redis_client, own_sites,
                                                         tmp_path, keep):
    [wall] = start_sites(1, first_host="127.0.0.5")
    own_sites.append(wall)
    urls = _wall(wall, 3)
    _seed(settings, redis_client, [urls[0]])
    env = {**CRAWL, "ARCHIVE": "warc", "ARCHIVE_DIR": str(tmp_path),
           "ARCHIVE_KEEP_COOKIES": "true" if keep else "false"}
    wait_workers_ok(_workers(settings, 1, env), 90)

    assert {r["url"] for r in results(redis_client)} == set(urls)
    archived = b"".join(gzip.decompress(p.read_bytes()) for p in tmp_path.rglob("*.warc.gz"))
    assert b"WARC-Type: request" in archived
    if keep:
        assert b"Set-Cookie: wall=" + SECRET.encode() + b"; Path=/; HttpOnly" in archived
        assert b"Cookie: wall=" + SECRET.encode() in archived
    else:
        assert SECRET.encode() not in archived
        assert b"Set-Cookie: wall=[redacted]; Path=/; HttpOnly; SameSite=Lax" in archived
        assert archived.count(b"\r\nCookie: wall=[redacted]\r\n") == 2  # /wall/1 and /wall/2
