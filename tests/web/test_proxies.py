"""Proxies: PROXY_URLS parsed (credentials never in a message), the pool's rotation, sticky
sessions, fleet-wide rests and counters (common/web/proxies.py, against the real Redis), and
fetches through real proxies on loopback (devtools/proxies.py): Debian's tinyproxy (http, and
https through CONNECT), dante (socks5, socks5h), proxy credentials, failing proxies, and the
address guard, asked of a recording proxy that never connects onward."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from common.core.config import Settings
from common.core.errors import FetchError
from common.store.keys import PROXY_STATS, proxy_rest_key
from common.web import proxies
from common.web.fetch import Fetcher, Identity
from common.web.netguard import parse_networks
from common.web.proxies import ProxyPool, parse_proxy_urls, proxy_id, read_stats
from devtools.nginx_site import NginxSite, free_port
from devtools.proxies import Dante, RecordingProxy, TinyProxy
from devtools.testsite import TestSite
from devtools.tls import Pki, make_pki

SECRET = "s3cr3t-pw"
A, B, C = "http://127.0.0.1:3001", "http://127.0.0.1:3002", f"socks5h://bob:{SECRET}@127.0.0.1:1080"
POOL = (A, B, C)


def _pool(settings: Settings, client: redis.Redis, rest_s: float = 60) -> ProxyPool:
    return ProxyPool(replace(settings, proxy_rest_s=rest_s), client)


# -- parsing -----------------------------------------------------------------------------------
def test_proxy_urls_are_read_in_order_with_every_scheme() -> None:
    raw = f" http://p1:3128 , https://p2:443,socks5://p3:1080,{C},"
    assert parse_proxy_urls(raw) == ("http://p1:3128", "https://p2:443", "socks5://p3:1080", C)
    assert parse_proxy_urls("") == ()


@pytest.mark.parametrize("entry, says", [
    (f"ftp://u:{SECRET}@p:21", "scheme"),
    (f"http://u:{SECRET}@p", "no port"),
    (f"socks4://u:{SECRET}@p:1080", "scheme"),
    (f"http://u:{SECRET}@p:99999", "does not parse"),
    (f"http://u:{SECRET}@:3128", "no host"),
    (f"u:{SECRET}@p:3128", "scheme"),
    (f"http://u:{SECRET}@p:3128/path", "scheme://"),
])
def test_a_bad_proxy_url_is_refused_without_showing_its_password(entry: str, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_proxy_urls(f"http://fine:3128,{entry}")
    assert says in str(caught.value)
    assert SECRET not in str(caught.value)


def test_a_proxy_id_is_short_stable_and_hides_credentials() -> None:
    assert proxy_id(C) == proxy_id(C) and len(proxy_id(C)) == 12
    assert SECRET not in proxy_id(C) and "bob" not in proxy_id(C)
    assert proxy_id(C) != proxy_id(C.replace(SECRET, "other"))  # two accounts, two proxies


# -- choosing ----------------------------------------------------------------------------------
def test_no_proxies_means_direct(settings: Settings, redis_client: redis.Redis) -> None:
    assert _pool(settings, redis_client).choose(()) is None


def test_requests_are_spread_evenly_over_the_proxies(settings: Settings,
                                                     redis_client: redis.Redis) -> None:
    pool = _pool(settings, redis_client)
    counts = Counter(pool.choose(POOL) for _ in range(300))
    assert counts == {A: 100, B: 100, C: 100}


def test_threads_sharing_a_pool_still_get_an_even_round_robin(settings: Settings,
                                                            redis_client: redis.Redis) -> None:
    pool = _pool(settings, redis_client)
    chosen: list[str | None] = []
    lock = threading.Lock()

    def pick() -> None:
        mine = [pool.choose(POOL) for _ in range(3000)]
        for proxy in mine:
            pool.served(proxy)
        with lock:
            chosen.extend(mine)

    threads = [threading.Thread(target=pick) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(chosen) == {A: 8000, B: 8000, C: 8000}
    pool.flush()
    assert sum(int(s["served"]) for s in read_stats(redis_client).values()) == 24000


def test_a_sticky_key_keeps_its_proxy_and_keys_spread(settings: Settings,
                                                      redis_client: redis.Redis) -> None:
    pool, other_worker = _pool(settings, redis_client), _pool(settings, redis_client)
    chosen = {f"0.{n}": pool.choose(POOL, sticky=f"0.{n}") for n in range(60)}
    assert all(pool.choose(POOL, sticky=key) == proxy for key, proxy in chosen.items())
    # another worker, no shared state: the same choice
    assert all(other_worker.choose(POOL, sticky=key) == proxy for key, proxy in chosen.items())
    assert min(Counter(chosen.values()).values()) >= 10


def test_a_sticky_key_moves_only_when_its_proxy_rests(settings: Settings,
                                                      redis_client: redis.Redis) -> None:
    pool = _pool(settings, redis_client)
    chosen = {f"s{n}": pool.choose(POOL, sticky=f"s{n}") for n in range(60)}
    pool.failed(A)
    after = {key: pool.choose(POOL, sticky=key) for key in chosen}
    assert A not in after.values()
    assert all(after[key] == proxy for key, proxy in chosen.items() if proxy != A)


def test_a_failed_proxy_rests_fleet_wide_then_comes_back(settings: Settings,
                                                        redis_client: redis.Redis) -> None:
    pool, other_worker = _pool(settings, redis_client, 1.5), _pool(settings, redis_client, 1.5)
    other_worker.choose(POOL)  # it has looked already: the next look is within REFRESH_S
    pool.failed(B)
    assert 0 < redis_client.pttl(proxy_rest_key(proxy_id(B))) <= 1500
    assert B not in {pool.choose(POOL) for _ in range(30)}
    time.sleep(proxies.REFRESH_S + 0.05)
    assert B not in {other_worker.choose(POOL) for _ in range(30)}
    time.sleep(1.5)
    assert {pool.choose(POOL) for _ in range(30)} == set(POOL)
    assert {other_worker.choose(POOL) for _ in range(30)} == set(POOL)


def test_with_every_proxy_resting_the_one_back_first_is_used(settings: Settings,
                                                            redis_client: redis.Redis) -> None:
    pool = _pool(settings, redis_client, 30)
    pool.failed(A)
    pool.failed(C)
    time.sleep(0.01)
    pool.failed(B)
    redis_client.pexpire(proxy_rest_key(proxy_id(C)), 5000)  # C's rest ends first now
    time.sleep(proxies.REFRESH_S + 0.05)
    assert {pool.choose(POOL) for _ in range(10)} == {C}
    assert {pool.choose(POOL, sticky="0.0") for _ in range(10)} == {C}


def test_resting_is_looked_up_at_most_once_a_second(settings: Settings,
                                                    redis_client: redis.Redis) -> None:
    pool = _pool(settings, redis_client)
    pool.choose(POOL)
    redis_client.set(proxy_rest_key(proxy_id(A)), "1", px=60_000)  # another worker rested A
    assert A in {pool.choose(POOL) for _ in range(30)}  # not seen yet: no look per page
    time.sleep(proxies.REFRESH_S + 0.05)
    assert A not in {pool.choose(POOL) for _ in range(30)}


def test_served_and_failed_are_counted_with_a_redacted_name(settings: Settings,
                                                           redis_client: redis.Redis) -> None:
    pool = _pool(settings, redis_client)
    for _ in range(7):
        pool.served(C)
    pool.served(A)
    pool.failed(C)
    pool.flush()
    stats = read_stats(redis_client)
    assert stats[proxy_id(C)] == {"name": "socks5h://bob:***@127.0.0.1:1080", "served": 7,
                                  "failed": 1}
    assert stats[proxy_id(A)]["served"] == 1
    raw = redis_client.hgetall(PROXY_STATS)
    assert not any(SECRET.encode() in k + v for k, v in raw.items())


def test_counters_are_flushed_in_batches_not_per_page(settings: Settings,
                                                      redis_client: redis.Redis) -> None:
    pool = _pool(settings, redis_client)
    pool.flush()
    for _ in range(50):
        pool.served(A)
    assert read_stats(redis_client).get(proxy_id(A), {}).get("served", 0) == 0
    time.sleep(proxies.REFRESH_S + 0.05)
    pool.served(A)  # the first call after a second flushes the lot
    assert read_stats(redis_client)[proxy_id(A)]["served"] == 51


# -- fetching through proxies --------------------------------------------------------------------
LOOPBACK = parse_networks("127.0.0.0/8")
PROXY_PASSWORD = "pr0xy-s3cret"


@pytest.fixture
def make_fetcher(make_thread_fetcher: Callable[..., Fetcher]) -> Callable[..., Fetcher]:
    return make_thread_fetcher  # the fetch loop's path is tests/web/test_fetch.py's


@pytest.fixture(scope="module")
def tinyproxy() -> Iterator[TinyProxy]:
    with TinyProxy(auth=("bob", PROXY_PASSWORD)) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def dante() -> Iterator[Dante]:
    with Dante() as proxy:
        yield proxy


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def https_site(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxSite]:
    root = tmp_path_factory.mktemp("docroot")
    (root / "index.html").write_text("<title>over tls</title>")
    with NginxSite(root, tls=pki.leaf) as site:
        yield site


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def _fetch_error(fetcher: Fetcher, url: str, proxy: str) -> FetchError:
    with pytest.raises(FetchError) as info:
        fetcher.fetch(url, identity=Identity(proxy=proxy))
    return info.value


def test_a_page_comes_through_an_http_proxy_with_its_credentials_hidden(
        make_fetcher, site: TestSite, tinyproxy: TinyProxy, logs) -> None:
    result = make_fetcher().fetch(site.page_url(3), identity=Identity(proxy=tinyproxy.url))
    assert result.status == 200 and b"Page 3" in result.body
    assert result.proxy == f"http://bob:***@127.0.0.1:{tinyproxy.port}"
    assert ("GET", site.page_url(3)) in tinyproxy.requests()
    assert [r.path for r in site.log] == ["/page/3"]
    assert PROXY_PASSWORD not in repr(result) and PROXY_PASSWORD not in logs.text


def test_an_https_page_comes_through_an_http_proxy_tunnel(
        make_fetcher, https_site: NginxSite, pki: Pki, tinyproxy: TinyProxy) -> None:
    fetcher = make_fetcher(fetch_ca_bundle=str(pki.ca_cert))
    result = fetcher.fetch(https_site.url("/index.html"), identity=Identity(proxy=tinyproxy.url))
    assert result.status == 200 and b"over tls" in result.body
    assert result.tls_verified is True and result.http_version == "2"
    assert ("CONNECT", f"localhost:{https_site.port}") in tinyproxy.requests()
    assert ("/index.html", 200) in https_site.await_requests()


@pytest.mark.parametrize("scheme", ["socks5", "socks5h"])
def test_pages_come_through_a_socks5_proxy(make_fetcher, site: TestSite, dante: Dante,
                                           scheme: str) -> None:
    proxy = dante.url if scheme == "socks5" else dante.url_h
    # socks5h: the proxy resolves the name; socks5: libcurl does, and for "localhost" its
    # first answer is ::1, which dante (IPv4 outside) cannot reach: an address then
    host = "localhost" if scheme == "socks5h" else "127.0.0.1"
    url = f"http://{host}:{site.port}/page/4"
    result = make_fetcher().fetch(url, identity=Identity(proxy=proxy))
    assert result.status == 200 and b"Page 4" in result.body
    assert result.proxy == proxy and result.remote_ip == "127.0.0.1"
    assert [r.path for r in site.log] == ["/page/4"]
    assert ("127.0.0.1", site.port) in dante.connections()


def test_an_https_page_comes_through_socks5h(make_fetcher, https_site: NginxSite, pki: Pki,
                                             dante: Dante) -> None:
    fetcher = make_fetcher(fetch_ca_bundle=str(pki.ca_cert))
    result = fetcher.fetch(https_site.url("/index.html"), identity=Identity(proxy=dante.url_h))
    assert result.status == 200 and result.tls_verified is True
    assert ("127.0.0.1", https_site.port) in dante.connections()


@pytest.mark.parametrize("scheme", ["http", "socks5", "socks5h"])
def test_a_proxy_with_nothing_listening_is_a_proxy_error_without_its_password(
        make_fetcher, site: TestSite, scheme: str, logs) -> None:
    proxy = f"{scheme}://bob:{PROXY_PASSWORD}@127.0.0.1:{free_port()}"
    error = _fetch_error(make_fetcher(), site.page_url(1), proxy)
    assert error.kind == "proxy" and error.transient
    assert PROXY_PASSWORD not in str(error) and "bob:***@" in str(error)
    assert PROXY_PASSWORD not in logs.text
    assert site.log == []


def test_a_wrong_proxy_password_on_a_tunnel_is_a_proxy_error(
        make_fetcher, https_site: NginxSite, pki: Pki, tinyproxy: TinyProxy, logs) -> None:
    proxy = f"http://bob:wrong-{PROXY_PASSWORD}@127.0.0.1:{tinyproxy.port}"
    error = _fetch_error(make_fetcher(fetch_ca_bundle=str(pki.ca_cert)),
                         https_site.url("/index.html"), proxy)
    assert error.kind == "proxy" and "CONNECT" in str(error)
    assert PROXY_PASSWORD not in str(error) and PROXY_PASSWORD not in logs.text


def test_a_proxy_asking_for_credentials_on_plain_http_is_a_proxy_error(
        make_fetcher, site: TestSite, tinyproxy: TinyProxy) -> None:
    proxy = f"http://127.0.0.1:{tinyproxy.port}"  # no credentials: tinyproxy answers 407
    error = _fetch_error(make_fetcher(), site.page_url(1), proxy)
    assert error.kind == "proxy"


def test_a_proxy_that_never_answers_a_tunnel_is_a_proxy_error(make_fetcher) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never answers
        proxy = f"http://127.0.0.1:{silent.getsockname()[1]}"
        fetcher = make_fetcher(fetch_total_timeout_s=1.5, read_timeout_s=1)
        error = _fetch_error(fetcher, f"https://127.0.0.1:{free_port()}/", proxy)
    assert error.kind == "proxy", error


def test_the_guard_refuses_a_target_asked_of_a_proxy_and_the_proxy_hears_nothing(
        make_fetcher) -> None:
    fetcher = make_fetcher(fetch_allow_networks=parse_networks("127.0.0.1/32"))
    with RecordingProxy("127.0.0.1") as trap:
        for target in (f"http://127.0.0.2:{free_port()}/secret",
                       f"https://127.0.0.2:{free_port()}/secret"):
            error = _fetch_error(fetcher, target, trap.url)
            assert error.kind == "blocked" and "127.0.0.2" in str(error)
            assert "asked of a proxy" in str(error)
        assert trap.connections == 0 and trap.asked == []


def test_the_recording_proxy_answers_502_and_never_connects_onward(make_fetcher) -> None:
    with RecordingProxy("127.0.0.1") as trap, TestSite("127.0.0.3") as target:
        result = make_fetcher().fetch(target.page_url(1), identity=Identity(proxy=trap.url))
        assert result.status == 502
        assert trap.asked == [f"GET {target.page_url(1)} HTTP/1.1"]
        assert target.log == []


def test_a_proxy_whose_own_address_is_not_allowed_is_blocked(make_fetcher, site: TestSite) -> None:
    fetcher = make_fetcher(fetch_allow_networks=parse_networks("127.0.0.1/32"))
    with RecordingProxy("127.0.0.2") as trap:
        error = _fetch_error(fetcher, site.page_url(1), trap.url)
        assert error.kind == "blocked" and "127.0.0.2" in str(error)
        assert trap.connections == 0 and site.log == []


def test_tinyproxy_logs_count_what_each_proxy_served(site: TestSite, make_fetcher,
                                                     tmp_path: Path) -> None:
    fetcher = make_fetcher()
    with TinyProxy() as one, TinyProxy() as two:
        for n in range(1, 7):
            proxy = one.url if n % 3 else two.url
            assert fetcher.fetch(site.page_url(n), identity=Identity(proxy=proxy)).status == 200
        assert len(one.requests()) == 4 and len(two.requests()) == 2


def test_robots_txt_and_sitemaps_go_through_the_fleets_proxies(
        settings: Settings, redis_client: redis.Redis, site: TestSite) -> None:
    from common.intake.sitemaps import SitemapReader

    with TinyProxy() as proxy:
        fleet = replace(settings, proxy_urls=proxy.url, fetch_allow_networks=LOOPBACK)
        reader = SitemapReader(fleet, redis_client)
        response = reader.fetch_politely(site.url("/robots.txt"))
        reader.proxies.pool.flush()
        asked = proxy.requests()
    assert response.status in (200, 404) and response.proxy == proxy.url
    assert ("GET", site.url("/robots.txt")) in asked
    [stats] = read_stats(redis_client).values()
    assert stats["served"] == 1 and stats["name"] == proxy.url


def test_a_socks5_target_is_pinned_to_the_addresses_the_guard_checked(
        make_fetcher, site: TestSite, dante: Dante, monkeypatch: pytest.MonkeyPatch) -> None:
    # libcurl resolves "localhost" to ::1 first, which dante cannot reach; the guard resolved
    # (here: was told) 127.0.0.1 only, and the fetch must go exactly there (CURLOPT_RESOLVE),
    # never to an address libcurl found by asking again (DNS rebinding).
    from common.web import netguard

    monkeypatch.setattr(netguard, "resolve", lambda host: ("127.0.0.1",))
    fetcher = make_fetcher()
    url = f"http://localhost:{site.port}/page/2"
    for _ in range(2):  # the pin is undone after each fetch and set again
        result = fetcher.fetch(url, identity=Identity(proxy=dante.url))
        assert result.status == 200 and b"Page 2" in result.body
    assert dante.connections().count(("127.0.0.1", site.port)) >= 2
    direct = fetcher.fetch(site.page_url(3))  # the same handle, no proxy: nothing pinned left
    assert direct.status == 200 and direct.proxy is None
