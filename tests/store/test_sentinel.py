"""Redis through Sentinel, results confirmed by the replicas (WAIT), Redis Cluster refused.

A real primary, two replicas and three sentinels on loopback (the session's ``sentinel_group``,
healed and flushed before each test by ``sentinels``). The fleet-wide failover test is
tests/test_sentinel_failover.py.
"""

from __future__ import annotations

import secrets
import threading
import time

import pytest
import redis

from common.core.config import load_settings
from common.core.errors import (
    REDIS_UNAVAILABLE,
    ConfigError,
    ReplicaTimeout,
    ServiceUnavailable,
)
from common.store.connection import FleetRedis, connect_redis
from common.store.dedupe import DoneSet
from common.store.keys import COUNTERS, RESULTS_STREAM
from common.store.results import REPLICA_WAITS, ResultStore
from devtools.services import LocalRedis
from devtools.services.base import find_binaries, free_port
from devtools.services.redis_sentinel import LocalSentinel, SentinelGroup


def _store(group: SentinelGroup, **env: str) -> tuple[FleetRedis, ResultStore, DoneSet]:
    settings = load_settings({**group.env, "CONNECT_RETRY_S": "10", **env})
    client = connect_redis(settings)
    return client, ResultStore(client, 1000), DoneSet(client, 16)


def _record(store: ResultStore, done: DoneSet, url: str) -> bool:
    return store.record({"url": url}, done=done.mark_for(url))


def _connected_to(client: redis.Redis) -> tuple[str, int]:
    connection = client.connection_pool.get_connection()
    try:
        return connection.host, connection.port
    finally:
        client.connection_pool.release(connection)


def _replicas(group: SentinelGroup) -> list[redis.Redis]:
    primary = group.primary()
    return [redis.Redis(host=n.host, port=n.port) for n in group.nodes if n is not primary]


