"""Record: the page's record, cache entry and counters into Redis in one call.

The result script (common/store/results.py) appends the record to ``results``, marks the URL
done, re-times its permit, clears its failure count and caches the response (CACHE_TTL_S;
not one fetched with cookies: it may be a session's own, and the cache is the fleet's), so
a redelivery after it finds the outcome recorded. A job's record carries ``job`` and ``run``
and is counted in its run's counters by the same script. The loop's other tasks run while Redis
answers. The second of the page's two round trips, and the end of the trip.
"""

from __future__ import annotations

from common.core.config import Settings
from common.store.results import ResultStore
from common.web import cache as response_cache
from common.web import multi
from common.work import metrics
from common.work.job_book import JobBook
from common.work.outcome import Outcome
from common.work.record import bound
from common.work.steps.trip import Trip


class Record:
    def __init__(self, results: ResultStore, *, max_record_bytes: int, cache_ttl_s: int,
                 cache_max_bytes: int, jobs: JobBook | None = None) -> None:
        self.jobs = jobs
        self.results = results
        self.max_record_bytes = max_record_bytes
        self.cache_ttl_s = cache_ttl_s  # 0: no cache
        self.cache_max_bytes = cache_max_bytes

    @classmethod
    def from_settings(cls, settings: Settings, results: ResultStore,
                      jobs: JobBook | None = None) -> Record:
        return cls(results, max_record_bytes=settings.max_record_bytes,
                   cache_ttl_s=settings.cache_ttl_s, cache_max_bytes=settings.cache_max_bytes,
                   jobs=jobs)

    def record_page(self, trip: Trip) -> Outcome:
        """Store the page's record: the outcome of the delivery."""
        message, read, cached = trip.message, trip.read, trip.cached
        record = read.record
        if "redirected_from" in message.extra:  # reached through a redirect (redirects.py)
            record["redirected_from"] = message.extra["redirected_from"]
        max_bytes = self.max_record_bytes
        if trip.job is not None:  # counted in its run as it is appended (results.py)
            record.update(trip.job.fields())
            if self.jobs is not None:  # the job's MAX_RECORD_BYTES
                max_bytes = self.jobs.settings_for(trip.job).max_record_bytes
        bound(record, max_bytes)
        cache_value = None
        if not cached and self.cache_ttl_s > 0 and not trip.response.cookies_sent:
            # (an answer to a request with cookies may be one session's own: never shared)
            value = response_cache.encode(trip.response, self.cache_max_bytes)
            cache_value = (value, self.cache_ttl_s) if value is not None else None
        counters = {"cache_hits": 1} if cached else (
            {"cache_misses": 1} if self.cache_ttl_s > 0 else {})
        for kind, count in read.counters.items():  # user code and regexes stopped (issue 23)
            counters[kind] = count
            metrics.USER_CODE_STOPPED.labels(kind).inc(count)
        with multi.yielding():
            self.results.record(record, cache=cache_value, counters=counters,
                                clear_failures=message.attempts > 0, done=trip.done,
                                retime=trip.retime)
        return Outcome("result", trip.url, detail=f"status {trip.response.status}"
                       + (" (cached)" if cached else ""))
