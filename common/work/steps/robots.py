"""Robots: the URL's origin's robots.txt, asked before its turn is taken (ROBOTS_ENABLED).

The rules come from the worker's memory once known (common/work/robots_gate.py: one worker
fetches an origin's robots.txt, the others park their URL meanwhile). Rules that cannot be had
(RFC 9309's "unavailable") retry the URL with backoff; a path they disallow is dead-lettered
``robots_disallowed`` (counted ``robots_blocked``), unless its outcome is already recorded.
"""

from __future__ import annotations

import redis

from common.store.keys import COUNTERS
from common.work.giving_up import GivingUp
from common.work.outcome import Failure, Outcome
from common.work.robots_gate import Refused, RobotsGate
from common.work.steps.trip import Trip


class Robots:
    def __init__(self, gate: RobotsGate | None, give_up: GivingUp,
                 client: redis.Redis) -> None:
        self.gate = gate  # None: ROBOTS_ENABLED is off, every URL passes
        self.give_up = give_up
        self.client = client

    def ask_robots(self, trip: Trip) -> Outcome | None:
        """Set ``trip.rules``; park, retry or dead-letter a URL they do not let through."""
        if self.gate is None:
            return None
        trip.progress.enter("robots")
        found = self.gate.rules(trip.url, trip.message, trip.queue)
        if isinstance(found, Outcome):
            return found
        if isinstance(found, Refused):
            return self.give_up.dead_letter(trip.message, trip.url, trip.queue, found.failure)
        if found.unavailable:
            return self.give_up.failed(trip.url, trip.message, trip.queue,
                                       Failure("robots_unavailable", error=found.entry.detail))
        if not found.allows(trip.url):
            if self.give_up.is_done(trip.url, trip.message):
                return Outcome("already_done", trip.url,
                               detail="redelivered, already dead-lettered")
            self.client.hincrby(COUNTERS, "robots_blocked", 1)
            return self.give_up.dead_letter(trip.message, trip.url, trip.queue,
                                            Failure("robots_disallowed"))
        trip.rules = found
        return None
