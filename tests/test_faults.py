"""Faults, with nothing lost: kill -9, broker and Redis restarts, SIGTERM, poison messages.

Real RabbitMQ and Redis (conftest.py), the loopback test site, workers and the producer as
separate processes, because these faults happen to processes. The session broker is shared
by every test: a test that stops it starts it again in ``finally``. The Redis-restart test runs
its own append-only Redis, since the session Redis keeps nothing across a restart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.urls import canonicalize
from common.intake.producer import Producer
from devtools.services import FleetServices, LocalRabbitMQ, LocalRedis
from tests.helpers import (
    REPO_ROOT,
    TEST_ENV,
    drain,
    output_of,
    own_channel,
    publish_raw,
    queue_depth,
    results,
    start_worker_process,
    wait_for,
)

HOLD_QUEUES = tuple(topology.hold_name(level) for level in topology.HOLD_LEVELS_MS)
#: Every queue a message can be in while it still has work ahead of it.
PENDING_QUEUES = (*topology.WORK_QUEUES, *HOLD_QUEUES, topology.EXPIRED_QUEUE)


def _seed(settings: Settings, client: redis.Redis, urls: list[str]) -> list[str]:
    """Publish ``urls`` through the producer path; return them canonicalised."""
    with Producer(settings, client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()
    return [canonicalize(url) for url in urls]


def _per_url(client: redis.Redis) -> Counter[str]:
    return Counter(record["url"] for record in results(client))


def _left_in_queues(channel: Any) -> dict[str, int]:
    """Queues that still hold messages. A passive declare counts ready messages only, so call
    it once no worker is connected (their unacked messages are back in the queue by then)."""
    depths = {name: queue_depth(channel, name) for name in (*PENDING_QUEUES,
                                                            topology.FAILED_QUEUE)}
    return {name: depth for name, depth in depths.items() if depth}


def _target(url: str) -> str:
    """The request target the test site logs for ``url`` (path and query)."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _fetch_counts(site: Any, prefix: str) -> Counter[str]:
    return Counter(record.path for record in site.requests_for(prefix))


def _broker_or_skip(services: FleetServices) -> LocalRabbitMQ:
    if services.rabbitmq is None:
        pytest.skip("the broker was not started by these tests, so it cannot be restarted")
    return services.rabbitmq


@contextmanager
def _broker_down(broker: LocalRabbitMQ) -> Iterator[None]:
    """Stop the RabbitMQ application for the duration of the block; always start it again."""
    broker.stop_app()
    try:
        yield
    finally:
        broker.start_app()


def _finish_with_a_new_worker(settings: Settings, concurrency: int) -> None:
    """Run a fresh worker until the queues are idle; it must exit 0."""
    finisher = start_worker_process(settings, "--concurrency", str(concurrency),
                                    "--idle-exit", "2")
    try:
        assert finisher.wait(timeout=60) == 0, output_of(finisher)[-3000:]
    finally:
        _stop(finisher)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


# -- kill -9 ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_mid_crawl_loses_nothing_and_refetches_at_most_what_was_in_flight(
        settings, redis_client, amqp_channel, site):
    concurrency = 4
    urls = _seed(settings, redis_client, [site.url(f"/slow/0.5?n={i}") for i in range(32)])
    doomed = start_worker_process(settings, "--concurrency", str(concurrency))
    try:
        assert wait_for(lambda: redis_client.xlen("results") >= 6, 30), output_of(doomed)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
    finally:
        _stop(doomed)
    assert doomed.returncode == -signal.SIGKILL
    # Once the process is gone nothing more reaches the site: what it asked for and did not
    # record was in flight, and only that may be fetched twice.
    time.sleep(0.2)  # a request sent just before the kill may still be on its way to the log
    asked = set(_fetch_counts(site, "/slow/"))
    recorded = {_target(url) for url in _per_url(redis_client)}
    in_flight = asked - recorded
    assert 0 < len(in_flight) <= concurrency

    _finish_with_a_new_worker(settings, concurrency)

    per_url = _per_url(redis_client)
    assert set(per_url) == set(urls)
    assert max(per_url.values()) == 1, [u for u, n in per_url.items() if n > 1]
    fetched = _fetch_counts(site, "/slow/")
    refetched = {path for path, n in fetched.items() if n > 1}
    assert max(fetched.values()) <= 2
    assert refetched <= in_flight, (refetched, in_flight)
    assert _left_in_queues(amqp_channel) == {}


