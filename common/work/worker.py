"""The worker: consumes the work queues, runs fetches in threads, acks only after the outcome.

Threads and ownership (pika is not thread-safe; see NOTES.md #6):

* The main thread owns the AMQP connection. It runs ``process_data_events`` in a loop, which
  keeps heartbeats flowing however long a fetch takes, receives deliveries into a local
  priority buffer, publishes dead-letters/retries with asynchronous confirms, and acks.
* ``concurrency`` fetch tasks in FETCH_LOOPS threads (common/work/fetch_loops.py: libcurl, a
  greenlet per task) run the processor on deliveries and append outcomes to a hand-over deque.
* While every fetch task has work, the main thread works in ticks (BUSY_TICK_S), handling
  every pending AMQP event, outcome and confirm in one go (NOTES #26); below that it blocks in
  ``process_data_events`` and fetch tasks wake it.

A delivery is acked only once its outcome is durable (the ack ledger, common/work/acks.py).

Backpressure (common/work/pressure.py): while a monitor thread's verdict says pause, the main
thread cancels the consumers (new messages wait in RabbitMQ); received work finishes normally.
Stopping: the first SIGTERM/SIGINT cancels the consumers, returns not-yet-started deliveries,
lets running fetches finish and be acked, then exits 0. A second signal exits at once.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import signal
import threading
import time
from typing import Any

import pika
import pika.exceptions
import redis

from common.broker import topology
from common.broker.connection import connect_rabbitmq
from common.broker.publisher import ConfirmingPublisher
from common.core.backoff import reconnect_delay_s
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, ServiceUnavailable
from common.intake.defer import Releaser
from common.store.marks import DoneMark
from common.work import metrics
from common.work.acks import AckLedger, Delivery, death_of, expiration_of
from common.work.fetch_loops import FetchLoops
from common.work.heartbeat import Heartbeat, job_fields
from common.work.idle import IdleExit
from common.work.outcome import Outcome
from common.work.pressure import Pressure, PressureMonitor, unhealthy_after
from common.work.processor import Processor

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_S, _LOOP_TICK_S = 50.0, 0.1  # the grace: below compose's stop_grace_period
#: While work is outstanding the I/O loop runs this often (acks wait at most this long), or
#: sooner once outcomes fill 3/4 of the prefetch window's headroom (NOTES #26).
BUSY_TICK_S = 0.010


class Worker:
    def __init__(self, settings: Settings, processor: Processor) -> None:
        self.settings = settings
        self.processor = processor
        self.processed = 0
        self.outcomes: dict[str, int] = {}
        self._stop = threading.Event()
        self.loops = FetchLoops(settings.concurrency, settings.fetch_loops, processor,
                                  self._hand_over, self._stop, SHUTDOWN_GRACE_S)
        self._generation, self._generation_started = 0, False
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._publisher: ConfirmingPublisher | None = None
        self.ledger = AckLedger(self._record_dead_letter)
        self._last_delivery = time.monotonic()
        self.idle = IdleExit(settings.idle_exit_s, processor.client)  # --idle-exit (idle.py)
        self._consumed_since_connect = False  # since the last connect
        self._completed: collections.deque[tuple[Delivery, Outcome | None]] = collections.deque()
        self._done_lock = threading.Lock()
        self._outstanding = 0  # deliveries handed to fetch tasks and not yet finished
        self._ticking = False  # the I/O thread polls every BUSY_TICK_S (no wake-ups needed)
        self._wake_scheduled, self._tick = False, threading.Event()  # _tick: see _hand_over
        self._tick_batch = max(1, (settings.effective_prefetch - settings.concurrency) * 3 // 4)
        self.heartbeat = Heartbeat(processor.client, settings.worker_id,
                                   settings.heartbeat_interval_s, self.snapshot)
        self.pressure = PressureMonitor(
            processor.client, Pressure(settings, unhealthy_after(settings.concurrency)),
            self.loops.streak, settings.pressure_check_s)
        self._consumer_tags: list[str] = []
        self._paused = False  # consumers cancelled (see _apply_pressure)
        self.queues = topology.worker_queues(settings.render_worker, settings.media_worker)

    def request_stop(self, *_args: object) -> None:
        """First call: finish in-flight work and exit. Second call: exit at once."""
        if self._stop.is_set():
            logger.warning("second stop signal: exiting now, unacked work will be redelivered")
            os._exit(1)
        logger.info("stop requested: finishing in-flight work")
        self._stop.set()

    def snapshot(self) -> dict[str, Any]:
        """What the heartbeat publishes (producers check seeds against fetch_allow_networks;
        the job runner ``jobs`` in flight, job submission the ``handlers`` routers)."""
        held = list(self.ledger.inflight.values())  # one C-level copy: the loops go on
        return {"processed": self.processed, "outcomes": dict(self.outcomes),
                "in_flight": len(held), "current": self.loops.current_urls(),
                **job_fields((d.body for d in held), self.settings.handlers),
                "concurrency": self.settings.concurrency,
                "fetch_allow_networks": [str(n) for n in self.settings.fetch_allow_networks],
                "pressure": self.pressure.verdict.as_dict(),
                "renderer": metrics.render_pool(self.processor.renderer)}

    def health(self) -> tuple[bool, str]:
        """/healthz: the pressure verdict, and a render worker's browser pool."""
        (healthy, why), renderer = self.pressure.health(), self.processor.renderer
        pool_ok, pool = renderer.health() if renderer is not None else (True, "")
        return healthy and pool_ok, f"{why}; {pool}" if pool else why

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def run(self) -> int:
        """Consume until stopped or idle; returns the process exit code."""
        for t in (self.loops, self.pressure, self.heartbeat, Releaser(self.settings, self._stop),
                  self.processor.watch):  # common/work/poison.py: ends the worker on a stuck page
            t.start()  # the Releaser publishes deferred URLs on time (common/intake/defer.py)
        server = metrics.serve(self.settings.metrics_port, self.health,
                               self.settings.metrics_host)  # loopback unless told
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
                    if self._stop.is_set():
                        break  # stopped while waiting for the broker: nothing in hand
                    # Unreachable at start-up: exit 3; once we have worked, keep trying.
                    if not connected_once:
                        raise
                    logger.warning("%s; still retrying", exc)
                    self._drop_connection()
                finally:
                    connected_once = connected_once or self._generation_started
        finally:
            self.loops.stop()
            self._drop_connection()
            self.heartbeat.stop()
            self.pressure.stop()
            metrics.stop(server)
            self.processor.close()
        logger.info("worker %s stopped after %d messages %s", self.settings.worker_id,
                    self.processed, self.outcomes)
        return 0

    def _session(self) -> None:
        self._generation += 1
        self._outstanding = 0  # earlier deliveries are not drained: their channel is gone
        with self._done_lock:
            self._completed.clear()  # their channel is gone: the broker redelivers them
            self._wake_scheduled = False
        self._consumed_since_connect = False
        self._connection = connect_rabbitmq(self.settings, stop=self._stop)
        self._generation_started = True
        topology.declare(self._connection.channel(), self.settings.queue_type)
        self._publisher = ConfirmingPublisher(self._connection)
        self._channel = self._connection.channel()
        self.ledger.reset(self._channel._impl, self._publisher)
        self._channel.basic_qos(prefetch_count=self.settings.effective_prefetch)
        self._consumer_tags = []
        self._apply_pressure(force=True)  # consume, unless paused
        self._last_delivery = time.monotonic()
        while not self._stop.is_set():
            self._turn()
            self._apply_pressure()
            metrics.IN_FLIGHT.set(len(self.ledger.inflight))
            if self.idle.due(self._last_delivery, self._paused or bool(self.ledger.inflight),
                             self._channel):
                logger.info("no message for %.1fs: idle exit", self.settings.idle_exit_s)
                self._stop.set()
        self._graceful_shutdown()

    def _apply_pressure(self, force: bool = False) -> None:
        """Main thread: follow the pressure verdict. Pausing cancels the consumers (pika nacks
        what it had not dispatched yet); resuming consumes again. Received work goes on."""
        verdict = self.pressure.verdict
        if verdict.paused == self._paused and not force:
            return
        if verdict.paused:
            for tag in self._consumer_tags:
                self._channel.basic_cancel(tag)
            self._consumer_tags = []
            logger.warning("paused: %s; %d deliveries in flight finish, new ones wait in "
                           "RabbitMQ", verdict.reason, len(self.ledger.inflight))
        else:
            # Rank decides who a free fetch task serves first: expired messages (a cheap Redis
            # call each; HTTP workers only), then priority_queue, then url_queue_ttl.
            expired = (topology.EXPIRED_QUEUE,) if self.queues == topology.WORK_QUEUES else ()
            for rank, name in enumerate(expired + self.queues, start=1 - len(expired)):
                callback = functools.partial(self._on_delivery, rank, name, self._generation)
                self._consumer_tags.append(self._channel.basic_consume(name, callback))
            logger.info("worker %s consuming %s (concurrency %d, prefetch %d%s)",
                        self.settings.worker_id, ", ".join(self.queues),
                        self.settings.concurrency, self.settings.effective_prefetch,
                        ", priority auto-ack" if self.settings.priority_auto_ack else "")
            self._last_delivery = time.monotonic()  # a pause is not idleness
        self._paused = verdict.paused

    def _on_delivery(self, rank: int, queue_name: str, generation: int, channel: Any,
                     method: Any, properties: Any, body: bytes) -> None:
        self._last_delivery = time.monotonic()
        self._consumed_since_connect = True
        early = self.settings.priority_auto_ack and queue_name == topology.PRIORITY_QUEUE
        if early:
            # Auto-ack mode, implemented as ack-on-receipt so prefetch still bounds the buffer.
            channel.basic_ack(method.delivery_tag)
        delivery = Delivery(method.delivery_tag, queue_name, body, generation, early,
                            time.monotonic(), expiration_of(properties), method.redelivered,
                            death_of(properties) if rank == 0 else None)
        self.ledger.received(delivery)
        self._outstanding += 1
        self.loops.put(rank, delivery)

    def _turn(self) -> None:
        """One turn of the I/O loop: AMQP events, finished outcomes, confirms, acks.

        Saturated (at least ``concurrency`` deliveries outstanding: every fetch task has
        work), it ticks: sleep BUSY_TICK_S, then take every event at once. Otherwise it waits
        for the next event, and fetch tasks wake it when they finish (a politeness-bound
        crawl, where every few milliseconds of hand-over add up across windows).
        """
        if self._outstanding >= self.settings.concurrency:
            with self._done_lock:
                self._ticking = True
            self._tick.wait(BUSY_TICK_S)  # the GIL is the fetch loops' meanwhile
            self._tick.clear()
            self._connection.process_data_events(time_limit=0)
        else:
            with self._done_lock:
                self._ticking = False
                pending = bool(self._completed)
            self._connection.process_data_events(time_limit=0 if pending else _LOOP_TICK_S)
        self._drain_completed()
        self._settle_confirms()
        self.ledger.flush()

    def _drain_completed(self) -> None:
        """Runs on the main thread: settle every outcome the fetch tasks handed over."""
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
            self.ledger.give_back(delivery)
            return
        self.processed += 1
        self.outcomes[outcome.kind] = self.outcomes.get(outcome.kind, 0) + 1
        metrics.count_outcome(delivery.queue, outcome)  # its metrics and its log line
        if not outcome.publishes:
            if not delivery.early_acked:
                self.ledger.ack(delivery.tag)
            return
        assert self._publisher is not None
        self.ledger.expect_confirms(delivery.tag, outcome.mark_done, outcome.record)
        for publish in outcome.publishes:
            self._publisher.publish(publish.exchange, publish.routing_key, publish.body,
                                    token=(delivery.tag, len(outcome.publishes)),
                                    headers=publish.headers, expiration_ms=publish.expiration_ms)

    def _settle_confirms(self) -> None:
        if self._publisher is None:
            return
        for tag in self.ledger.settle(self._publisher.take()):
            logger.warning("publish for delivery %d not confirmed: returned it to its queue", tag)

    def _record_dead_letter(self, mark: DoneMark | None, record: dict[str, Any] | None) -> None:
        # On the I/O thread, but rare (dead letters) and one script call. If it fails the record
        # is skipped: the dead letter is durable in failed_urls, and the delivery is acked.
        try:
            self.processor.record_dead_letter(mark, record)
        except Exception as exc:  # noqa: BLE001 - the I/O thread must outlive a bad record
            logger.warning("could not record a dead-lettered URL's outcome (%s: %s)",
                           type(exc).__name__, exc, exc_info=not isinstance(exc, redis.RedisError))

    def _graceful_shutdown(self) -> None:
        for tag in self._consumer_tags:
            self._channel.basic_cancel(tag)
        # Deliveries not started yet go straight back to the broker (a copy, #40).
        returned = 0
        for item in self.loops.take_unstarted():
            self._outstanding -= 1
            self.ledger.give_back(item)
            returned += 1
        if returned:
            logger.info("returned %d unstarted deliveries to the broker", returned)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        self.ledger.flush()
        while self.ledger.unsettled and time.monotonic() < deadline:
            self._turn()
        if self.ledger.inflight:
            logger.warning("%d deliveries still running after %.0fs; the broker will redeliver",
                           len(self.ledger.inflight), SHUTDOWN_GRACE_S)
        self._connection.close()

    def _hand_over(self, delivery: Delivery, outcome: Outcome | None) -> None:
        """Runs in a fetch task: give the outcome to the I/O thread. A ticking I/O thread
        (see _turn) takes it on its next tick; a waiting one is woken, once per batch (a write
        to pika's wake-up socket)."""
        connection = self._connection
        if connection is None or delivery.generation != self._generation:
            return  # its channel is gone: the broker redelivers it
        with self._done_lock:
            self._completed.append((delivery, outcome))
            wake = not self._ticking and not self._wake_scheduled
            self._wake_scheduled = self._wake_scheduled or wake
            if self._ticking and len(self._completed) == self._tick_batch:
                self._tick.set()  # unacked outcomes would soon starve the prefetch window
        if wake:
            try:
                connection.add_callback_threadsafe(self._drain_completed)
            except AMQP_CONNECTION_LOST as exc:
                logger.warning("connection gone before %s could be settled: %s",
                               delivery.tag, exc)

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        self._publisher = None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except AMQP_CONNECTION_LOST as exc:
                logger.debug("closing a broken connection: %s", exc)
