"""Crawls through a pool of proxies with the whole fleet (issue 28's Done when): RabbitMQ,
Redis, ``worker.py`` processes, a loopback site, and Debian's tinyproxy as the proxies
(devtools/proxies.py), judged by the site's request log, each proxy's own log, the results
stream and ``proxy:stats``.

Three proxies, one failing (nothing listens on its port, or a tinyproxy killed mid-crawl):
nothing is lost (each URL one result, each page fetched once), the healthy two share the load,
the failing one rests fleet-wide after a few failures, and records name their proxy with its
credentials removed; a worker killed with kill -9 mid-crawl loses no URL. A rule's and a job's
own proxy lists, sticky sessions across workers, and dante (socks5h) beside tinyproxy too.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from common.core.config import Settings
from common.intake.producer import Producer
from common.store.keys import FAILURES_STREAM
from common.web.proxies import proxy_id, read_stats
from devtools.nginx_site import free_port
from devtools.proxies import Dante, TinyProxy
from devtools.testsite import TestSite, start_sites
from tests.helpers import output_of, results, start_worker_process, wait_for, wait_workers_ok
from tests.test_jobs_fleet import Fleet

pytestmark = pytest.mark.slow

PAGES = 200
SECRET = "fl33t-proxy-pw"


@pytest.fixture
def proxies() -> Iterator[tuple[TinyProxy, TinyProxy]]:
    with TinyProxy(auth=("crawler", SECRET)) as one, TinyProxy() as two:
        yield one, two


def _seed(settings: Settings, client: redis.Redis, urls: list[str]) -> None:
    with Producer(settings, client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()


def _by_url(client: redis.Redis) -> dict[str, dict]:
    found = results(client)
    assert len({r["url"] for r in found}) == len(found), Counter(r["url"] for r in found)
    return {r["url"]: r for r in found}


def _pages(proxy: TinyProxy, site: TestSite) -> int:
    """Page requests ``proxy`` passed on to ``site`` (robots.txt left out)."""
    prefix = site.url("/page/")
    return sum(1 for _method, target in proxy.requests() if target.startswith(prefix))


def _distinct(proxy: TinyProxy, site: TestSite) -> int:
    """Pages of ``site`` that went through ``proxy`` (one fetched again counted once)."""
    prefix = site.url("/page/")
    return len({target for _method, target in proxy.requests() if target.startswith(prefix)})


def _all_recorded(client: redis.Redis, by_url: dict[str, dict], urls: list[str],
                  workers: list) -> None:
    """Every URL has its record; else where the missing ones are, and what the workers said."""
    missing = sorted(set(urls) - set(by_url))
    failures = [fields for _id, fields in client.xrange(FAILURES_STREAM)]
    assert missing == [] and set(by_url) == set(urls), (
        missing, failures, [output_of(proc)[-2500:] for proc in workers])


def _once_unless_retried(fetched: Counter[str], by_url: dict[str, dict], site: TestSite) -> None:
    """Each page fetched, and more than once only when its record says it was retried (a
    transient error after the request went out: a loaded machine's timeout)."""
    assert len(fetched) == len(by_url)
    again = {site.url(path) for path, times in fetched.items() if times > 1}
    assert {url for url in again if by_url[url]["attempts"] == 1} == set(), fetched.most_common(3)


def _workers(settings: Settings, n: int, env: dict[str, str], first: int = 0) -> list:
    # Retries come back well inside the idle exit (RETRY_BASE_S 0.3: 0.3, 0.6, 1.2 s), so a
    # URL retried after a transient error on a loaded machine is not left waiting in a hold
    # queue when the workers call it a day (a CI run lost page/51 that way: waiting, not lost).
    return [start_worker_process(settings, "--idle-exit", "3", "--concurrency", "8",
                                 env={"RETRY_BASE_S": "0.3", **env,
                                      "WORKER_ID": f"px-w{first + i}"})
            for i in range(n)]


def _no_secret(client: redis.Redis, procs: list) -> None:
    for proc in procs:
        assert SECRET not in output_of(proc)
    for stream in (b"results", b"failures"):
        for _id, fields in client.xrange(stream):
            assert SECRET.encode() not in fields[b"json"]
    assert not [k for k, v in client.hgetall("proxy:stats").items() if SECRET.encode() in k + v]


def _own_site(own_sites: list[TestSite]) -> TestSite:
    [site] = start_sites(1, pages=PAGES)
    own_sites.append(site)
    return site


def test_a_crawl_through_three_proxies_one_dead_loses_nothing_and_spreads_load(
        settings: Settings, redis_client: redis.Redis, own_sites: list[TestSite],
        proxies: tuple[TinyProxy, TinyProxy]) -> None:
    site = _own_site(own_sites)
    one, two = proxies
    dead = f"http://ghost:{SECRET}@127.0.0.1:{free_port()}"
    urls = [site.page_url(n) for n in range(1, PAGES + 1)]
    _seed(settings, redis_client, urls)
    workers = _workers(settings, 2, {"PROXY_URLS": f"{one.url},{two.url},{dead}"})
    wait_workers_ok(workers, 180)

    by_url = _by_url(redis_client)  # one result per URL
    _all_recorded(redis_client, by_url, urls, workers)
    assert all(record["status"] == 200 for record in by_url.values())
    assert redis_client.xlen("failures") == 0, [  # which URL, and why
        fields for _id, fields in redis_client.xrange("failures")]
    fetched = Counter(r.path for r in site.log if r.path.startswith("/page/"))
    _once_unless_retried(fetched, by_url, site)
    served = {one.port: _pages(one, site), two.port: _pages(two, site)}
    assert sum(served.values()) == sum(fetched.values())
    assert min(served.values()) >= 0.3 * PAGES, served
    shown = {record["proxy"] for record in by_url.values()}
    assert shown == {f"http://crawler:***@127.0.0.1:{one.port}", two.url}
    stats = read_stats(redis_client)
    assert 1 <= stats[proxy_id(dead)]["failed"] <= 16, stats  # rested after a few
    assert stats[proxy_id(dead)].get("served", 0) == 0
    assert stats[proxy_id(dead)]["name"] == f"http://ghost:***@127.0.0.1:{dead.rsplit(':', 1)[1]}"
    robots = sum(1 for r in site.log if r.path == "/robots.txt")  # through the proxies too
    assert stats[proxy_id(one.url)]["served"] + stats[proxy_id(two.url)]["served"] == \
        PAGES + robots
    print(f"{sum(fetched.values()) - PAGES} pages fetched again after a transient error")
    _no_secret(redis_client, workers)
    print(f"{PAGES} pages: {served} through the healthy proxies (by port), "
          f"{stats[proxy_id(dead)]['failed']} failures on the dead one")


def test_a_proxy_and_a_worker_killed_mid_crawl_lose_no_url(
        settings: Settings, redis_client: redis.Redis, own_sites: list[TestSite],
        proxies: tuple[TinyProxy, TinyProxy]) -> None:
    site = _own_site(own_sites)
    site.latency_s = 0.01  # a crawl long enough to kill things in the middle of it
    one, two = proxies
    with TinyProxy() as doomed:
        urls = [site.page_url(n) for n in range(1, PAGES + 1)]
        _seed(settings, redis_client, urls)
        env = {"PROXY_URLS": f"{one.url},{two.url},{doomed.url}", "RATE_LIMIT": "100/second"}
        first, second = _workers(settings, 2, env)
        assert wait_for(lambda: redis_client.xlen("results") >= PAGES // 4, timeout_s=90)
        doomed.kill()
        assert wait_for(lambda: redis_client.xlen("results") >= PAGES // 2, timeout_s=90)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        [third] = _workers(settings, 1, env, first=2)
        wait_workers_ok([second, third], 180)
        through_doomed = _pages(doomed, site)

    by_url = _by_url(redis_client)  # one result per URL, kill or not
    _all_recorded(redis_client, by_url, urls, [first, second, third])
    assert all(record["status"] == 200 for record in by_url.values())
    assert redis_client.xlen("failures") == 0, [  # which URL, and why
        fields for _id, fields in redis_client.xrange("failures")]
    assert 0 < through_doomed < PAGES // 2
    fetched = Counter(r.path for r in site.log if r.path.startswith("/page/"))
    assert len(fetched) == PAGES  # a page fetched twice: only one the kill -9 interrupted
    assert sum(fetched.values()) - PAGES <= 24, fetched.most_common(3)
    stats = read_stats(redis_client)
    assert stats[proxy_id(doomed.url)]["failed"] >= 1
    assert wait_for(lambda: not redis_client.exists(f"proxy:rest:{proxy_id(one.url)}"), 1)
    _no_secret(redis_client, [first, second, third])
    print(f"doomed proxy served {through_doomed} pages and failed "
          f"{stats[proxy_id(doomed.url)]['failed']} times; "
          f"{sum(fetched.values()) - PAGES} pages fetched twice after the kill -9")



def test_a_rules_own_proxies_or_none_replace_the_fleets_for_its_pages(
        settings: Settings, redis_client: redis.Redis, own_sites: list[TestSite],
        proxies: tuple[TinyProxy, TinyProxy]) -> None:
    site = _own_site(own_sites)
    one, two = proxies
    rules = [{"name": "hundreds", "path": r"^/page/1\d\d$", "proxies": [two.url]},
             {"name": "units", "path": r"^/page/\d$", "proxies": False}]
    urls = [site.page_url(n) for n in range(1, PAGES + 1)]
    _seed(settings, redis_client, urls)
    workers = _workers(settings, 2, {"PROXY_URLS": one.url, "EXTRACT_RULES": json.dumps(rules)})
    wait_workers_ok(workers, 180)

    by_url = _by_url(redis_client)
    _all_recorded(redis_client, by_url, urls, workers)
    way = {n: by_url[site.page_url(n)].get("proxy") for n in range(1, PAGES + 1)}
    assert {way[n] for n in range(100, 200)} == {two.url}
    assert {way[n] for n in range(1, 10)} == {None}  # direct
    assert {way[n] for n in [*range(10, 100), 200]} == {f"http://crawler:***@127.0.0.1:{one.port}"}
    _once_unless_retried(Counter(r.path for r in site.log if r.path.startswith("/page/")),
                         by_url, site)
    assert (_distinct(one, site), _distinct(two, site)) == (91, 100)
    _no_secret(redis_client, workers)


def test_sticky_rotation_keeps_a_session_on_one_proxy_across_workers(
        settings: Settings, redis_client: redis.Redis, own_sites: list[TestSite],
        proxies: tuple[TinyProxy, TinyProxy]) -> None:
    site = _own_site(own_sites)
    one, two = proxies
    urls = [site.page_url(n) for n in range(1, 61)]
    _seed(settings, redis_client, urls)
    workers = _workers(settings, 2, {"PROXY_URLS": f"{one.url},{two.url}",
                                     "PROXY_ROTATION": "session"})
    wait_workers_ok(workers, 180)

    by_url = _by_url(redis_client)
    _all_recorded(redis_client, by_url, urls, workers)
    assert {record["worker"] for record in by_url.values()} == {"px-w0", "px-w1"}
    assert len({record["proxy"] for record in by_url.values()}) == 1  # one session, one proxy
    assert sorted([_distinct(one, site), _distinct(two, site)]) == [0, 60]


def test_a_jobs_own_proxies_carry_its_pages_while_the_fleets_carry_the_rest(
        settings: Settings, redis_client: redis.Redis, own_sites: list[TestSite],
        proxies: tuple[TinyProxy, TinyProxy], tmp_path: Path) -> None:
    site = _own_site(own_sites)
    one, two = proxies
    fleet = Fleet(settings, redis_client, tmp_path)
    try:
        fleet.start(PROXY_URLS=one.url)
        job_urls = [site.page_url(n) for n in range(1, 31)]
        fleet.submit({"name": "proxied", "seeds": {"urls": job_urls}, "crawl": {"max_depth": 0},
                      "proxies": {"urls": [two.url]}})
        fleet_urls = [site.page_url(n) for n in range(31, 61)]
        _seed(settings, redis_client, fleet_urls)
        fleet.wait_state("proxied", "finished")
        assert wait_for(lambda: len(results(redis_client)) >= 60, 60), fleet.logs()
    finally:
        fleet.stop()

    records = results(redis_client)
    assert sorted(r["url"] for r in records) == sorted(job_urls + fleet_urls)
    assert {r["proxy"] for r in records if r.get("job") == "proxied"} == {two.url}
    assert {r["proxy"] for r in records if r.get("job") != "proxied"} == {
        f"http://crawler:***@127.0.0.1:{one.port}"}
    assert (_distinct(one, site), _distinct(two, site)) == (30, 30)
    _no_secret(redis_client, fleet.workers)


def test_a_socks5h_and_an_http_proxy_share_a_crawl(
        settings: Settings, redis_client: redis.Redis, own_sites: list[TestSite],
        proxies: tuple[TinyProxy, TinyProxy]) -> None:
    site = _own_site(own_sites)
    one, _two = proxies
    urls = [f"http://localhost:{site.port}/page/{n}" for n in range(1, 61)]
    _seed(settings, redis_client, urls)
    with Dante() as socks:
        workers = _workers(settings, 2, {"PROXY_URLS": f"{socks.url_h},{one.url}"})
        wait_workers_ok(workers, 180)
        through_socks = sum(1 for _ip, port in socks.connections() if port == site.port)

    by_url = _by_url(redis_client)
    assert set(by_url) == set(urls) and {r["status"] for r in by_url.values()} == {200}
    assert {r["proxy"] for r in by_url.values()} == {
        socks.url_h, f"http://crawler:***@127.0.0.1:{one.port}"}
    # a SOCKS tunnel carries many requests (libcurl keeps it): the records count the pages
    shares = Counter(r["proxy"] for r in by_url.values())
    assert through_socks >= 1 and min(shares.values()) >= 18, (through_socks, shares)
    through_http = {target for _method, target in one.requests() if target in by_url}
    assert shares[f"http://crawler:***@127.0.0.1:{one.port}"] == len(through_http)
    _no_secret(redis_client, workers)
