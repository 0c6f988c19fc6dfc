"""Arrive: count a redelivery, dead-letter a URL whose deliveries keep dying, watch the rest.

A redelivery (the broker's flag) counts one death of the URL in Redis
(common/work/poison.py); from POISON_DELIVERIES on it is dead-lettered ``poison``, unless its
outcome is already recorded. Every delivery that goes on is watched by the stuck-page watch
until the processor has its outcome.
"""

from __future__ import annotations

from common.work.giving_up import GivingUp
from common.work.outcome import Failure, Outcome
from common.work.poison import PoisonGuard, StuckWatch
from common.work.steps.trip import Trip


class Arrive:
    def __init__(self, poison: PoisonGuard, watch: StuckWatch, give_up: GivingUp) -> None:
        self.poison = poison
        self.watch = watch
        self.give_up = give_up

    def count_arrival(self, trip: Trip) -> Outcome | None:
        """Set ``trip.progress`` (and watch it); poison or already done ends the trip."""
        progress, verdict = self.poison.arrive(trip.url, trip.redelivered)
        if verdict is not None:
            if self.give_up.is_done(trip.url, trip.message):
                self.poison.clear(progress)
                return Outcome("already_done", trip.url, detail="redelivered, outcome recorded")
            return self.give_up.dead_letter(trip.message, trip.url, trip.queue,
                                            Failure("poison", error=verdict.error()))
        self.watch.add(progress)
        trip.progress = progress
        return None
