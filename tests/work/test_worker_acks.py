"""How the worker batches acks (common/work/worker.py ``_flush_acks``): pure tests on a recording
channel, so each case can say exactly which frames go out. The end-to-end tests (exactly one
result per URL, kill -9, broker restarts) run the same code against RabbitMQ."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from common.core.config import Settings
from common.work.worker import Delivery, Worker


class RecordingChannel:
    def __init__(self) -> None:
        self.frames: list[tuple[str, int, bool]] = []

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.frames.append(("ack", tag, multiple))

    def basic_nack(self, tag: int, requeue: bool = True) -> None:
        self.frames.append(("nack", tag, False))


def worker_with(inflight: list[int]) -> tuple[Worker, RecordingChannel]:
    processor: Any = SimpleNamespace(client=None)
    worker = Worker(Settings(), processor)
    channel = RecordingChannel()
    worker._channel = SimpleNamespace(_impl=channel)
    for tag in inflight:
        worker._inflight[tag] = Delivery(tag, "url_queue_ttl", b"{}", 0, False, 0.0)
    return worker, channel


def test_acks_below_every_unsettled_delivery_go_out_as_one_multiple_ack() -> None:
    worker, channel = worker_with([1, 2, 3, 4, 5])
    for tag in (3, 1, 2):
        worker._ack(tag)
    worker._flush_acks()
    assert channel.frames == [("ack", 3, True)]


def test_acks_above_a_delivery_still_in_flight_are_sent_one_by_one_not_held() -> None:
    worker, channel = worker_with([1, 2, 3, 4, 5, 6])
    for tag in (1, 2, 4, 6):
        worker._ack(tag)
    worker._flush_acks()
    # 3 and 5 are still being fetched: 1-2 together, 4 and 6 alone.
    assert channel.frames == [("ack", 2, True), ("ack", 4, False), ("ack", 6, False)]
    assert sorted(worker._inflight) == [3, 5] and worker._acks == []


def test_a_single_ack_is_not_sent_as_multiple() -> None:
    worker, channel = worker_with([7, 8])
    worker._ack(7)
    worker._flush_acks()
    assert channel.frames == [("ack", 7, False)]


def test_a_nacked_delivery_below_the_acks_does_not_stop_the_batch() -> None:
    worker, channel = worker_with([1, 2, 3])
    worker._nack(1)  # returned to the broker at once; no longer outstanding
    worker._ack(2)
    worker._ack(3)
    worker._flush_acks()
    assert channel.frames == [("nack", 1, False), ("ack", 3, True)]


def test_with_no_ack_pending_nothing_is_sent() -> None:
    worker, channel = worker_with([4])
    worker._flush_acks()
    assert channel.frames == []