# -- RabbitMQ restarted -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_broker_restart_mid_crawl_is_survived_and_every_url_gets_one_result(
        services, settings, redis_client, site):
    # No amqp_channel fixture here or below: its connection would not survive the restart.
    broker = _broker_or_skip(services)
    urls = _seed(settings, redis_client, [site.url(f"/slow/0.2?b={i}") for i in range(40)])
    worker = start_worker_process(settings, "--concurrency", "4", "--idle-exit", "4")
    try:
        assert wait_for(lambda: redis_client.xlen("results") >= 4, 30), output_of(worker)
        with _broker_down(broker):
            time.sleep(1.0)
            assert worker.poll() is None, output_of(worker)[-3000:]
        # Durable queues kept the persistent messages; the worker reconnects on its own.
        assert worker.wait(timeout=120) == 0, output_of(worker)[-3000:]
    finally:
        _stop(worker)

    log = output_of(worker)
    assert "broker connection lost" in log or "still retrying" in log, log[-3000:]
    per_url = _per_url(redis_client)
    assert set(per_url) == set(urls)
    assert max(per_url.values()) == 1, [u for u, n in per_url.items() if n > 1]
    with own_channel(settings) as channel:
        assert _left_in_queues(channel) == {}


# -- Redis restarted ----------------------------------------------------------------------------


def _unacked(broker: LocalRabbitMQ | None, queue: str) -> int | None:
    """Unacknowledged messages of ``queue`` right now (None without a local broker)."""
    if broker is None:
        return None
    listing = broker.ctl("list_queues", "-q", "--no-table-headers", "name",
                         "messages_unacknowledged").stdout
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == queue:
            return int(parts[1])
    return None


@pytest.mark.slow
def test_while_redis_is_down_nothing_is_acked_or_dropped_and_the_crawl_resumes_after(
        services, settings, amqp_channel, site):
    with LocalRedis(appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        own = settings.with_overrides(redis_url_raw=server.url)
        urls = _seed(own, client, [site.url(f"/slow/0.2?r={i}") for i in range(40)])
        worker = start_worker_process(own, "--concurrency", "2", "--idle-exit", "3",
                                      env={"PREFETCH": "4"})
        try:
            assert wait_for(lambda: client.xlen("results") >= 4, 30), output_of(worker)
            client.shutdown()  # clean: the append-only file has everything
            assert wait_for(lambda: not server.running, 10)
            time.sleep(1.0)  # an outcome already past Redis may still be acked
            ready_before = queue_depth(amqp_channel, topology.NORMAL_QUEUE)
            time.sleep(3.0)
            # A worker that acked would be sent more (ready drops); one that gave messages
            # back would raise it. The prefetch window stays full and unacked.
            assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == ready_before > 0
            assert _unacked(services.rabbitmq, topology.NORMAL_QUEUE) in (4, None)
            assert worker.poll() is None, output_of(worker)[-3000:]
            server.start()  # same port, same directory: the AOF is replayed
            assert worker.wait(timeout=90) == 0, output_of(worker)[-3000:]
            per_url = _per_url(client)
        finally:
            _stop(worker)
            client.close()
        log = output_of(worker)
        assert "Redis unavailable" in log and "holding delivery" in log, log[-3000:]
    assert set(per_url) == set(urls)
    assert max(per_url.values()) == 1, [u for u, n in per_url.items() if n > 1]
    dead = drain(amqp_channel, topology.FAILED_QUEUE)
    assert dead == [], [(p.headers, b[:200]) for _m, p, b in dead]
    assert _left_in_queues(amqp_channel) == {}


# -- SIGTERM twice ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_sigterm_exits_at_once_and_the_in_flight_work_is_redelivered(
        settings, redis_client, amqp_channel, site):
    slow = [site.url(f"/slow/6?t={i}") for i in range(2)]
    rest = [site.page_url(n) for n in range(1, 9)]
    urls = _seed(settings, redis_client, slow + rest)
    slow_urls = urls[:len(slow)]
    worker = start_worker_process(settings, "--concurrency", "2")
    try:
        assert wait_for(lambda: len(site.requests_for("/slow/")) == 2, 20), output_of(worker)
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert worker.poll() is None  # the first signal waits for the two slow fetches
        worker.send_signal(signal.SIGTERM)
        second_at = time.monotonic()
        worker.wait(timeout=10)
        exit_s = time.monotonic() - second_at
    finally:
        _stop(worker)
    assert worker.returncode not in (0, None), output_of(worker)[-3000:]
    assert exit_s < 2.0, f"took {exit_s:.1f}s after the second signal"
    assert "second stop signal" in output_of(worker)
    assert not set(slow_urls) & set(_per_url(redis_client))  # they were still running

    _finish_with_a_new_worker(settings, 4)
    per_url = _per_url(redis_client)
    assert set(per_url) == set(urls)
    assert max(per_url.values()) == 1
    # The two interrupted fetches were done again; nothing else was fetched twice.
    assert sorted(_fetch_counts(site, "/slow/").values()) == [2, 2]
    assert max(_fetch_counts(site, "/page/").values()) == 1
    assert _left_in_queues(amqp_channel) == {}


