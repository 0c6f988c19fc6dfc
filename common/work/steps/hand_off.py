"""Hand-off: a response with nothing to parse is the URL's result as it is.

A ``304 Not Modified`` (a revisit's conditional request, common/work/revisit.py) is recorded
``unchanged``. A redirect the fetcher did not follow (another origin, or a path robots.txt
disallows) is recorded with ``redirect_to``, its target handed to the producer path first
(common/work/redirects.py); one hop past MAX_REDIRECTS is dead-lettered
``fetch_too_many_redirects``, a target that could not be published retries the URL.
"""

from __future__ import annotations

from common.core.config import Settings
from common.store.results import ResultStore
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Failure, Outcome, Retry
from common.work.record import fetch_record
from common.work.redirects import HandOffFailed, Redirects
from common.work.steps.trip import Trip


class HandOff:
    def __init__(self, redirects: Redirects, results: ResultStore, *, worker_id: str,
                 max_redirects: int, jobs: JobBook | None = None) -> None:
        self.jobs = jobs  # a job's crawl settings, for its redirects
        self.redirects = redirects
        self.results = results
        self.worker_id = worker_id
        self.max_redirects = max_redirects

    @classmethod
    def from_settings(cls, settings: Settings, redirects: Redirects,
                      results: ResultStore, jobs: JobBook | None = None) -> HandOff:
        return cls(redirects, results, worker_id=settings.worker_id,
                   max_redirects=settings.max_redirects, jobs=jobs)

    def hand_off_unparsed(self, trip: Trip) -> Outcome | Retry | DeadLetter | None:
        """Record a 304 or a redirect not followed; pass on any other response."""
        response = trip.response
        if response.redirect_to is None and response.status != 304:
            return None
        url, message, queue = trip.url, trip.message, trip.queue
        record = fetch_record(url, response, worker=self.worker_id, queue=queue,
                              depth=message.depth, attempts=message.attempts + 1, cached=False)
        if trip.job is not None:  # counted in its run as it is recorded (results.py)
            record.update(trip.job.fields())
        if response.redirect_to is None:
            record["unchanged"] = True
        else:
            hops = message.extra.get("hops")
            hops = (hops if type(hops) is int else 0) + response.redirects + 1
            if hops > self.max_redirects:
                return DeadLetter(Failure(
                    "fetch_too_many_redirects", status=response.status,
                    error=f"more than {self.max_redirects} redirects"), trip.retime)
            job_settings = (self.jobs.settings_for(trip.job)
                            if self.jobs is not None and trip.job is not None else None)
            try:
                record.update(self.redirects.hand_off(url, message, queue, response.redirect_to,
                                                      hops, trip.token, job_settings))
            except HandOffFailed as exc:
                return Retry(Failure("redirect_not_queued", status=response.status,
                                     error=str(exc)), trip.retime)
        self.results.record(record, clear_failures=message.attempts > 0, done=trip.done,
                            retime=trip.retime)
        return Outcome("result", url, detail=f"status {response.status}"
                       + (f" to {record['redirect_to']} ({record['redirect']})"
                          if "redirect_to" in record else " (unchanged)"))

    def close(self) -> None:
        self.redirects.close()
