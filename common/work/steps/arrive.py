"""Arrive: count a redelivery, dead-letter a URL whose deliveries keep dying, watch the rest.

A redelivery (the broker's flag) counts one death of the URL in Redis
(common/work/poison.py); from POISON_DELIVERIES on it is dead-lettered ``poison``, unless its
outcome is already recorded, and else it goes on alone: it waits for the worker's quarantine.
Every delivery that goes on is watched by the stuck-page watch until the processor has its
outcome (:meth:`Arrive.depart`).
"""

from __future__ import annotations

from common.work.outcome import DeadLetter, Failure
from common.work.poison import PoisonGuard, Progress, Quarantine, StuckWatch
from common.work.steps.trip import Trip


class Arrive:
    def __init__(self, poison: PoisonGuard, watch: StuckWatch) -> None:
        self.poison = poison
        self.watch = watch
        self.quarantine = Quarantine()

    def count_arrival(self, trip: Trip) -> DeadLetter | None:
        """Set ``trip.progress`` (and watch it, unless the URL is poison)."""
        trip.progress, verdict = self.poison.arrive(trip.url, trip.redelivered)
        if verdict is not None:
            return DeadLetter(Failure("poison", error=verdict.error()), unless_done=True)
        self.quarantine.enter(trip.progress)
        self.watch.add(trip.progress)
        return None

    def depart(self, progress: Progress) -> None:
        """An arrived delivery's trip ended (whichever way): unwatched, out of quarantine."""
        self.watch.discard(progress)
        self.quarantine.leave(progress)
