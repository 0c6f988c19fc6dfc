"""The worker: consumes the work queues, runs fetches in threads, acks only after the outcome.

Threads and ownership (pika is not thread-safe; see NOTES.md #6):

* The main thread owns the AMQP connection. It runs ``process_data_events`` in a loop, which
  keeps heartbeats flowing however long a fetch takes, receives deliveries into a local
  priority buffer, publishes dead-letters/retries with asynchronous confirms, and acks.
* ``concurrency`` fetch threads take deliveries from the buffer (priority_queue first), run
  :class:`common.work.processor.Processor`, and append the outcome to a hand-over deque.
* While every fetch thread has work, the main thread works in ticks (BUSY_TICK_S): it
  sleeps, then handles every pending AMQP event, outcome and confirm in one go. Waking for each
  frame and each outcome made the threads trade the GIL dozens of times per page (NOTES #26).
  Below that it blocks in ``process_data_events`` and fetch threads wake it when they finish.

A delivery is acked only once its outcome is durable: the result is in Redis, or every message
the outcome publishes is confirmed by the broker. A failed confirm nacks it back to its queue.

Stopping: the first SIGTERM/SIGINT cancels the consumers, returns not-yet-started deliveries to
the broker, lets running fetches finish and be acked, then exits 0. A second signal exits at
once; the broker redelivers whatever was unacked.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions

from common.broker import topology
from common.broker.connection import connect_rabbitmq
from common.broker.publisher import ConfirmingPublisher
from common.core.backoff import reconnect_delay_s
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, REDIS_UNAVAILABLE, ServiceUnavailable
from common.work import metrics
from common.work.heartbeat import Heartbeat
from common.work.processor import Outcome, Processor

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 50.0  # below compose's stop_grace_period (60 s)
_LOOP_TICK_S = 0.1
#: While work is outstanding the I/O loop runs this often (acks wait at most this long).
BUSY_TICK_S = 0.005
_STOP_THREAD = object()


@dataclass
class Delivery:
    tag: int
    queue: str
    body: bytes
    generation: int
    early_acked: bool
    received_at: float


class Worker:
    def __init__(self, settings: Settings, processor: Processor) -> None:
        self.settings = settings
        self.processor = processor
        self.processed = 0
        self.outcomes: dict[str, int] = {}
        self._buffer: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._generation = 0
        self._generation_started = False
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._publisher: ConfirmingPublisher | None = None
        self._inflight: dict[int, Delivery] = {}
        self._acks: list[int] = []  # settled with an ack, not yet handed to the channel
        self._awaiting: dict[int, list[bool]] = {}
        self._marks: dict[int, tuple[str, int] | None] = {}
        self._last_delivery = time.monotonic()
        self._consumed_since_connect = False
        self._threads: list[threading.Thread] = []
        self._current: dict[str, bytes] = {}  # fetch thread name -> body it is working on
        self._completed: collections.deque[tuple[Delivery, Outcome | None]] = (
            collections.deque())
        self._done_lock = threading.Lock()
        self._outstanding = 0  # deliveries handed to fetch threads and not yet finished
        self._ticking = False  # the I/O thread polls every BUSY_TICK_S (no wake-ups needed)
        self._wake_scheduled = False
        self.heartbeat = Heartbeat(processor.client, settings.worker_id,
                                   settings.heartbeat_interval_s, self.snapshot)

    # -- public -------------------------------------------------------------------------------
    def request_stop(self, *_args: object) -> None:
        """First call: finish in-flight work and exit. Second call: exit at once."""
        if self._stop.is_set():
            logger.warning("second stop signal: exiting now, unacked work will be redelivered")
            os._exit(1)
        logger.info("stop requested: finishing in-flight work")
        self._stop.set()

    def snapshot(self) -> dict[str, Any]:
        """What the heartbeat publishes about this worker."""
        return {"processed": self.processed, "outcomes": dict(self.outcomes),
                "in_flight": len(self._inflight), "current": sorted(_peek_url(body) for body in list(self._current.values())),
                "concurrency": self.settings.concurrency}

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def run(self) -> int:
        """Consume until stopped or idle; returns the process exit code."""
        self._start_threads()
        self.heartbeat.start()
        metrics.serve(self.settings.metrics_port)
        connected_once = False
        losses = 0  # connections lost in a row without a delivery in between
        try:
            while not self._stop.is_set():
                try:
                    self._session()
                except AMQP_CONNECTION_LOST as exc:
                    if self._stop.is_set():
                        break
                    logger.warning("broker connection lost (%s: %s); reconnecting",
                                   type(exc).__name__, exc)
                    self._drop_connection()
                    losses = 1 if self._consumed_since_connect else losses + 1
                    time.sleep(reconnect_delay_s(losses))
                except ServiceUnavailable as exc:
                    # At start-up an unreachable broker is a configuration problem: exit 3.
                    # Once we have worked, keep trying without a human (broker restarts).
                    if not connected_once or self._stop.is_set():
                        raise
                    logger.warning("%s; still retrying", exc)
                    self._drop_connection()
                finally:
                    connected_once = connected_once or self._generation_started
        finally:
            self._stop_threads()
            self._drop_connection()
            self.heartbeat.stop()
        logger.info("worker %s stopped after %d messages %s", self.settings.worker_id,
                    self.processed, self.outcomes)
        return 0

    # -- AMQP session (main thread) -------------------------------------------------------------
    def _session(self) -> None:
        self._generation += 1
        self._inflight.clear()
        self._acks.clear()
        self._outstanding = 0  # earlier deliveries are not drained: their channel is gone
        self._awaiting.clear()
        self._marks.clear()
        with self._done_lock:
            self._completed.clear()  # their channel is gone: the broker redelivers them
            self._wake_scheduled = False
        self._consumed_since_connect = False
        self._connection = connect_rabbitmq(self.settings)
        self._generation_started = True
        topology.declare(self._connection.channel())
        self._publisher = ConfirmingPublisher(self._connection)
        self._channel = self._connection.channel()
        self._channel.basic_qos(prefetch_count=self.settings.effective_prefetch)
        consumer_tags = []
        # Rank decides who a free fetch thread serves first: expired messages (a cheap Redis
        # call each), then priority_queue, then url_queue_ttl.
        for rank, name in enumerate((topology.EXPIRED_QUEUE, *topology.WORK_QUEUES)):
            callback = functools.partial(self._on_delivery, rank, name, self._generation)
            consumer_tags.append(self._channel.basic_consume(name, callback))
        logger.info("worker %s consuming %s (concurrency %d, prefetch %d%s)",
                    self.settings.worker_id, ", ".join(topology.WORK_QUEUES),
                    self.settings.concurrency, self.settings.effective_prefetch,
                    ", priority auto-ack" if self.settings.priority_auto_ack else "")
        self._last_delivery = time.monotonic()
        while not self._stop.is_set():
            self._turn()
            metrics.IN_FLIGHT.set(len(self._inflight))
            if self._idle_expired():
                logger.info("no message for %.1fs: idle exit", self.settings.idle_exit_s)
                self._stop.set()
        self._graceful_shutdown(consumer_tags)

    def _idle_expired(self) -> bool:
        idle_s = self.settings.idle_exit_s
        return (idle_s > 0 and not self._inflight
                and time.monotonic() - self._last_delivery >= idle_s)

    def _on_delivery(self, rank: int, queue_name: str, generation: int, channel: Any,
                     method: Any, _properties: Any, body: bytes) -> None:
        self._last_delivery = time.monotonic()
        self._consumed_since_connect = True
        early = self.settings.priority_auto_ack and queue_name == topology.PRIORITY_QUEUE
        if early:
            # Auto-ack mode, implemented as ack-on-receipt so prefetch still bounds the buffer.
            channel.basic_ack(method.delivery_tag)
        delivery = Delivery(method.delivery_tag, queue_name, body, generation, early,
                            time.monotonic())
        if not early:
            self._inflight[delivery.tag] = delivery
        self._outstanding += 1
        self._buffer.put((rank, next(self._seq), delivery))

    def _turn(self) -> None:
        """One turn of the I/O loop: AMQP events, finished outcomes, confirms, acks.

        Saturated (at least ``concurrency`` deliveries outstanding: every fetch thread has
        work), it ticks: sleep BUSY_TICK_S, then take every event at once. Otherwise it waits
        for the next event, and fetch threads wake it when they finish (a politeness-bound
        crawl, where every few milliseconds of hand-over add up across windows).
        """
        if self._outstanding >= self.settings.concurrency:
            with self._done_lock:
                self._ticking = True
            time.sleep(BUSY_TICK_S)  # the GIL is the fetch threads' meanwhile
            self._connection.process_data_events(time_limit=0)
        else:
            with self._done_lock:
                self._ticking = False
                pending = bool(self._completed)
            self._connection.process_data_events(time_limit=0 if pending else _LOOP_TICK_S)
        self._drain_completed()
        self._settle_confirms()
        self._flush_acks()

    def _drain_completed(self) -> None:
        """Runs on the main thread: settle every outcome the fetch threads handed over."""
        with self._done_lock:
            completed = list(self._completed)
            self._completed.clear()
            self._wake_scheduled = False
        for delivery, outcome in completed:
            self._outstanding -= 1
            self._finish(delivery, outcome)

    def _finish(self, delivery: Delivery, outcome: Outcome | None) -> None:
        """Runs on the main thread."""
        if delivery.generation != self._generation:
            return  # its channel is gone; the broker redelivers it
        if outcome is None:
            self._nack(delivery.tag)
            return
        self.processed += 1
        self.outcomes[outcome.kind] = self.outcomes.get(outcome.kind, 0) + 1
        metrics.FETCHES.labels(outcome.kind).inc()
        if outcome.kind == "dead_letter" and outcome.publishes:
            reason = (outcome.publishes[0].headers or {}).get("reason", "unknown")
            metrics.DEAD_LETTERS.labels(reason).inc()
        logger.log(logging.DEBUG if outcome.kind == "delay" else logging.INFO, "%s %s -> %s %s",
                   delivery.queue, outcome.url, outcome.kind, outcome.detail)
        if not outcome.publishes:
            if not delivery.early_acked:
                self._ack(delivery.tag)
            return
        assert self._publisher is not None
        self._awaiting[delivery.tag] = []
        self._marks[delivery.tag] = outcome.mark_done
        for publish in outcome.publishes:
            self._publisher.publish(publish.exchange, publish.routing_key, publish.body,
                                    token=(delivery.tag, len(outcome.publishes)),
                                    headers=publish.headers, expiration_ms=publish.expiration_ms)

    def _settle_confirms(self) -> None:
        if self._publisher is None:
            return
        for confirm in self._publisher.take():
            tag, expected = confirm.token
            results = self._awaiting.get(tag)
            if results is None:
                continue
            results.append(confirm.ok)
            if len(results) < expected:
                continue
            del self._awaiting[tag]
            mark = self._marks.pop(tag, None)
            if all(results) and mark is not None:
                self._mark_done(mark)
            if tag not in self._inflight:
                continue  # an early-acked delivery: nothing left to settle
            if all(results):
                self._ack(tag)
            else:
                logger.warning("publish for delivery %d not confirmed: returning it to its queue",
                               tag)
                self._nack(tag)

    def _mark_done(self, mark: tuple[str, int]) -> None:
        # On the I/O thread, but rare (dead letters only) and one loopback SADD. If Redis is
        # away the mark is skipped: the delivery is acked anyway, so nothing is redelivered.
        try:
            self.processor.mark_done(mark)
        except REDIS_UNAVAILABLE as exc:
            logger.warning("could not mark a dead-lettered URL done (Redis: %s)", exc)

    def _ack(self, tag: int) -> None:
        self._inflight.pop(tag, None)
        self._acks.append(tag)  # sent by _flush_acks at the end of this loop turn

    def _flush_acks(self) -> None:
        """Hand this loop turn's acks to the channel, as few frames as is safe.

        Tags are per channel and increase with every delivery, so one ack with
        ``multiple=True`` settles every outstanding tag up to it; that is safe below the
        lowest tag still in flight (early-acked and nacked tags are no longer outstanding).
        Acks above it go one by one, never held back: an ack waiting for a slow fetch would
        shrink the prefetch window. The asynchronous channel underneath queues the frames and
        the loop's next process_data_events writes them; BlockingChannel.basic_ack would flush
        the socket for every single ack (NOTES.md #24, #26).
        """
        if not self._acks:
            return
        floor = min(self._inflight) if self._inflight else None
        below = [tag for tag in self._acks if floor is None or tag < floor]
        channel = self._channel._impl
        if below:
            channel.basic_ack(max(below), multiple=len(below) > 1)
        if len(below) < len(self._acks):
            for tag in self._acks:
                if floor is not None and tag > floor:
                    channel.basic_ack(tag)
        self._acks.clear()

    def _nack(self, tag: int) -> None:
        self._inflight.pop(tag, None)
        self._channel._impl.basic_nack(tag, requeue=True)

    def _graceful_shutdown(self, consumer_tags: list[str]) -> None:
        for tag in consumer_tags:
            self._channel.basic_cancel(tag)
        # Deliveries not started yet go straight back to the broker.
        returned = 0
        while True:
            try:
                _rank, _seq, item = self._buffer.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Delivery):
                self._outstanding -= 1
            if isinstance(item, Delivery) and not item.early_acked:
                self._nack(item.tag)
                returned += 1
        if returned:
            logger.info("returned %d unstarted deliveries to the broker", returned)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        self._flush_acks()
        while (self._inflight or self._awaiting) and time.monotonic() < deadline:
            self._turn()
        if self._inflight:
            logger.warning("%d deliveries still running after %.0fs; the broker will redeliver",
                           len(self._inflight), SHUTDOWN_GRACE_S)
        self._connection.close()

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        self._publisher = None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except AMQP_CONNECTION_LOST as exc:
                logger.debug("closing a broken connection: %s", exc)

    # -- fetch threads --------------------------------------------------------------------------
    def _start_threads(self) -> None:
        for index in range(self.settings.concurrency):
            thread = threading.Thread(target=self._thread_main, name=f"fetch-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _stop_threads(self) -> None:
        for _ in self._threads:
            self._buffer.put((-1, next(self._seq), _STOP_THREAD))
        for thread in self._threads:
            thread.join(timeout=SHUTDOWN_GRACE_S)

    def _thread_main(self) -> None:
        while True:
            _rank, _seq, item = self._buffer.get()
            if item is _STOP_THREAD:
                return
            name = threading.current_thread().name
            try:
                self._current[name] = item.body  # decoded only when a heartbeat reads it
                outcome = self._process_with_redis_retry(item)
            finally:
                self._current.pop(name, None)
            connection = self._connection
            if connection is None or item.generation != self._generation:
                continue  # its channel is gone: the broker redelivers it
            # Hand the outcome to the I/O thread. A ticking I/O thread (see _turn) takes it
            # on its next tick; a waiting one is woken, once per batch (a write to pika's
            # wake-up socket).
            with self._done_lock:
                self._completed.append((item, outcome))
                wake = not self._ticking and not self._wake_scheduled
                self._wake_scheduled = self._wake_scheduled or wake
            if wake:
                try:
                    connection.add_callback_threadsafe(self._drain_completed)
                except AMQP_CONNECTION_LOST as exc:
                    logger.warning("connection gone before %s could be settled: %s",
                                   item.tag, exc)

    def _process_with_redis_retry(self, delivery: Delivery) -> Outcome | None:
        """Process a delivery; while Redis is down, hold it and retry instead of dropping it."""
        attempt = 0
        while True:
            attempt += 1
            try:
                if delivery.queue == topology.EXPIRED_QUEUE:
                    return self.processor.process_expired(delivery.body)
                return self.processor.process(delivery.body, delivery.queue)
            except REDIS_UNAVAILABLE as exc:
                if self._stop.is_set():
                    logger.warning("Redis down during shutdown; returning delivery: %s", exc)
                    return None
                wait_s = reconnect_delay_s(attempt)
                logger.warning("Redis unavailable (%s); holding delivery, retry in %.1fs",
                               exc, wait_s)
                time.sleep(wait_s)
            except Exception as exc:  # noqa: BLE001 - any bug in processing, see below
                # A bug must not crash-loop the fleet on one message: log it with its
                # traceback and dead-letter the message with the exception class.
                logger.exception("unexpected error processing delivery from %s", delivery.queue)
                return self.processor.worker_error(delivery.body, exc)


def _peek_url(body: bytes) -> str:
    """The message's URL for the heartbeat's "current" list (best effort, no validation)."""
    try:
        url = json.loads(body).get("url")
    except (ValueError, AttributeError, RecursionError):
        return "<unparsable>"
    return url if isinstance(url, str) else "<unparsable>"