# -- poison messages ----------------------------------------------------------------------------


def _poison_run(settings: Settings, amqp_channel: Any, site: Any,
                bodies: list[tuple[str, bytes]], concurrency: int = 2
                ) -> tuple[dict[bytes, Any], str]:
    """Publish each of ``bodies`` (queue, body) after a good message, run a worker process until
    every good URL has a result and every body is dead-lettered, then stop it with SIGTERM.

    Returns ({body: dead-letter headers}, worker output).
    """
    goods = [canonicalize(site.url(f"/page/{n}?poison-neighbour"))
             for n in range(1, len(bodies) + 2)]
    for good, (queue, body) in zip(goods, bodies, strict=False):
        publish_raw(settings, queue, [WorkMessage(url=good).to_json(), body])
    publish_raw(settings, topology.NORMAL_QUEUE, [WorkMessage(url=goods[-1]).to_json()])
    client = redis.Redis.from_url(settings.redis_url)
    worker = start_worker_process(settings, "--concurrency", str(concurrency))
    try:
        # A worker that stops taking work (a dead fetch thread) fails here, not by a timeout.
        settled = wait_for(lambda: client.xlen("results") == len(goods)
                           and queue_depth(amqp_channel, topology.FAILED_QUEUE) == len(bodies),
                           15)
        assert settled, output_of(worker)[-3000:]
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0, output_of(worker)[-3000:]
        assert sorted(record["url"] for record in results(client)) == sorted(goods)
    finally:
        _stop(worker)
        client.close()
    dead = {body: props.headers for _m, props, body in drain(amqp_channel,
                                                                topology.FAILED_QUEUE)}
    for name in (*topology.WORK_QUEUES, *HOLD_QUEUES):
        assert queue_depth(amqp_channel, name) == 0, name
    return dead, output_of(worker)


def test_poison_variants_on_both_work_queues_are_dead_lettered_as_bad_messages(
        settings, amqp_channel, site):
    good_url = site.page_url(7)
    poison = [
        b'{"url": ["' + good_url.encode() + b'"]}',           # url of the wrong type
        b'{"url": {"href": "' + good_url.encode() + b'"}}',
        b'{"url": null}',
        b'{"url": ""}',
        b'{"depth": 0, "attempts": 0}',                        # no url at all
        json.dumps({"url": good_url, "depth": -1}).encode(),   # out-of-range and wrong types
        json.dumps({"url": good_url, "depth": "1"}).encode(),
        json.dumps({"url": good_url, "depth": 1.5}).encode(),
        json.dumps({"url": good_url, "attempts": True}).encode(),
        json.dumps({"url": good_url, "enqueued_at": "yesterday"}).encode(),
        json.dumps({"url": good_url, "fp": 12345}).encode(),
        b"42", b"null", b'"' + good_url.encode() + b'"',      # JSON, but not an object
        b"",
        b"x" * (4 * 1024 * 1024),                               # a huge body
    ]
    queues = [topology.WORK_QUEUES[i % 2] for i in range(len(poison))]
    dead, _log = _poison_run(settings, amqp_channel, site, list(zip(queues, poison,
                                                                    strict=True)))
    assert set(dead) == set(poison)
    assert {body: headers["reason"] for body, headers in dead.items()} == {
        body: "bad_message" for body in poison}
    assert all(headers["last_error"] for headers in dead.values())
    assert site.count("/page/7") == 0  # none of them was fetched


def test_a_huge_url_inside_valid_json_is_dead_lettered_as_an_invalid_url(settings,
                                                                        amqp_channel, site):
    body = json.dumps({"url": site.url("/page/1?" + "q" * 3_000_000)}).encode()
    dead, _log = _poison_run(settings, amqp_channel, site, [(topology.NORMAL_QUEUE, body)])
    assert [headers["reason"] for headers in dead.values()] == ["invalid_url"]


