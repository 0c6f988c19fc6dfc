"""Backpressure: a worker stops taking deliveries while Redis is too full (memory against
maxmemory, the sinks' backlog) or keeps refusing, and takes them again once it is not; messages
wait in RabbitMQ meanwhile. /healthz turns 503 after repeated Redis errors.

The watermark logic is tested alone (no Redis, no sleeping); the rest against the real test
RabbitMQ and Redis, with maxmemory, consumer groups and ACLs changed on the test Redis and
restored afterwards."""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from common.broker import topology
from common.core.backoff import RECONNECT_MAX_S, reconnect_delay_s
from common.intake.producer import Producer
from common.store.backlog import Fill
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM, SINKS, sink_group
from common.work import metrics
from common.work.acks import Delivery
from common.work.fetch_loops import FetchLoops
from common.work.pressure import (
    BACKLOG,
    ERRORS,
    MEMORY,
    REFUSING,
    UNAVAILABLE,
    Pressure,
    Streak,
    Watermark,
    unhealthy_after,
)
from tests.helpers import WorkerThread, drain, own_channel, results, wait_for

# -- the decision, alone ------------------------------------------------------------------------


def _fill(used: int = 0, maxmemory: int = 0, backlog: int | None = None) -> Fill:
    sinks = {} if backlog is None else {"s": backlog}
    return Fill(used, maxmemory, {RESULTS_STREAM: 0, FAILURES_STREAM: 0}, sinks)


def test_a_watermark_engages_above_high_and_releases_only_below_low():
    mark = Watermark(high=0.9, low=0.8)
    seen = [mark.update(v) for v in (0.5, 0.9, 0.91, 0.85, 0.8, 0.79, 0.85, 0.9, 0.95, None)]
    assert seen == [False, False, True, True, True, False, False, False, True, False]


def test_pressure_pauses_at_the_high_watermarks_and_resumes_below_the_low_ones(settings):
    pressure = Pressure(settings.with_overrides(redis_memory_high=0.9, redis_memory_low=0.8,
                                                results_backlog_high=5, results_backlog_low=2),
                        unhealthy_after_errors=10)
    quiet = Streak()

    def reasons(fill: Fill) -> tuple[str, ...]:
        return pressure.decide(fill, None, quiet, now=100.0).reasons

    assert reasons(_fill(used=10**9)) == ()  # no maxmemory: never
    assert reasons(_fill(used=91, maxmemory=100)) == (MEMORY,)
    assert reasons(_fill(used=85, maxmemory=100)) == (MEMORY,)  # between: still paused
    assert reasons(_fill(used=79, maxmemory=100)) == ()
    assert reasons(_fill(used=85, maxmemory=100)) == ()  # between: still running
    assert reasons(_fill(backlog=5)) == ()
    assert reasons(_fill(backlog=6)) == (BACKLOG,)
    assert reasons(_fill(used=95, maxmemory=100, backlog=3)) == (MEMORY, BACKLOG)
    assert reasons(_fill(used=50, maxmemory=100, backlog=2)) == (BACKLOG,)
    verdict = pressure.decide(_fill(backlog=1), None, quiet, now=100.0)
    assert not verdict.paused and verdict.unhealthy is None
    assert verdict.as_dict()["backlog"] == 1 and verdict.as_dict()["backlog_high"] == 5


def test_a_failed_check_pauses_and_keeps_the_watermarks_until_the_next_reading(settings):
    pressure = Pressure(settings.with_overrides(results_backlog_high=5, results_backlog_low=2),
                        unhealthy_after_errors=10)
    pressure.decide(_fill(backlog=9), None, Streak(), now=0.0)
    gone = pressure.decide(None, redis.ConnectionError("refused"), Streak(), now=1.0)
    assert gone.reasons == (UNAVAILABLE, BACKLOG) and gone.reason == UNAVAILABLE
    assert "ConnectionError: refused" in gone.figures["error"] and gone.unhealthy is None
    refused = pressure.decide(None, redis.ResponseError("NOPERM"), Streak(), now=2.0)
    assert refused.reasons == (REFUSING, BACKLOG)
    assert pressure.decide(_fill(backlog=0), None, Streak(), now=3.0).reasons == ()


