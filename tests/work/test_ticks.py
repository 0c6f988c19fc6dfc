"""The busy I/O thread's tick (common/work/worker.py, NOTES #26): it sleeps BUSY_TICK_S, but
outcomes piling up unacked end the tick early, before they starve the prefetch window."""

from __future__ import annotations

import time

from common.work.acks import Delivery
from common.work.loop_redis import worker_client
from common.work.processor import Processor
from common.work.worker import BUSY_TICK_S, Worker


class _Connection:
    """Stands in for the AMQP connection: _hand_over only asks it to run a callback."""

    def __init__(self) -> None:
        self.callbacks = 0

    def add_callback_threadsafe(self, _callback: object) -> None:
        self.callbacks += 1


def _worker(settings) -> Worker:
    worker = Worker(settings, Processor(settings, worker_client(settings)))
    worker._connection = _Connection()  # type: ignore[assignment]
    return worker


def _delivery(tag: int) -> Delivery:
    return Delivery(tag, "url_queue_ttl", b"{}", 0, False, time.monotonic())


def test_a_ticking_worker_is_woken_once_outcomes_fill_three_quarters_of_the_headroom(settings):
    worker = _worker(settings.with_overrides(concurrency=8, prefetch=16))
    worker._ticking = True
    assert worker._tick_batch == 6  # (16 - 8) * 3 // 4

    for tag in range(1, 6):
        worker._hand_over(_delivery(tag), None)
    assert not worker._tick.is_set()  # five outcomes wait for the tick's end
    worker._hand_over(_delivery(6), None)
    assert worker._tick.is_set()
    assert worker._connection.callbacks == 0  # a ticking thread is never woken through pika

    started = time.monotonic()
    assert worker._tick.wait(BUSY_TICK_S * 10)  # the tick the I/O thread is in ends now
    assert time.monotonic() - started < BUSY_TICK_S


def test_a_waiting_worker_is_woken_through_the_connection_once_a_batch(settings):
    worker = _worker(settings.with_overrides(concurrency=8, prefetch=16))
    worker._ticking = False

    for tag in range(1, 10):
        worker._hand_over(_delivery(tag), None)

    assert worker._connection.callbacks == 1  # once, until the I/O thread drains the batch
    assert not worker._tick.is_set()
