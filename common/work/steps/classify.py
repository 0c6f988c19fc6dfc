"""Classify: the response's status, read as the URL's fate (common/core/errors.py).

A success passes on to be read. A permanent error status (404, 410...) is dead-lettered at once
and a transient one (429, 503...) retried with backoff (its ``Retry-After`` honoured), the
response's archive reference in the failure record.
"""

from __future__ import annotations

from common.core.errors import OK, PERMANENT, classify_status
from common.work.outcome import DeadLetter, Failure, Retry
from common.work.steps.trip import Trip


class Classify:
    def classify_response(self, trip: Trip) -> Retry | DeadLetter | None:
        """Pass on a success (or a cached response); retry or dead-letter an error status."""
        response = trip.response
        if trip.cached or (verdict := classify_status(response.status)) == OK:
            return None
        failure = Failure(f"http_{response.status}", status=response.status,
                          retry_after=response.headers.get("retry-after"))
        if verdict == PERMANENT:
            return DeadLetter(failure, trip.retime)
        return Retry(failure, trip.retime)