def test_errors_in_a_row_make_the_worker_unhealthy_and_paused_then_half_open(settings):
    pressure = Pressure(settings, unhealthy_after_errors=10, errors_retry_s=10.0)
    below = pressure.decide(_fill(), None, Streak(9, 50.0, "NOPERM"), now=51.0)
    assert below.unhealthy is None and not below.paused
    streak = Streak(10, 50.0, "NoPermissionError: NOPERM")
    tripped = pressure.decide(_fill(), None, streak, now=51.0)
    assert tripped.reasons == (ERRORS,) and "10 Redis errors in a row" in tripped.unhealthy
    # No new error for errors_retry_s: it takes deliveries again to find out, still unhealthy.
    trying = pressure.decide(_fill(), None, streak, now=60.5)
    assert not trying.paused and trying.unhealthy
    assert pressure.decide(_fill(), None, Streak(), now=61.0).unhealthy is None


def test_n_is_three_errors_per_fetch_thread_and_at_least_ten():
    assert unhealthy_after(8) == 24 and unhealthy_after(1) == 10 and unhealthy_after(4) == 12


def test_a_refusal_returns_the_delivery_within_the_capped_wait_however_long_the_streak(
        settings):
    # The wait comes from the reconnect policy, whose float arithmetic overflowed past ~1,024
    # refusals in a row (a fetch thread died of it); its exponent is clamped, and the wait ends
    # at once on stop.
    stopping = threading.Event()
    threads = FetchLoops(1, 1, None, lambda d, o: None, stopping, 1.0)  # type: ignore[arg-type]
    threads._refusals = 5000
    stopping.set()
    delivery = Delivery(1, topology.NORMAL_QUEUE, b"{}", 0, False, 0.0)
    assert threads._refused(delivery, redis.ResponseError("MISCONF")) is None
    assert threads.streak().count == 1 and "MISCONF" in threads.streak().last_error
    threads._refused(delivery, redis.exceptions.OutOfMemoryError("OOM"))
    assert threads.streak().count == 1  # OOM is memory pressure, not an error streak
    assert reconnect_delay_s(threads._refusals) <= RECONNECT_MAX_S


# -- /healthz and /metrics -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode(), response.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers["Content-Type"]
    except (urllib.error.URLError, ConnectionError) as exc:  # not listening yet
        return 0, str(exc), ""


def test_the_metrics_port_answers_healthz_and_still_serves_the_metrics():
    health = [(True, "ok")]
    port = _free_port()
    server = metrics.serve(port, lambda: health[-1], address="127.0.0.1")
    try:
        assert _get(port, "/healthz")[:2] == (200, "ok\n")
        health.append((False, "12 Redis errors in a row"))
        status, body, _ = _get(port, "/healthz")
        assert status == 503 and body == "unhealthy: 12 Redis errors in a row\n"
        status, body, content_type = _get(port, "/metrics")
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        assert "# TYPE fleet_in_flight gauge" in body and "fleet_worker_healthy" in body
    finally:
        metrics.stop(server)


# -- a worker against the real services ---------------------------------------------------


def _seed(settings, client, urls):
    with Producer(settings, client) as producer:
        producer.submit(urls)
    return urls


def _consumers(settings, queue: str) -> int:
    with own_channel(settings) as channel:
        return channel.queue_declare(queue=queue, passive=True).method.consumer_count


def _ready(settings, queue: str) -> int:
    with own_channel(settings) as channel:
        return channel.queue_declare(queue=queue, passive=True).method.message_count


def _one_result_each(client, urls) -> None:
    per_url = collections.Counter(r["url"] for r in results(client))
    assert set(per_url) == set(urls) and max(per_url.values()) == 1, per_url


def _nothing_dead_lettered(settings, client) -> None:
    with own_channel(settings) as channel:
        dead = drain(channel, topology.FAILED_QUEUE)
    assert dead == [] and client.xlen(FAILURES_STREAM) == 0, dead


