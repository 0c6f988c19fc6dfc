"""Fetch loops outlive whatever Redis answers: against a real Redis that refuses writes
(``maxmemory`` reached under ``noeviction``), the delivery goes back to the broker and the
same loop serves the next one once Redis accepts writes again."""

from __future__ import annotations

import queue
import threading

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.work.acks import Delivery
from common.work.fetch_loops import FetchLoops
from common.work.processor import Processor


@pytest.fixture
def full_redis(redis_client, memory_limit) -> None:
    """The test Redis with every write refused (OOM); memory_limit restores it."""
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", 1)


def _delivery(tag: int, url: str) -> Delivery:
    body = WorkMessage(url=url).to_json()
    return Delivery(tag, topology.NORMAL_QUEUE, body, 0, False, 0.0)


def test_a_redis_that_refuses_writes_returns_the_delivery_and_the_loop_lives_on(
        settings, redis_client, site, full_redis):
    handed: queue.Queue = queue.Queue()
    stopping = threading.Event()
    processor = Processor(settings.with_overrides(robots_enabled=False), redis_client)
    threads = FetchLoops(1, 1, processor, lambda d, o: handed.put((d, o)), stopping, 5.0)
    threads.start()
    try:
        threads.put(1, _delivery(1, site.page_url(1)))
        delivery, outcome = handed.get(timeout=30)
        assert delivery.tag == 1 and outcome is None  # back to the broker, not dead-lettered

        redis_client.config_set("maxmemory", 0)  # the operator makes room
        threads.put(1, _delivery(2, site.page_url(2)))
        delivery, outcome = handed.get(timeout=30)
        assert delivery.tag == 2 and outcome is not None and outcome.kind == "result"
    finally:
        stopping.set()
        threads.stop()
        processor.close()