def _commands(client: redis.Redis, name: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


# -- settings -------------------------------------------------------------------------------------

def test_sentinel_addresses_are_parsed_and_a_bad_one_is_named():
    settings = load_settings({"REDIS_SENTINELS": "sentinel-a:26379, [::1]:26380",
                              "REDIS_SENTINEL_MASTER": "fleet"})
    assert settings.redis_sentinels == (("sentinel-a", 26379), ("::1", 26380))
    assert load_settings({}).redis_sentinels == ()
    with pytest.raises(ConfigError, match="REDIS_SENTINELS.*expected host:port"):
        load_settings({"REDIS_SENTINELS": "sentinel-1"})


def test_a_cluster_url_names_every_node_and_a_bad_node_is_named():
    url = "redis+cluster://:secret@cache-a:7000,cache-b:7001"
    assert load_settings({"REDIS_URL": url}).redis_url == url
    with pytest.raises(ConfigError, match="REDIS_URL.*host:port.*'cache-b'"):
        load_settings({"REDIS_URL": "redis+cluster://cache-a:7000,cache-b"})
    with pytest.raises(ConfigError, match="REDIS_URL.*database 0 only"):
        load_settings({"REDIS_URL": "redis+cluster://cache-a:7000/3"})


def test_a_cluster_with_sentinels_is_refused_saying_which_setting():
    with pytest.raises(ConfigError, match="REDIS_SENTINELS and a redis\\+cluster"):
        connect_redis(load_settings({"REDIS_URL": "redis+cluster://127.0.0.1:7000",
                                     "REDIS_SENTINELS": "127.0.0.1:26379"}))


def test_sentinels_with_a_unix_socket_url_are_refused():
    settings = load_settings({"REDIS_SENTINELS": "127.0.0.1:26379",
                              "REDIS_URL": "unix://localhost/run/redis.sock"})
    with pytest.raises(ConfigError, match="REDIS_SENTINELS.*unix"):
        connect_redis(settings)


@pytest.mark.integration
def test_a_redis_cluster_node_is_refused_at_connect_not_at_the_first_script():
    # The cluster bus port defaults to port + 10000: given, so any free port works.
    with LocalRedis(extra_args=["--cluster-enabled", "yes",
                                "--cluster-port", str(free_port())]) as node:
        settings = load_settings({"REDIS_URL": node.url, "CONNECT_RETRY_S": "5"})
        with pytest.raises(ConfigError, match="is a Redis Cluster node.*redis\\+cluster://"):
            connect_redis(settings)


@pytest.mark.integration
def test_sentinels_refusing_the_login_stop_the_start_at_once_naming_the_setting():
    password = secrets.token_hex(8)
    with LocalRedis() as node, LocalSentinel("solo", (node.host, node.port), password=password,
                                             binary=find_binaries(["redis"])["redis-server"]
                                             ) as sentinel:
        env = {"REDIS_SENTINELS": f"{sentinel.host}:{sentinel.port}",
               "REDIS_SENTINEL_MASTER": "solo", "CONNECT_RETRY_S": "30"}
        for wrong in ({}, {"REDIS_SENTINEL_PASSWORD": "not-" + password}):
            started = time.monotonic()
            with pytest.raises(ServiceUnavailable, match="check REDIS_SENTINEL_PASSWORD") as exc:
                connect_redis(load_settings({**env, **wrong}))
            assert time.monotonic() - started < 5, "not retried for CONNECT_RETRY_S"
            assert password not in str(exc.value)
        right = connect_redis(load_settings({**env, "REDIS_SENTINEL_PASSWORD": password}))
        assert right.ping() and _connected_to(right) == (node.host, node.port)


# -- through Sentinel -----------------------------------------------------------------------------

def test_a_client_through_sentinel_writes_to_the_primary_and_replicas_follow(sentinels):
    client, store, done = _store(sentinels)
    assert _record(store, done, "http://a.test/1")
    assert _connected_to(client) == sentinels.primary_address()
    replica = _replicas(sentinels)[0]
    assert replica.role()[0] == b"slave"
    with pytest.raises(redis.ReadOnlyError) as refused:
        replica.set("x", 1)
    # A demoted primary answers the same: the worker holds the delivery and retries.
    assert isinstance(refused.value, REDIS_UNAVAILABLE)


@pytest.mark.slow
def test_after_a_failover_the_same_client_writes_to_the_new_primary_and_its_script_reloads(
        sentinels):
    client, store, done = _store(sentinels)
    for n in range(20):
        assert _record(store, done, f"http://a.test/{n}")
    old = sentinels.primary_address()
    assert client.wait(2, 5000) == 2  # this connection's writes are on both replicas
    # The script cache is not replicated: the promoted replica has never seen the script.
    assert not any(r.script_exists(store._record.sha)[0] for r in _replicas(sentinels))

    killed_at = sentinels.kill_primary()
    new, promoted_at = sentinels.wait_for_failover(old)
    errors: set[str] = set()
    while True:
        try:
            assert _record(store, done, "http://a.test/after")
            break
        except REDIS_UNAVAILABLE as exc:  # what the worker's hold-and-retry covers
            errors.add(type(exc).__name__)
            assert time.time() - killed_at < 30, errors
            time.sleep(0.1)
    recovered_at = time.time()

    assert _connected_to(client) == new != old
    assert store.count() == 21, "every result written before the kill is on the new primary"
    assert not _record(store, done, "http://a.test/3"), "the done marks moved with it"
    assert errors <= {"ConnectionError", "MasterNotFoundError", "TimeoutError"}, errors
    assert recovered_at - promoted_at < 5, (killed_at, promoted_at, recovered_at)


# -- WAIT: a result counts once the replicas have it -----------------------------------------------

def test_with_min_replicas_a_result_is_on_every_replica_when_record_returns(sentinels):
    _client, store, done = _store(sentinels, REDIS_MIN_REPLICAS="2")
    replicas = _replicas(sentinels)
    for n in range(50):
        assert _record(store, done, f"http://b.test/{n}")
        # No waiting here: record returned, so both replicas already hold the entry.
        assert [r.xlen(RESULTS_STREAM) for r in replicas] == [n + 1, n + 1]
    # The pipelined script call loads the script again after NOSCRIPT (a promoted replica).
    redis.Redis.from_url(sentinels.url).script_flush()
    assert _record(store, done, "http://b.test/after-flush")
    assert [r.xlen(RESULTS_STREAM) for r in replicas] == [51, 51]


def test_late_replicas_are_waited_for_then_it_is_a_replica_timeout_and_a_retry_adds_nothing(
        sentinels):
    _client, store, done = _store(sentinels, REDIS_MIN_REPLICAS="3",  # only 2 replicas exist
                                  REDIS_WAIT_TIMEOUT_MS="200", REDIS_WAIT_MAX_S="0.5")
    started = time.monotonic()
    with pytest.raises(ReplicaTimeout, match="2 of 3 replicas confirmed.*http://c.test/1"):
        _record(store, done, "http://c.test/1")
    assert time.monotonic() - started >= 0.7, "one WAIT, then waited again for 0.5 s"
    # The fetch thread holds the delivery on this error, as on any Redis outage.
    assert issubclass(ReplicaTimeout, REDIS_UNAVAILABLE)
    assert store.count() == 1, "on the primary, but not confirmed: the delivery is not acked"
    assert int(store.client.hget(COUNTERS, REPLICA_WAITS)) >= 2
    assert done.contains(done.mark_for("http://c.test/1"))  # the next pass is already_done
    with pytest.raises(ReplicaTimeout):
        _record(store, done, "http://c.test/1")
    assert store.count() == 1
    # A dead letter's failure record (the worker's I/O thread) gets one WAIT, no more.
    started = time.monotonic()
    with pytest.raises(ReplicaTimeout, match="within 0.2s"):
        store.record_failure({"url": "http://c.test/2"}, done.mark_for("http://c.test/2"))
    assert time.monotonic() - started < 0.5


def test_a_demoted_primary_ends_the_wait_with_an_outage_so_the_page_is_redone(sentinels):
    """A split brain: the primary lost its replicas to a newer primary. Sentinel demotes it,
    closing its clients' connections; the result was never confirmed, so never acked."""
    _client, store, done = _store(sentinels, REDIS_MIN_REPLICAS="3",
                                  REDIS_WAIT_TIMEOUT_MS="100", REDIS_WAIT_MAX_S="60")
    outcome: list[BaseException | bool] = []

    def record() -> None:
        try:
            outcome.append(_record(store, done, "http://s.test/1"))
        except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
            outcome.append(exc)

    waiting = threading.Thread(target=record)
    waiting.start()
    time.sleep(1.0)
    assert waiting.is_alive() and outcome == [], "still waiting: nothing returned, nothing acked"
    primary = redis.Redis.from_url(sentinels.url)
    # What Sentinel does on demotion. A connection killed while the waiting client is between
    # two commands is reopened unseen by the next one (a loaded machine hits that window), as
    # a demoted primary's next write would then fail READONLY: kill until the wait sees it.
    deadline = time.monotonic() + 10
    while waiting.is_alive() and time.monotonic() < deadline:
        primary.client_kill_filter(_type="normal", skipme=True)
        waiting.join(0.5)
    assert not waiting.is_alive()
    assert isinstance(outcome[0], REDIS_UNAVAILABLE), outcome


def test_without_min_replicas_record_sends_no_wait(sentinels):
    client, store, done = _store(sentinels)
    primary = redis.Redis.from_url(sentinels.url)
    before = _commands(primary, "wait"), _commands(primary, "evalsha")
    for n in range(10):
        assert _record(store, done, f"http://d.test/{n}")
    after = _commands(primary, "wait"), _commands(primary, "evalsha")
    assert after[0] == before[0], "no WAIT on the hot path when REDIS_MIN_REPLICAS=0"
    assert after[1] - before[1] == 10
    _client2, replicated, done2 = _store(sentinels, REDIS_MIN_REPLICAS="1")
    for n in range(10):
        assert _record(replicated, done2, f"http://e.test/{n}")
    assert _commands(primary, "wait") - after[0] == 10, "one WAIT per result, pipelined"
    client.close()


def test_a_redelivery_that_finds_its_outcome_recorded_waits_for_the_replicas_before_its_ack(
        sentinels):
    _client, store, done = _store(sentinels, REDIS_MIN_REPLICAS="2")
    primary = redis.Redis.from_url(sentinels.url)
    before = _commands(primary, "wait")
    store.confirm_replicated("http://f.test/1")
    assert _commands(primary, "wait") - before == 1, "one WAIT for the redelivered outcome"
    _client3, late, _done3 = _store(sentinels, REDIS_MIN_REPLICAS="3",  # only 2 replicas exist
                                    REDIS_WAIT_TIMEOUT_MS="100", REDIS_WAIT_MAX_S="0.3")
    with pytest.raises(ReplicaTimeout, match="2 of 3 replicas confirmed.*http://f.test/2"):
        late.confirm_replicated("http://f.test/2")  # not acked: the delivery is held
    _client4, off, _done4 = _store(sentinels)
    before = _commands(primary, "wait")
    off.confirm_replicated("http://f.test/3")
    assert _commands(primary, "wait") == before, "nothing without REDIS_MIN_REPLICAS"
