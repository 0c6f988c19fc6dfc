"""The worker's fetch loops: a priority buffer of deliveries and the loops that process them.

FETCH_LOOPS threads (1) each run a :class:`~common.web.multi.FetchLoop` with their share of
WORKER_CONCURRENCY tasks (8). A task takes the best delivery in the buffer (lowest rank:
expired messages, then priority_queue, then url_queue_ttl; first come first within a rank),
runs the :class:`~common.work.processor.Processor` on it and hands the outcome to the I/O
thread (``hand_over``). Fetches, and the replies to the two per-page Redis scripts
(common/work/loop_redis.py), are waited for side by side in the loop; the CPU work (parsing,
recording) is done by one task at a time, so the GIL is not traded between eight fetch
threads (NOTES #26). A loop never dies of what a delivery does, and a Redis error gives the
delivery back to the broker, where it is durable, within a bounded time:

* Redis unavailable (down, loading, a read-only replica): the task holds its delivery and
  retries with the reconnect policy, for up to HOLD_MAX_S (a restart is ridden out in place),
  then gives it back (the worker is paused by then: common/work/pressure.py);
* Redis refusing the work (OOM at ``maxmemory``, MISCONF after a failed save, NOPERM, any
  other error reply): the delivery goes back after a wait that grows while the refusals go on
  (at most RECONNECT_MAX_S, 5 s), so a full Redis is not hammered. Refusals other than OOM in
  a row, across tasks, are the :class:`~common.work.pressure.Streak` that makes the worker
  unhealthy;
* any other exception (a bug): the message is dead-lettered with the exception's class rather
  than crash-looping the fleet on it.

Add a Redis call's own timeout (``socket_timeout``, 10 s in ``connect_redis``) to each bound;
a Redis call other than the two per-page scripts blocks its loop meanwhile.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable

import redis

from common.broker import topology
from common.core.backoff import reconnect_delay_s
from common.core.errors import REDIS_UNAVAILABLE
from common.web import multi
from common.web.multi import FetchLoop
from common.work import metrics
from common.work.acks import Delivery
from common.work.outcome import Outcome
from common.work.pressure import Streak
from common.work.processor import Processor

logger = logging.getLogger(__name__)

#: Longest a delivery is held while Redis is unavailable before it goes back to the broker.
HOLD_MAX_S = 30.0
#: Longest an idle loop waits before it looks at the buffer and the stop flag again.
_IDLE_WAIT_S = 0.1


class FetchLoops:
    """``count`` tasks in ``loops`` threads, processing deliveries from one priority buffer.

    Args:
        hand_over: called in the loop's thread with each delivery and its outcome (None: give
            the delivery back to the broker, Redis went away during shutdown).
        stopping: set when the worker is stopping (no more Redis retries).
    """

    def __init__(self, count: int, loops: int, processor: Processor,
                 hand_over: Callable[[Delivery, Outcome | None], None],
                 stopping: threading.Event, join_timeout_s: float) -> None:
        self.count = count
        loops = max(1, min(loops, count))
        self._shares = [count // loops + (1 if i < count % loops else 0) for i in range(loops)]
        self.processor = processor
        self._hand_over = hand_over
        self._stopping = stopping
        self._join_timeout_s = join_timeout_s
        self._buffer: queue.PriorityQueue[tuple[int, int, Delivery]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._threads: list[tuple[threading.Thread, int]] = []
        self._loops: list[tuple[FetchLoop, int]] = []  # each running loop and its share
        self._closing = False  # stop(): loops take no more deliveries, end with their tasks
        self._current: dict[int, bytes] = {}  # task number -> body it is working on
        self._refusals = 0  # Redis error replies in a row, across tasks (see _refused)
        self._errors = Streak()  # the same, OOM not counted: the worker's health
        self._lock = threading.Lock()  # refusals only; a success resets without it

    def start(self) -> None:
        for index, share in enumerate(self._shares):
            thread = threading.Thread(target=self._main, args=(share,), name=f"fetch-{index}",
                                      daemon=True)
            thread.start()
            self._threads.append((thread, share))

    def stop(self) -> None:
        """Let each loop finish the deliveries it started, then end it."""
        self._closing = True
        for loop, _share in list(self._loops):
            loop.wake()
        for thread, _share in self._threads:
            thread.join(timeout=self._join_timeout_s)

    def put(self, rank: int, delivery: Delivery) -> None:
        self._buffer.put((rank, next(self._seq), delivery))
        for loop, share in self._loops:
            if loop.asleep and loop.tasks < share:
                loop.wake()
                return

    def take_unstarted(self) -> list[Delivery]:
        """Empty the buffer: the deliveries no task has started yet."""
        taken = []
        while True:
            try:
                _rank, _seq, item = self._buffer.get_nowait()
            except queue.Empty:
                return taken
            taken.append(item)

    def alive(self) -> int:
        """How many tasks the running loops can run at once (``count`` while all is well)."""
        return sum(share for thread, share in self._threads if thread.is_alive())

    def streak(self) -> Streak:
        """Error replies in a row, OOM not counted (see common/work/pressure.py)."""
        return self._errors

    def current_urls(self) -> list[str]:
        """The URLs being processed right now (decoded only when asked: the heartbeat)."""
        return sorted(_peek_url(body) for body in list(self._current.values()))

    def _main(self, share: int) -> None:
        loop = FetchLoop(max_connects=max(4, 4 * share))
        buffer = self._buffer

        def wanted() -> bool:
            return self._closing or (loop.tasks < share and not buffer.empty())

        entry = (loop, share)
        self._loops.append(entry)
        self.processor.warm()  # this loop's user-code children import meanwhile
        try:
            while True:
                while loop.tasks < share and not self._closing:
                    try:
                        _rank, _seq, item = buffer.get_nowait()
                    except queue.Empty:
                        break
                    loop.spawn(self._serve, item)
                if self._closing and not loop.tasks:
                    return
                loop.run_once(_IDLE_WAIT_S, wanted)
        finally:
            self._loops.remove(entry)
            loop.close()

    def _serve(self, item: Delivery) -> None:
        """One task: process one delivery and hand its outcome over."""
        key = next(self._seq)
        try:
            self._current[key] = item.body
            outcome = self._process(item)
        except Exception:  # noqa: BLE001 - e.g. a bug in worker_error itself
            logger.exception("could not process delivery %s from %s; returning it",
                             item.tag, item.queue)
            outcome = None
        finally:
            self._current.pop(key, None)
        try:
            self._hand_over(item, outcome)
        except Exception:  # noqa: BLE001 - the loop must outlive a failed hand-over
            # The delivery stays unacked on its channel; the broker redelivers it when
            # that channel goes. Log the bug loudly, keep serving.
            logger.exception("could not hand over delivery %s from %s", item.tag, item.queue)

    def _process(self, delivery: Delivery) -> Outcome | None:
        """Process a delivery; None gives it back to the broker (see the module docstring)."""
        attempt = 0
        held_since = time.monotonic()
        while True:
            attempt += 1
            try:
                if delivery.queue == topology.EXPIRED_QUEUE:
                    outcome = self.processor.process_expired(delivery.body, delivery.death)
                else:
                    outcome = self.processor.process(delivery.body, delivery.queue,
                                                     delivery.redelivered,
                                                     delivery.expiration_ms)
                if self._refusals or self._errors.count:
                    self._refusals, self._errors = 0, Streak()
                return outcome
            except REDIS_UNAVAILABLE as exc:
                held_s = time.monotonic() - held_since
                if self._stopping.is_set() or held_s >= HOLD_MAX_S:
                    logger.warning("Redis unavailable for %.0fs (%s); returning the delivery "
                                   "to the broker", held_s, exc)
                    return None
                wait_s = min(reconnect_delay_s(attempt),
                             HOLD_MAX_S - held_s)
                logger.warning("Redis unavailable (%s); holding delivery, retry in %.1fs",
                               exc, wait_s)
                multi.sleep(wait_s, until=self._stopping)
            except redis.RedisError as exc:
                return self._refused(delivery, exc)
            except Exception as exc:  # noqa: BLE001 - any bug in processing, see below
                # A bug must not crash-loop the fleet on one message: log it with its
                # traceback and dead-letter the message with the exception class.
                logger.exception("unexpected error processing delivery from %s", delivery.queue)
                try:
                    return self.processor.worker_error(delivery.body, exc)
                except REDIS_UNAVAILABLE as redis_exc:
                    logger.warning("Redis unavailable (%s); returning the delivery", redis_exc)
                    return None
                except redis.RedisError as redis_exc:
                    return self._refused(delivery, redis_exc)

    def _refused(self, delivery: Delivery, exc: redis.RedisError) -> None:
        """Redis answered with an error: wait (longer while refusals go on), then give the
        delivery back to the broker."""
        metrics.REDIS_REFUSALS.inc()
        with self._lock:
            self._refusals += 1
            refusals = self._refusals
            if not isinstance(exc, redis.exceptions.OutOfMemoryError):
                self._errors = Streak(self._errors.count + 1, time.monotonic(),
                                      f"{type(exc).__name__}: {exc}"[:200])
        wait_s = reconnect_delay_s(refusals)
        logger.warning("Redis refused the work for a delivery from %s (%s: %s); returning it "
                       "to the broker in %.1fs", delivery.queue, type(exc).__name__, exc, wait_s)
        if not self._stopping.is_set():
            multi.sleep(wait_s, until=self._stopping)
        return None


def _peek_url(body: bytes) -> str:
    """The message's URL for the heartbeat's "current" list (best effort, no validation)."""
    try:
        url = json.loads(body).get("url")
    except (ValueError, AttributeError, RecursionError):
        return "<unparsable>"
    return url if isinstance(url, str) else "<unparsable>"