def test_deeply_nested_json_is_a_bad_message_and_the_worker_keeps_going(settings,
                                                                       amqp_channel, site):
    # One fetch thread: if the poison message takes it down, nothing after it is processed.
    body = b'{"url": ' * 100_000
    dead, log = _poison_run(settings, amqp_channel, site, [(topology.NORMAL_QUEUE, body)],
                            concurrency=1)
    assert [headers["reason"] for headers in dead.values()] == ["bad_message"], log[-2000:]


def test_a_url_with_a_lone_surrogate_is_an_invalid_url_not_a_worker_error(settings,
                                                                         amqp_channel, site):
    body = b'{"url": "' + site.url("/page/1/").encode() + b'\\ud800"}'
    dead, log = _poison_run(settings, amqp_channel, site, [(topology.NORMAL_QUEUE, body)])
    assert [headers["reason"] for headers in dead.values()] == ["invalid_url"], log[-2000:]


# -- the producer and a broker restart ----------------------------------------------------------


def _drain_urls(channel: Any) -> list[str]:
    """Take every message out of the work queues; return the URLs they carry."""
    urls = []
    for name in topology.WORK_QUEUES:
        expected = queue_depth(channel, name)
        for _method, _props, body in channel.consume(name, auto_ack=True,
                                                     inactivity_timeout=2):
            if body is None:
                break
            urls.append(json.loads(body)["url"])
        channel.cancel()
        assert len(urls) >= expected
    return urls


def _write_lines(stdin: Any, lines: list[str]) -> None:
    stdin.write("".join(f"{line}\n" for line in lines))
    stdin.flush()


@pytest.mark.slow
def test_producer_survives_a_broker_restart_and_leaves_no_unpublished_url_marked_seen(
        services, settings, tmp_path):
    broker = _broker_or_skip(services)
    batch = 500
    urls = [f"http://127.0.0.1:9/produce/{i}" for i in range(20_000)]
    env = dict(os.environ, **TEST_ENV, RABBITMQ_URL=settings.rabbitmq_url,
               REDIS_URL=settings.redis_url, PYTHONUNBUFFERED="1",
               PRODUCER_BATCH=str(batch), CONNECT_RETRY_S="60")
    stderr = (tmp_path / "producer.err").open("w+")
    # URLs stream in on stdin, so the broker goes away while the producer is mid-stream, with
    # a connection open and more URLs to come: the next batch meets the dead connection and
    # has to reconnect (with backoff: the broker is still down then).
    producer = subprocess.Popen([sys.executable, "producer.py", "--json", "-"], cwd=REPO_ROOT,
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=stderr, text=True)
    try:
        _write_lines(producer.stdin, urls[:5000])
        with own_channel(settings) as channel:
            assert wait_for(lambda: queue_depth(channel, topology.NORMAL_QUEUE) == 5000, 30)
        with _broker_down(broker):
            _write_lines(producer.stdin, urls[5000:5000 + batch])
            time.sleep(2.0)
        for start in range(5000 + batch, len(urls), batch):
            _write_lines(producer.stdin, urls[start:start + batch])
        stdout, _ = producer.communicate(timeout=120)
    finally:
        _stop(producer)
    stderr.seek(0)
    log = stderr.read()
    assert producer.returncode in (0, 1), log[-3000:]
    assert "broker connection lost" in log, log[-3000:]
    summary = json.loads(stdout)
    assert summary["read"] == len(urls) and summary["invalid"] == 0
    # Every URL is accounted for: published (new) or reported failed and released.
    assert summary["new"] + summary["failed"] == len(urls), (summary, log[-3000:])

    with own_channel(settings) as channel:
        first = _drain_urls(channel)
        # Every URL reported new is in the queue once (nothing was in flight at the drop).
        assert len(first) == len(set(first)) == summary["new"]

        listing = tmp_path / "urls.txt"
        listing.write_text("\n".join(urls) + "\n")
        again = subprocess.run([sys.executable, "producer.py", "--json", "-f", str(listing)],
                               cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                               timeout=120, check=False)
        assert again.returncode == 0, again.stderr[-3000:]
        rerun = json.loads(again.stdout)
        # Only the URLs the first run could not publish count as new the second time.
        assert (rerun["new"], rerun["duplicate"]) == (summary["failed"], summary["new"])
        second = _drain_urls(channel)
        assert len(second) == rerun["new"]
        assert sorted(first + second) == sorted(urls)
