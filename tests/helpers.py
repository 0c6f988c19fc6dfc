"""Small helpers shared by the integration tests (no fixtures here; see conftest.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pika
import redis

from common.config import Settings
from common.fetch import Fetcher
from common.processing import Processor
from common.results import ResultStore
from common.worker import Worker


def queue_depth(channel: Any, name: str) -> int:
    return channel.queue_declare(queue=name, passive=True).method.message_count


def drain(channel: Any, name: str) -> list[tuple[Any, Any, bytes]]:
    """Get (and ack) every message of a queue: (method, properties, body) triples."""
    out = []
    while True:
        method, props, body = channel.basic_get(name, auto_ack=True)
        if method is None:
            return out
        out.append((method, props, body))


def results(client: redis.Redis) -> list[dict]:
    return [json.loads(fields[b"json"]) for _id, fields in client.xrange("results")]


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def publish_raw(settings: Settings, queue: str, bodies: list[bytes]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        channel = connection.channel()
        for body in bodies:
            channel.basic_publish("", queue, body,
                                  pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


class WorkerThread:
    """A Worker running in a background thread of the test process (no signal handlers)."""

    def __init__(self, settings: Settings) -> None:
        client = redis.Redis.from_url(settings.redis_url)
        self.worker = Worker(settings, Processor(settings, Fetcher(settings),
                                                 ResultStore(client, settings.results_maxlen)))
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.exit_code = self.worker.run()

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if not self.worker._stop.is_set():
            self.worker._stop.set()
        self.thread.join(timeout=60)

    def join(self, timeout_s: float = 60) -> int | None:
        self.thread.join(timeout=timeout_s)
        return self.exit_code