def test_a_worker_pauses_while_redis_memory_is_over_maxmemory_and_resumes_on_its_own(
        settings, redis_client, site, run_cli, memory_limit):
    urls = _seed(settings, redis_client, [site.url(f"/slow/0.2?m={i}") for i in range(30)])
    own = settings.with_overrides(concurrency=2, prefetch=2, idle_exit_s=2.0,
                                  pressure_check_s=0.2, heartbeat_interval_s=0.5,
                                  worker_id="mem-w1")
    with WorkerThread(own) as running:
        worker = running.worker
        assert wait_for(lambda: redis_client.xlen(RESULTS_STREAM) >= 3, 60)
        redis_client.config_set("maxmemory-policy", "noeviction")
        used = redis_client.info("memory")["used_memory"]
        redis_client.config_set("maxmemory", max(1, used - 64 * 1024))  # just below used
        assert wait_for(lambda: worker.pressure.verdict.reason == MEMORY, 30)
        assert wait_for(lambda: _consumers(own, topology.NORMAL_QUEUE) == 0, 30)

        result = run_cli("stats.py", "--json")
        assert result.returncode == 0, result.stderr
        snapshot = json.loads(result.stdout)
        pressure = snapshot["pressure"]
        assert MEMORY in pressure["paused"] and pressure["redis_memory"]["over_high"]
        # Its heartbeat cannot be rewritten (SET is refused) but stays listed (EXPIRE is not).
        assert "mem-w1" in [w["id"] for w in snapshot["workers"]]
        assert pressure["redis_memory"]["ratio"] > 0.9, pressure
        table = run_cli("stats.py")
        assert "pressure: paused: Redis memory" in table.stdout, table.stdout
        assert worker.loops.alive() == 2 and running.thread.is_alive()
        assert _ready(own, topology.NORMAL_QUEUE) > 0  # the rest waits in RabbitMQ

        redis_client.config_set("maxmemory", 0)  # the operator makes room
        assert wait_for(lambda: not worker.pressure.verdict.paused, 30)
        assert running.join(120) == 0
    assert worker.loops.alive() == 0  # stopped cleanly, none died before
    _one_result_each(redis_client, urls)
    _nothing_dead_lettered(own, redis_client)


@pytest.fixture
def sink_test(redis_client) -> Iterator[str]:
    """A registered sink ``test`` that the test itself plays: groups on both streams."""
    for stream in (RESULTS_STREAM, FAILURES_STREAM):
        redis_client.xgroup_create(stream, sink_group("test"), id="0", mkstream=True)
    redis_client.sadd(SINKS, "test")
    yield "test"
    redis_client.srem(SINKS, "test")


def _ack_everything(client) -> int:
    """What the sink does: read every new entry through its group and acknowledge it."""
    acked = 0
    for stream, entries in client.xreadgroup(sink_group("test"), "c1",
                                             {RESULTS_STREAM: ">", FAILURES_STREAM: ">"},
                                             count=1000):
        ids = [entry_id for entry_id, _fields in entries]
        if ids:
            acked += client.xack(stream, sink_group("test"), *ids)
    return acked


