"""Fetch: one GET, with the message's own headers under a revisit's conditional ones.

Redirects on the URL's own origin that robots.txt allows are followed by the fetcher; any
other hop ends the fetch with the 3xx as its response (common/work/redirects.py). The
domain's throttle is told how the site answered (common/web/throttle.py). A fetch that fails
is retried (timeout, connection) or dead-lettered (blocked, too many redirects...) with its
permit re-timed to when the request was sent. A cached response is not fetched again.
"""

from __future__ import annotations

from common.core.errors import FetchError
from common.core.urls import domain_of
from common.store.marks import Retime
from common.web.fetch import Fetcher
from common.web.ratelimit import RateLimiter
from common.work import metrics
from common.work.giving_up import GivingUp
from common.work.outcome import Failure, Outcome
from common.work.redirects import follow_rule
from common.work.revisit import request_headers
from common.work.steps.trip import Trip


class Fetch:
    def __init__(self, fetcher: Fetcher, limiter: RateLimiter, give_up: GivingUp) -> None:
        self.fetcher = fetcher
        self.limiter = limiter
        self.give_up = give_up

    def fetch_page(self, trip: Trip) -> Outcome | None:
        """Set ``trip.response`` and ``trip.retime``; retry or dead-letter a failed fetch."""
        if trip.cached:
            return None
        url = trip.url
        trip.progress.enter("fetch")
        try:
            response = self.fetcher.fetch(url, headers=request_headers(trip.message,
                                                                       trip.headers),
                                          follow=follow_rule(url, trip.rules))
        except FetchError as exc:
            retime = Retime(trip.admission.permit, exc.sent_at)
            failure = Failure(f"fetch_{exc.kind}", error=f"{exc.kind}: {exc}")
            if exc.transient:
                return self.give_up.failed(url, trip.message, trip.queue, failure,
                                           retime=retime)
            return self.give_up.dead_letter(trip.message, url, trip.queue, failure,
                                            retime=retime)
        metrics.FETCH_SECONDS.observe(response.elapsed_ms / 1000)
        metrics.FETCH_BYTES.inc(len(response.body))
        self.limiter.throttle.observe(domain_of(url), response)  # told at the next admit
        trip.response = response
        trip.retime = Retime(trip.admission.permit, response.sent_at)
        return None
