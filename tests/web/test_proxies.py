"""Proxies: PROXY_URLS parsed (credentials never in a message), the pool's rotation, sticky
sessions, fleet-wide rests and counters (common/web/proxies.py), against the real Redis."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

import pytest
import redis

from common.core.config import Settings
from common.store.keys import PROXY_STATS, proxy_rest_key
from common.web import proxies
from common.web.proxies import ProxyPool, parse_proxy_urls, proxy_id, read_stats

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
