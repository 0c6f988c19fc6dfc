"""When an idle worker exits (``--idle-exit`` SECONDS, IDLE_EXIT_S): no message for that long,
none in flight, not paused, and no message in a hold queue shorter than that.

A retry or a rate-limit wait rides a hold queue (common/broker/topology.py) and comes back to a
work queue when its level runs out. One in a queue shorter than the idle time is part of the
work at hand: exiting then left it behind until some worker started again (a drain that ended
with one page waiting: the proxy fleet test's CI runs, NOTES #82). A longer wait (a domain
blocked for minutes) is not: the worker still exits, as it always did. The check costs one
passive queue declaration per such level, at most once a second, only once the time is up.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from common.broker.topology import HOLD_LEVELS_MS, hold_name

logger = logging.getLogger(__name__)

#: How often an idle worker looks at the hold queues again while one holds a message.
RECHECK_S = 1.0


class IdleExit:
    """Says when the worker's idle time is up (``idle_s`` 0: never)."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.short_holds = tuple(hold_name(level) for level in HOLD_LEVELS_MS
                                 if level <= idle_s * 1000)
        self._next_look = 0.0
        self._told: int | None = None  # the held count last logged

    def due(self, last_delivery: float, busy: bool, channel: Any) -> bool:
        """Whether to exit now; ``busy``: paused, or deliveries still in flight. ``channel``:
        a pika BlockingChannel to look at the hold queues through."""
        now = time.monotonic()
        if self.idle_s <= 0 or busy or now - last_delivery < self.idle_s or now < self._next_look:
            return False
        held = self.held(channel)
        if held == 0:
            return True
        self._next_look = now + RECHECK_S
        if held != self._told:
            logger.info("no message for %.1fs, but %d wait in hold queues of at most %.1fs: "
                        "staying for them", now - last_delivery, held, self.idle_s)
            self._told = held
        return False

    def held(self, channel: Any) -> int:
        """Messages in the hold queues no longer than the idle time."""
        return sum(channel.queue_declare(queue=name, passive=True).method.message_count
                   for name in self.short_holds)
