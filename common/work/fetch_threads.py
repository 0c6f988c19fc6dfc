"""The worker's fetch threads: a priority buffer of deliveries and the threads that process them.

Each thread takes the best delivery in the buffer (lowest rank: expired messages, then
priority_queue, then url_queue_ttl; first come first within a rank), runs the
:class:`~common.work.processor.Processor` on it and hands the outcome to the I/O thread
(``hand_over``). A thread never dies of what a delivery does:

* Redis unavailable (down, loading, a read-only replica): the thread holds its delivery and
  retries with the reconnect policy instead of dropping it;
* Redis refusing the work (OOM at ``maxmemory``, MISCONF after a failed save, NOPERM, any
  other error reply): the delivery goes back to the broker, where it is durable, after a wait
  that grows while the refusals go on, so a full Redis is not hammered;
* any other exception (a bug): the message is dead-lettered with the exception's class rather
  than crash-looping the fleet on it.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from common.broker import topology
from common.core.backoff import reconnect_delay_s
from common.core.errors import REDIS_UNAVAILABLE
from common.work.acks import Delivery
from common.work.outcome import Outcome
from common.work.processor import Processor

logger = logging.getLogger(__name__)

_STOP_THREAD = object()


class FetchThreads:
    """``count`` threads processing deliveries from one priority buffer.

    Args:
        hand_over: called in the fetch thread with each delivery and its outcome (None: give
            the delivery back to the broker, Redis went away during shutdown).
        stopping: set when the worker is stopping (no more Redis retries).
    """

    def __init__(self, count: int, processor: Processor,
                 hand_over: Callable[[Delivery, Outcome | None], None],
                 stopping: threading.Event, join_timeout_s: float) -> None:
        self.count = count
        self.processor = processor
        self._hand_over = hand_over
        self._stopping = stopping
        self._join_timeout_s = join_timeout_s
        self._buffer: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._current: dict[str, bytes] = {}  # thread name -> body it is working on
        self._refusals = 0  # Redis error replies in a row, across threads (see _refused)

    def start(self) -> None:
        for index in range(self.count):
            thread = threading.Thread(target=self._main, name=f"fetch-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Let each thread finish its delivery, then end it."""
        for _ in self._threads:
            self._buffer.put((-1, next(self._seq), _STOP_THREAD))
        for thread in self._threads:
            thread.join(timeout=self._join_timeout_s)

    def put(self, rank: int, delivery: Delivery) -> None:
        self._buffer.put((rank, next(self._seq), delivery))

    def take_unstarted(self) -> list[Delivery]:
        """Empty the buffer: the deliveries no thread has started yet."""
        taken = []
        while True:
            try:
                _rank, _seq, item = self._buffer.get_nowait()
            except queue.Empty:
                return taken
            if isinstance(item, Delivery):
                taken.append(item)

    def current_urls(self) -> list[str]:
        """The URLs being processed right now (decoded only when asked: the heartbeat)."""
        return sorted(_peek_url(body) for body in list(self._current.values()))

    def _main(self) -> None:
        while True:
            _rank, _seq, item = self._buffer.get()
            if item is _STOP_THREAD:
                return
            name = threading.current_thread().name
            try:
                self._current[name] = item.body
                outcome = self._process(item)
            finally:
                self._current.pop(name, None)
            try:
                self._hand_over(item, outcome)
            except Exception:  # noqa: BLE001 - the thread must outlive a failed hand-over
                # The delivery stays unacked on its channel; the broker redelivers it when
                # that channel goes. Log the bug loudly, keep serving.
                logger.exception("could not hand over delivery %s from %s", item.tag, item.queue)

    def _process(self, delivery: Delivery) -> Outcome | None:
        """Process a delivery; None gives it back to the broker (see the module docstring)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                if delivery.queue == topology.EXPIRED_QUEUE:
                    outcome = self.processor.process_expired(delivery.body)
                else:
                    outcome = self.processor.process(delivery.body, delivery.queue)
                self._refusals = 0
                return outcome
            except REDIS_UNAVAILABLE as exc:
                if self._stopping.is_set():
                    logger.warning("Redis down during shutdown; returning delivery: %s", exc)
                    return None
                wait_s = reconnect_delay_s(attempt)
                logger.warning("Redis unavailable (%s); holding delivery, retry in %.1fs",
                               exc, wait_s)
                time.sleep(wait_s)
            except redis.RedisError as exc:
                return self._refused(delivery, exc)
            except Exception as exc:  # noqa: BLE001 - any bug in processing, see below
                # A bug must not crash-loop the fleet on one message: log it with its
                # traceback and dead-letter the message with the exception class.
                logger.exception("unexpected error processing delivery from %s", delivery.queue)
                try:
                    return self.processor.worker_error(delivery.body, exc)
                except redis.RedisError as redis_exc:
                    return self._refused(delivery, redis_exc)

    def _refused(self, delivery: Delivery, exc: redis.RedisError) -> None:
        """Redis answered with an error: wait (longer while refusals go on), then give the
        delivery back to the broker."""
        self._refusals += 1
        wait_s = reconnect_delay_s(self._refusals)
        logger.warning("Redis refused the work for a delivery from %s (%s: %s); returning it "
                       "to the broker in %.1fs", delivery.queue, type(exc).__name__, exc, wait_s)
        if not self._stopping.is_set():
            self._stopping.wait(wait_s)
        return None


def _peek_url(body: bytes) -> str:
    """The message's URL for the heartbeat's "current" list (best effort, no validation)."""
    try:
        url = json.loads(body).get("url")
    except (ValueError, AttributeError, RecursionError):
        return "<unparsable>"
    return url if isinstance(url, str) else "<unparsable>"
