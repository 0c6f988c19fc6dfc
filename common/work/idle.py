"""When an idle worker exits (``--idle-exit`` SECONDS, IDLE_EXIT_S): no message for that long,
none in flight, not paused, no message in a hold queue shorter than that, and no URL deferred
in Redis due within it.

A retry or a rate-limit wait rides a hold queue (common/broker/topology.py) and comes back to a
work queue when its level runs out. One in a queue shorter than the idle time is part of the
work at hand: exiting then left it behind until some worker started again (a drain that ended
with one page waiting: the proxy fleet test's CI runs, NOTES #82). So is a URL deferred in
Redis (common/intake/defer.py) whose turn comes within the idle time (a releaser publishes it
then, or up to its poll interval later), and one a releaser has claimed: it is being published
(or, its releaser dead, claimed again once the lease ends, DEFER_LEASE_S). A longer wait (a
domain blocked for minutes) is not: the worker still exits, as it always did. The check costs
one passive queue declaration per such level and two Redis round trips, at most once a second,
only once the time is up; Redis not answering counts as work to wait for (the pressure check
pauses the worker then anyway).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from common.broker.topology import HOLD_LEVELS_MS, hold_name
from common.core.errors import REDIS_UNAVAILABLE
from common.store.keys import deferred_key

logger = logging.getLogger(__name__)

#: How often an idle worker looks at the hold queues again while one holds a message.
RECHECK_S = 1.0


class IdleExit:
    """Says when the worker's idle time is up (``idle_s`` 0: never)."""

    def __init__(self, idle_s: float, client: redis.Redis | None = None) -> None:
        self.idle_s = idle_s
        self.client = client  # for the URLs deferred in Redis (None: not looked at)
        self.short_holds = tuple(hold_name(level) for level in HOLD_LEVELS_MS
                                 if level <= idle_s * 1000)
        self._next_look = 0.0
        self._told: tuple[int, int] | None = None  # the counts last logged

    def due(self, last_delivery: float, busy: bool, channel: Any) -> bool:
        """Whether to exit now; ``busy``: paused, or deliveries still in flight. ``channel``:
        a pika BlockingChannel to look at the hold queues through."""
        now = time.monotonic()
        if self.idle_s <= 0 or busy or now - last_delivery < self.idle_s or now < self._next_look:
            return False
        held, deferred = self.held(channel), self.deferred()
        if held == deferred == 0:
            return True
        self._next_look = now + RECHECK_S
        if (held, deferred) != self._told:
            logger.info("no message for %.1fs, but %d wait in hold queues of at most %.1fs and "
                        "%s deferred in Redis are due within it: staying for them",
                        now - last_delivery, held, self.idle_s,
                        "an unknown number (Redis not answering)" if deferred < 0 else deferred)
            self._told = (held, deferred)
        return False

    def held(self, channel: Any) -> int:
        """Messages in the hold queues no longer than the idle time."""
        return sum(channel.queue_declare(queue=name, passive=True).method.message_count
                   for name in self.short_holds)

    def deferred(self) -> int:
        """URLs deferred in Redis due within the idle time (Redis's clock, as the scores),
        and those a releaser has claimed; -1 when Redis does not answer."""
        if self.client is None:
            return 0
        try:
            seconds, micros = self.client.time()
            until = seconds * 1000 + micros // 1000 + round(self.idle_s * 1000)
            pipe = self.client.pipeline(transaction=False)
            pipe.zcount(deferred_key(), "-inf", until)
            pipe.zcard(deferred_key("inflight"))
            return sum(pipe.execute())
        except REDIS_UNAVAILABLE as exc:
            logger.warning("idle: could not count the URLs deferred in Redis (%s); "
                           "staying", exc)
            return -1
