"""Admit: the URL's turn under its domain's rate limit, and the cache, in one Redis call.

The admit script (common/web/ratelimit.py) answers at once: the outcome is already recorded
(a redelivery: acked once the replicas hold it), its turn would come after MAX_WAIT_S
(dead-lettered ``waited_too_long``), a cached response (CACHE_TTL_S: read, not fetched), a
permit now, or a booked slot to wait for (parked on the hold queues, keeping its slot). The
loop's other tasks run while Redis answers. The first of the page's two round trips.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import redis

from common.core.config import Settings
from common.core.urls import domain_of
from common.store.results import ResultStore
from common.web import cache as response_cache
from common.web import multi
from common.web.ratelimit import RateLimiter
from common.work import metrics
from common.work.giving_up import GivingUp
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Outcome, Park, wait_left_ms, waited_too_long
from common.work.steps.trip import Trip

logger = logging.getLogger(__name__)


class Admit:
    def __init__(self, limiter: RateLimiter, results: ResultStore, give_up: GivingUp,
                 client: redis.Redis, *, use_cache: bool, max_wait_s: float,
                 jobs: JobBook | None = None) -> None:
        self.jobs = jobs  # the jobs' states come back with the admission
        self.limiter = limiter
        self.results = results
        self.give_up = give_up
        self.client = client
        self.use_cache = use_cache
        self.max_wait_s = max_wait_s

    @classmethod
    def from_settings(cls, settings: Settings, limiter: RateLimiter, results: ResultStore,
                      give_up: GivingUp, client: redis.Redis,
                      jobs: JobBook | None = None) -> Admit:
        return cls(limiter, results, give_up, client, use_cache=settings.cache_ttl_s > 0,
                   max_wait_s=settings.max_wait_s, jobs=jobs)

    def take_turn(self, trip: Trip) -> Outcome | Park | DeadLetter | None:
        """Set ``trip.done``, ``trip.domain`` and ``trip.admission`` (and ``trip.response``
        from the cache)."""
        url, message, rules = trip.url, trip.message, trip.rules
        trip.done = done = self.give_up.done_mark(url, message)
        trip.domain = domain = domain_of(url)
        rate = self.limiter.rate_for(domain, rules.crawl_delay_s() if rules else None)
        booked = message.extra.get("slot")
        trip.progress.enter("admit")
        with multi.yielding():  # the loop's other tasks run while Redis answers
            trip.admission = admission = self.limiter.admit(
                domain, rate, cache_url=url if self.use_cache else None, done=done,
                booked_ms=booked if type(booked) is int else 0,
                max_wait_ms=wait_left_ms(message, self.max_wait_s))
        metrics.show_throttle(domain, admission.throttle)
        if admission.already_done:  # acked only once the replicas hold that outcome too
            self.results.confirm_replicated(url)
            return Outcome("already_done", url, detail="redelivered, outcome already recorded")
        if admission.too_late:  # MAX_WAIT_S: its turn would come after its wait limit
            return DeadLetter(waited_too_long(message, admission))
        if admission.cached is not None:
            try:
                trip.response = response_cache.decode(url, admission.cached)
            except ValueError as exc:
                logger.warning("%s", exc)
            else:
                metrics.CACHE_HITS.inc()
                trip.cached = True
                return None
        if not admission.go:
            metrics.count_rate_limited(self.client)
            booked_message = replace(message, extra={**message.extra,
                                                     "slot": admission.slot_ms})
            return Park(admission.wait_ms, "rate limit", booked_message)
        if "slot" in message.extra or "parked_at" in message.extra:  # its turn came
            trip.message = replace(message, extra={k: v for k, v in message.extra.items()
                                                   if k not in ("slot", "parked_at")})
        if self.use_cache:
            metrics.CACHE_MISSES.inc()
        return None
