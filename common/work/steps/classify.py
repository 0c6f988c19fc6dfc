"""Classify: the response's status, read as the URL's fate (common/core/errors.py).

A success passes on to be read. A permanent error status (404, 410...) is dead-lettered at once
and a transient one (429, 503...) retried with backoff (its ``Retry-After`` honoured), the
response's archive reference in the failure record.
"""

from __future__ import annotations

from common.core.errors import OK, PERMANENT, classify_status
from common.work.archive import with_archive
from common.work.giving_up import GivingUp
from common.work.outcome import Failure, Outcome
from common.work.steps.trip import Trip


class Classify:
    def __init__(self, give_up: GivingUp) -> None:
        self.give_up = give_up

    def classify_response(self, trip: Trip) -> Outcome | None:
        """Pass on a success (or a cached response); retry or dead-letter an error status."""
        response = trip.response
        if trip.cached or (verdict := classify_status(response.status)) == OK:
            return None
        failure = Failure(f"http_{response.status}", status=response.status,
                          retry_after=response.headers.get("retry-after"))
        if verdict == PERMANENT:
            return with_archive(self.give_up.dead_letter(trip.message, trip.url, trip.queue,
                                                         failure, retime=trip.retime),
                                response)
        return with_archive(self.give_up.failed(trip.url, trip.message, trip.queue, failure,
                                                retime=trip.retime), response)