def test_a_worker_pauses_at_the_results_backlog_and_resumes_once_the_sink_acknowledges(
        settings, redis_client, site, run_cli, sink_test):
    urls = _seed(settings, redis_client, [site.url(f"/slow/0.2?b={i}") for i in range(20)])
    env = {"RESULTS_BACKLOG_HIGH": "5", "RESULTS_BACKLOG_LOW": "2"}
    own = settings.with_overrides(concurrency=1, prefetch=1, idle_exit_s=2.0,
                                  pressure_check_s=0.1, heartbeat_interval_s=0.3,
                                  results_backlog_high=5, results_backlog_low=2,
                                  worker_id="backlog-w1")
    with WorkerThread(own) as running:
        worker = running.worker
        assert wait_for(lambda: worker.pressure.verdict.reason == BACKLOG, 60)
        assert wait_for(lambda: _consumers(own, topology.NORMAL_QUEUE) == 0, 30)
        # What it had received finishes; then nothing more until the sink catches up.
        assert wait_for(lambda: not worker.ledger.inflight, 30)
        held = redis_client.xlen(RESULTS_STREAM)
        assert 5 < held < len(urls)

        snapshots = []

        def reported_paused() -> bool:
            result = run_cli("stats.py", "--json", env=env)
            assert result.returncode == 0, result.stderr
            snapshots.append(json.loads(result.stdout))
            mine = [w for w in snapshots[-1]["workers"] if w["id"] == "backlog-w1"]
            return bool(mine) and mine[0]["pressure"].get("backlog") == held

        assert wait_for(reported_paused, 30, step_s=0.3)  # its heartbeat caught up
        snapshot = snapshots[-1]
        assert snapshot["pressure"]["paused_workers"] == {"backlog-w1": BACKLOG}
        [me] = [w for w in snapshot["workers"] if w["id"] == "backlog-w1"]
        assert me["pressure"]["paused"] and me["pressure"]["reason"] == BACKLOG
        assert me["pressure"]["backlog_sink"] == "test" and me["pressure"]["backlog_high"] == 5
        assert snapshot["pressure"]["results_backlog"] == {
            "entries": held, "sink": "test", "by_sink": {"test": held}, "high": 5, "low": 2,
            "over_high": True}
        table = run_cli("stats.py", env=env).stdout
        assert f"paused: results backlog ({held:,} entries, sink test" in table, table
        assert redis_client.xlen(RESULTS_STREAM) == held and worker.loops.alive() == 1

        resumed = 0
        deadline = time.monotonic() + 300
        while running.thread.is_alive() and time.monotonic() < deadline:
            # The sink at work: the worker pauses at the backlog and resumes, again and again.
            _ack_everything(redis_client)
            if wait_for(lambda: not worker.pressure.verdict.paused, 0.5):
                resumed += 1
        assert running.exit_code == 0 and resumed
    _ack_everything(redis_client)
    _one_result_each(redis_client, urls)
    _nothing_dead_lettered(own, redis_client)


@pytest.fixture
def restricted_url(settings, redis_client) -> Iterator[str]:
    """A Redis user that may do everything but run scripts: the worker's hot path (one Lua
    call per page) is refused with NOPERM; the status reads and the heartbeat are not."""
    redis_client.acl_setuser("pressure-test", enabled=True, passwords=["+sesame"],
                             keys=["*"], channels=["*"], commands=["+@all", "-@scripting"])
    parts = urlsplit(settings.redis_url)
    try:
        yield urlunsplit(parts._replace(netloc=f"pressure-test:sesame@{parts.netloc}"))
    finally:
        redis_client.acl_deluser("pressure-test")


def test_healthz_turns_503_after_repeated_redis_refusals_and_200_once_redis_accepts(
        settings, redis_client, site, restricted_url):
    urls = _seed(settings, redis_client, [site.page_url(n) for n in range(1, 31)])
    port = _free_port()
    own = settings.with_overrides(redis_url_raw=restricted_url, concurrency=2, prefetch=2,
                                  idle_exit_s=2.0, pressure_check_s=0.2, metrics_port=port)
    with WorkerThread(own) as running:
        worker = running.worker
        n = unhealthy_after(2)
        assert wait_for(lambda: _get(port, "/healthz")[0] == 503, 120), worker.loops.streak()
        status, body, _ = _get(port, "/healthz")
        assert status == 503 and "Redis errors in a row" in body and "NoPermission" in body
        assert worker.loops.streak().count >= n and worker.loops.alive() == 2
        assert wait_for(lambda: worker.pressure.verdict.reason == ERRORS, 10)
        assert 'fleet_worker_healthy 0.0' in _get(port, "/metrics")[1]

        redis_client.acl_setuser("pressure-test", enabled=True,  # Redis accepts again
                                 commands=["+@all"])
        assert wait_for(lambda: _get(port, "/healthz")[0] == 200, 120)
        assert running.join(120) == 0
    _one_result_each(redis_client, urls)
    _nothing_dead_lettered(own, redis_client)
