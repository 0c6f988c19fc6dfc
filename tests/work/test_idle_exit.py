"""``--idle-exit`` (common/work/idle.py): a worker idle for that long exits, but not while a
retry or a wait shorter than that rides a hold queue, or a URL deferred in Redis is due within
it; a longer wait does not keep it.

Real RabbitMQ, Redis, a worker process and the loopback test site.
"""

from __future__ import annotations

import logging
import time

import pika
import pytest
import redis

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.urls import canonicalize, domain_of
from common.intake.defer import Pending
from common.store.keys import deferred_key
from common.work.idle import IdleExit
from tests.helpers import output_of, queue_depth, results, start_worker_process, wait_for

pytestmark = pytest.mark.integration

IDLE_S = 2.0
SHORT_MS, LONG_MS = 1600, 6400  # a hold queue within the idle time, and one beyond it


def _hold(channel, level_ms: int, url: str) -> None:
    """``url``'s message into the hold queue of ``level_ms``: back in url_queue_ttl after it."""
    channel.basic_publish(topology.hold_name(level_ms), topology.NORMAL_QUEUE,
                          WorkMessage(url).to_json(), pika.BasicProperties(delivery_mode=2))


def _idle_run(settings, place, env: dict[str, str] | None = None) -> str:
    """An idle worker (IDLE_S) that sees ``place()`` put work on its way late in its idle time;
    returns its output once it exited 0."""
    worker = start_worker_process(settings, "--idle-exit", str(IDLE_S), "--concurrency", "2",
                                  env=env)
    try:
        assert wait_for(lambda: "consuming" in output_of(worker), 30), output_of(worker)[-3000:]
        # Late in the idle time: the short wait ends after it (without the check the worker
        # left at IDLE_S, the URL still waiting), the long one far after.
        time.sleep(IDLE_S / 2)
        place()
        assert worker.wait(timeout=30) == 0, output_of(worker)[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return output_of(worker)


def test_an_idle_worker_stays_for_a_short_hold_and_leaves_a_long_one_waiting(
        settings, redis_client, amqp_channel, site):
    short, long = canonicalize(site.page_url(1)), canonicalize(site.page_url(2))

    def place() -> None:
        _hold(amqp_channel, SHORT_MS, short)
        _hold(amqp_channel, LONG_MS, long)

    output = _idle_run(settings, place)
    assert [r["url"] for r in results(redis_client)] == [short]
    assert "wait in hold queues" in output
    # The long wait is still on its way: in its hold queue, or already back in the work queue.
    assert queue_depth(amqp_channel, topology.hold_name(LONG_MS)) + queue_depth(
        amqp_channel, topology.NORMAL_QUEUE) == 1


def _defer(client, url: str, due_in_ms: int) -> None:
    """``url``'s message deferred in Redis as the producer defers it, due ``due_in_ms`` from
    now on Redis's clock: a worker's releaser publishes it then."""
    seconds, micros = client.time()
    member = Pending(domain_of(url), topology.NORMAL_QUEUE, None,
                     WorkMessage(url).to_json()).member()
    client.zadd(deferred_key(), {member: seconds * 1000 + micros // 1000 + due_in_ms})
    client.hincrby(deferred_key("counts"), domain_of(url), 1)


def test_an_idle_worker_stays_for_a_url_deferred_in_redis_due_soon_and_leaves_a_later_one(
        settings, redis_client, site):
    soon, later = canonicalize(site.page_url(3)), canonicalize(site.page_url(4))

    def place() -> None:
        _defer(redis_client, soon, SHORT_MS)
        _defer(redis_client, later, LONG_MS)

    # A short lead: the worker's releaser looks for due URLs every 0.2 s (5 s at DEFER_LEAD_S 0)
    output = _idle_run(settings, place, env={"DEFER_LEAD_S": "0.4"})
    assert [r["url"] for r in results(redis_client)] == [soon], output[-3000:]
    assert "1 deferred in Redis are due within it" in output
    left = [Pending.from_member(m).body for m in redis_client.zrange(deferred_key(), 0, -1)]
    assert [WorkMessage.from_json(body).url for body in left] == [later]  # still waiting


def test_an_idle_worker_whose_redis_does_not_answer_stays_rather_than_leave_deferred_urls(
        settings, amqp_channel, caplog):
    caplog.set_level(logging.INFO, logger="common.work.idle")
    # Nothing listens on port 9 of loopback: the count of deferred URLs is unknown.
    idle = IdleExit(IDLE_S, redis.Redis(host="127.0.0.1", port=9, socket_connect_timeout=1))
    assert idle.deferred() == -1
    assert not idle.due(time.monotonic() - 2 * IDLE_S, busy=False, channel=amqp_channel)
    assert "staying" in caplog.text and "an unknown number (Redis not answering)" in caplog.text
    assert IdleExit(IDLE_S).due(time.monotonic() - 2 * IDLE_S, False, amqp_channel)  # no Redis
