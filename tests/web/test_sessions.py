"""The session pool (common/web/sessions.py) on a real Redis: its round trips, retiring a
session once under a race, uses, and the jar merged cookie by cookie."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from common.store.keys import COUNTERS, cookie_jar_key, session_pool_key
from common.web.sessions import SessionPool

SITE = "shop.example"
URL = "http://shop.example/"


class CountingConnection(redis.Connection):
    """A connection that counts what it sends: one ``send_packed_command`` a round trip."""

    sent = 0

    def send_packed_command(self, command, check_health=True):  # noqa: ANN001
        CountingConnection.sent += 1
        return super().send_packed_command(command, check_health)


@pytest.fixture
def counted(settings) -> Iterator[redis.Redis]:
    pool = redis.ConnectionPool.from_url(settings.redis_url, connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    client.ping()
    yield client
    client.close()


def _trips(client: redis.Redis, pool: SessionPool, fn) -> int:  # noqa: ANN001
    pool.open("warm", SITE, pool_size=1)  # scripts loaded, connection made
    before = CountingConnection.sent
    fn()
    return CountingConnection.sent - before


def test_without_a_pool_a_page_reads_its_jar_in_one_round_trip_and_writes_nothing(counted):
    pool = SessionPool(counted)

    def page() -> None:
        session = pool.open("default", SITE, pool_size=0)
        assert session.name == "0.0" and not session.pooled
        assert session.jar.header_for(URL) is None
        assert pool.save(session)

    assert _trips(counted, pool, page) == 1
    assert not counted.exists(cookie_jar_key("default", SITE, "0.0"))


def test_without_a_pool_the_admit_script_brings_the_jar_and_opening_costs_no_round_trip(
        counted, redis_client, settings):
    from common.web.ratelimit import Rate, RateLimiter

    SessionPool(redis_client).open("default", SITE, pool_size=0)  # nothing stored yet
    writer = SessionPool(redis_client)
    stored = writer.open("default", SITE, pool_size=0)
    stored.jar.receive(URL, ["sid=abc; Path=/"])
    assert writer.save(stored)
    limiter = RateLimiter(counted, settings)
    pool = SessionPool(counted)
    limiter.admit("warm.example", Rate(100, 1000))  # the script loaded
    before = CountingConnection.sent
    admission = limiter.admit(SITE, Rate(100, 1000),
                              jar_key=cookie_jar_key("default", SITE, "0.0"))
    session = pool.open("default", SITE, pool_size=0, preloaded=admission.jar)
    assert CountingConnection.sent - before == 1  # the admit call, and nothing else
    assert admission.go and session.jar.header_for(URL + "next") == "sid=abc"
    empty = limiter.admit("other.example", Rate(100, 1000),
                          jar_key=cookie_jar_key("default", "other.example", "0.0"))
    assert empty.go and empty.jar == {}
    assert limiter.admit("third.example", Rate(100, 1000)).jar is None  # not asked


def test_with_a_pool_a_page_opens_its_session_in_one_round_trip(counted):
    pool = SessionPool(counted)
    assert _trips(counted, pool, lambda: pool.save(pool.open("job", SITE, pool_size=3))) == 1


def test_a_page_that_set_a_cookie_writes_it_in_one_round_trip_for_every_worker(counted,
                                                                               redis_client):
    pool = SessionPool(counted)
    session = pool.open("default", SITE, pool_size=0)
    session.jar.receive(URL, ["sid=abc; Path=/"])
    assert _trips(counted, pool, lambda: pool.save(session)) == 1
    other = SessionPool(redis_client).open("default", SITE, pool_size=0)
    assert other.jar.header_for(URL + "next") == "sid=abc"
    assert 0 < redis_client.pttl(cookie_jar_key("default", SITE, "0.0")) <= 86_400_000


def test_two_pages_changing_the_same_jar_merge_cookie_by_cookie(redis_client):
    pool = SessionPool(redis_client)
    first = pool.open("default", SITE, pool_size=0)
    second = pool.open("default", SITE, pool_size=0)
    first.jar.receive(URL, ["a=1; Path=/"])
    second.jar.receive(URL, ["b=2; Path=/"])
    pool.save(first)
    pool.save(second)
    header = pool.open("default", SITE, pool_size=0).jar.header_for(URL)
    assert sorted(header.split("; ")) == ["a=1", "b=2"]


def test_jobs_and_sites_have_jars_of_their_own(redis_client):
    pool = SessionPool(redis_client)
    session = pool.open("one", SITE, pool_size=0)
    session.jar.receive(URL, ["sid=abc; Path=/"])
    pool.save(session)
    assert pool.open("two", SITE, pool_size=0).jar.header_for(URL) is None
    assert pool.open("one", "other.example", pool_size=0).jar.header_for(URL) is None


def test_a_pool_spreads_pages_over_its_sessions(redis_client):
    pool = SessionPool(redis_client)
    names = {pool.open("job", SITE, pool_size=3).name for _ in range(60)}
    assert names == {"0.0", "1.0", "2.0"}


def test_a_retired_session_is_replaced_by_its_next_generation_with_an_empty_jar(redis_client):
    pool = SessionPool(redis_client)
    session = pool.open("job", SITE, pool_size=1)
    session.jar.receive(URL, ["sid=burnt; Path=/"])
    pool.save(session)
    assert pool.retire(session)
    fresh = pool.open("job", SITE, pool_size=1)
    assert fresh.name == "0.1" and fresh.jar.header_for(URL) is None
    assert not redis_client.exists(cookie_jar_key("job", SITE, "0.0"))


def test_two_workers_retiring_the_same_session_retire_it_once(settings):
    clients = [redis.Redis.from_url(settings.redis_url) for _ in range(8)]
    pools = [SessionPool(c) for c in clients]
    session = pools[0].open("job", SITE, pool_size=1)
    results: list[bool] = []
    barrier = threading.Barrier(len(pools))

    def retire(pool: SessionPool) -> None:
        barrier.wait()
        results.append(pool.retire(session))

    threads = [threading.Thread(target=retire, args=(p,)) for p in pools]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]
    assert clients[0].hget(COUNTERS, "sessions_retired") == b"1"
    assert pools[0].open("job", SITE, pool_size=1).name == "0.1"
    for client in clients:
        client.close()


def test_an_answer_from_a_retired_session_neither_retires_its_successor_nor_revives_its_jar(
        redis_client):
    pool = SessionPool(redis_client)
    old = pool.open("job", SITE, pool_size=1)
    late = pool.open("job", SITE, pool_size=1)  # a page of the same session, still fetching
    assert pool.retire(old)
    late.jar.receive(URL, ["sid=burnt; Path=/"])
    assert not pool.save(late)
    assert not pool.retire(late)
    assert not redis_client.exists(cookie_jar_key("job", SITE, "0.0"))
    assert pool.open("job", SITE, pool_size=1).name == "0.1"


def test_a_session_past_its_uses_is_replaced_before_the_next_page(redis_client):
    pool = SessionPool(redis_client)
    names = [pool.open("job", SITE, pool_size=1, max_uses=2).name for _ in range(5)]
    assert names == ["0.0", "0.0", "0.1", "0.1", "0.2"]
    assert redis_client.hget(session_pool_key("job", SITE), "0:uses") == b"1"
    assert 0 < redis_client.ttl(session_pool_key("job", SITE)) <= 86_400


def test_the_login_state_travels_with_the_jar_and_goes_with_a_retired_session(redis_client):
    pool = SessionPool(redis_client)
    session = pool.open("job", SITE, pool_size=1)
    assert pool.save(session, {"!login": '{"ok": true}'})
    assert pool.open("job", SITE, pool_size=1).jar.meta == {"!login": '{"ok": true}'}
    pool.retire(session)
    assert pool.open("job", SITE, pool_size=1).jar.meta == {}
