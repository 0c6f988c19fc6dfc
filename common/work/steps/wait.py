"""Wait: a message that came back before its ``not_before`` waits out the rest of it.

More than a hold hop early (common/broker/topology.py): parked again on the next hop. Less:
a short sleep in the fetch loop (its other tasks run). Past its wait limit (MAX_WAIT_S, a
retry's backoff counted before it): dead-lettered ``waited_too_long``, so no wait is endless.
"""

from __future__ import annotations

import time

from common.broker import topology
from common.core.config import Settings
from common.web import multi
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Park, not_before_too_late
from common.work.steps.trip import Trip


class Wait:
    def __init__(self, max_wait_s: float, backoff_max_s: float,
                 jobs: JobBook | None = None) -> None:
        self.max_wait_s = max_wait_s
        self.backoff_max_s = backoff_max_s  # the longest retry delay
        self.jobs = jobs  # a job's own MAX_WAIT_S

    @classmethod
    def from_settings(cls, settings: Settings, jobs: JobBook | None = None) -> Wait:
        return cls(settings.max_wait_s,
                   max(settings.retry_max_s, settings.retry_after_max_s), jobs)

    def wait_out(self, trip: Trip) -> Park | DeadLetter | None:
        """Park or dead-letter a message not due yet; sleep out the last few milliseconds."""
        message = trip.message
        not_before = message.extra.get("not_before")
        if not isinstance(not_before, int | float):  # finite: messages refuse NaN, Infinity
            return None
        remaining_ms = (not_before - time.time()) * 1000
        max_wait_s = self.max_wait_s if trip.job is None or self.jobs is None else (
            self.jobs.settings_for(trip.job).max_wait_s)
        if remaining_ms > 0 and (late := not_before_too_late(
                message, remaining_ms, max_wait_s, self.backoff_max_s)):
            return DeadLetter(late)
        if topology.hold_level(remaining_ms) is not None:
            return Park(remaining_ms, "waiting")
        if remaining_ms > 0:
            # Under HOLD_MIN_MS (50 ms) early: not worth another hop, and arriving early
            # would find the window still full. A short sleep (the loop's other tasks run).
            multi.sleep(remaining_ms / 1000)
        return None
