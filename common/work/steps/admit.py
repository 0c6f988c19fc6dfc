"""Admit: the URL's turn under its domain's rate limit, and the cache, in one Redis call.

The admit script (common/web/ratelimit.py) answers at once: the outcome is already recorded
(a redelivery: acked once the replicas hold it), its turn would come after MAX_WAIT_S
(dead-lettered ``waited_too_long``), a cached response (CACHE_TTL_S: read, not fetched), a
permit now, or a booked slot to wait for (parked on the hold queues, keeping its slot). The
loop's other tasks run while Redis answers. The first of the page's two round trips; with
cookies on and no session pool it also brings the page's cookie jar back
(common/work/identities.py), so cookies cost no round trip of their own.

A job's message has its job's state decided in the same call (common/web/ratelimit.py), and
the answer carries ``jobs:version`` for the worker's job book (a job's MAX_WAIT_S is its
own). Its run paused: the message as delivered, less a rate-limit wait it had begun, goes into
``job:{name}:parked`` and is acked (``paused``): one more Redis call, only for a paused job's
pages, that parks it only while the run is still paused (a resume in between: the admission is
asked again). The registry's resume moves it to ``deferred``. Its run no longer running:
``cancelled``, counted by the script. Parked before acked: a worker killed in between gets the
redelivery, which gives the same member, parked again (ZADD NX, counted ``paused`` once).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import redis

from common.core.config import Settings
from common.core.urls import domain_of
from common.intake.defer import Pending
from common.jobs.registry import JobRef
from common.store.keys import job_key, job_parked_key, job_run_key
from common.store.results import ResultStore
from common.web import cache as response_cache
from common.web import multi
from common.web.ratelimit import Admission, RateLimiter
from common.work import metrics
from common.work.giving_up import GivingUp
from common.work.identities import Identities
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Outcome, Park, wait_left_ms, waited_too_long
from common.work.steps.trip import Trip

logger = logging.getLogger(__name__)

# KEYS[1] job:{name}  KEYS[2] job:{name}:parked  KEYS[3] job:{name}:run:{run}
# ARGV[1] the run  ARGV[2] the member. Parks it only while that run is paused (a resume or
# cancel since the admission: 0, ask again); counted ``paused`` when new. Returns 1 or 0.
PARK_LUA = """
local job = redis.call('HMGET', KEYS[1], 'state', 'run')
if job[1] ~= 'paused' or job[2] ~= ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZADD', KEYS[2], 'NX', now, ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[3], 'paused', 1)
end
return 1
"""
#: Admissions asked again when a paused run changes state between the admission and its
#: parking; past them, the page waits a second on the hold queues.
PARK_TRIES = 3
#: A rate-limit turn at most this far off is waited for in the fetch loop (a timer; the
#: loop's other tasks run), not on the hold queues: their shortest hop is 100 ms and a hop
#: came back 25-125 ms late (issue 31), while the window frees to the millisecond. Each late
#: permit delays the request ``amount`` permits later too: a loss that adds up over a crawl.
LOOP_WAIT_MS = 200
#: A longer wait is parked this much short of its turn, then waited out here (it keeps its
#: booked slot when it comes back early: common/web/ratelimit.py).
PARK_EARLY_MS = 150
#: Turns waited for here before the URL is parked (another URL may take a freed permit first).
LOOP_TURNS = 4


class Admit:
    def __init__(self, limiter: RateLimiter, results: ResultStore, give_up: GivingUp,
                 client: redis.Redis, *, use_cache: bool, max_wait_s: float,
                 jobs: JobBook | None = None, identities: Identities | None = None) -> None:
        self.jobs = jobs  # the jobs' states come back with the admission
        self.identities = identities  # the page's cookie jar comes back with it too
        self.limiter = limiter
        self.results = results
        self.give_up = give_up
        self.client = client
        self.use_cache = use_cache
        self.max_wait_s = max_wait_s
        self._park = client.register_script(PARK_LUA)

    @classmethod
    def from_settings(cls, settings: Settings, limiter: RateLimiter, results: ResultStore,
                      give_up: GivingUp, client: redis.Redis,
                      jobs: JobBook | None = None, identities: Identities | None = None) -> Admit:
        return cls(limiter, results, give_up, client, use_cache=settings.cache_ttl_s > 0,
                   max_wait_s=settings.max_wait_s, jobs=jobs, identities=identities)

    def take_turn(self, trip: Trip) -> Outcome | Park | DeadLetter | None:
        """Set ``trip.done``, ``trip.domain`` and ``trip.admission`` (and ``trip.response``
        from the cache)."""
        url, message, rules = trip.url, trip.message, trip.rules
        trip.done = done = self.give_up.done_mark(url, message)
        trip.domain = domain = domain_of(url)
        rate = self.limiter.rate_for(domain, rules.crawl_delay_s() if rules else None)
        booked = message.extra.get("slot")
        max_wait_s = self.max_wait_s if trip.job is None or self.jobs is None else \
            self.jobs.settings_for(trip.job).max_wait_s  # a job's own MAX_WAIT_S
        jar_key = self.identities.jar_to_read(trip) if self.identities is not None else None
        trip.progress.enter("admit")
        booked_ms, waited = booked if type(booked) is int else 0, False
        for _turn in range(LOOP_TURNS):
            for _ in range(PARK_TRIES):
                with multi.yielding():  # the loop's other tasks run while Redis answers
                    trip.admission = admission = self.limiter.admit(
                        domain, rate, cache_url=url if self.use_cache else None, done=done,
                        booked_ms=booked_ms, max_wait_ms=wait_left_ms(message, max_wait_s),
                        job=trip.job, jar_key=jar_key, queue=True)
                if admission.jobs_version is not None and self.jobs is not None:
                    self.jobs.note_version(admission.jobs_version)
                if admission.job_verdict != "paused" or self._parked(trip):
                    break
            else:  # paused and resumed (or cancelled) again and again meanwhile
                return Park(1000, f"job {trip.job.scope} changing state")
            if not _waits_here(admission):
                break
            # Its turn is near: waited for here, to the millisecond, keeping its slot.
            waited, booked_ms = True, admission.slot_ms
            trip.progress.enter("turn")  # a worker dying meanwhile is no fault of this URL
            multi.sleep(admission.wait_ms / 1000)
            trip.progress.enter("admit")
        if admission.job_verdict:
            return _job_outcome(url, trip.job, admission.job_verdict)
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
        if not admission.go or waited:
            metrics.count_rate_limited(self.client)
        if not admission.go:
            booked_message = replace(message, extra={**message.extra,
                                                     "slot": admission.slot_ms})
            # Back a little before its turn, which it then waits for here (_waits_here).
            return Park(max(0, admission.wait_ms - PARK_EARLY_MS), "rate limit",
                        booked_message)
        if "slot" in message.extra or "parked_at" in message.extra:  # its turn came
            trip.message = replace(message, extra={k: v for k, v in message.extra.items()
                                                   if k not in ("slot", "parked_at")})
        if self.use_cache:
            metrics.CACHE_MISSES.inc()
        return None

    def _parked(self, trip: Trip) -> bool:
        """Store a paused run's message in its job's parked set, as delivered (its queue; the
        delivery's TTL is not known here: the queue's own applies when it is released),
        less a rate-limit wait it had begun (``slot``, ``parked_at``): the pause is not
        waiting for a turn, and MAX_WAIT_S must not run out during it. The same delivery
        gives the same member. False: the run is no longer paused."""
        ref, message, body = trip.job, trip.message, trip.body
        if "slot" in message.extra or "parked_at" in message.extra:
            body = replace(message, extra={k: v for k, v in message.extra.items()
                                           if k not in ("slot", "parked_at")}).to_json()
        member = Pending(trip.domain, trip.queue, trip.expiration_ms, body).member()
        with multi.yielding():
            return self._park(keys=[job_key(ref.name), job_parked_key(ref.name),
                                    job_run_key(ref.name, ref.run)],
                              args=[ref.run, member]) == 1


def _waits_here(admission: Admission) -> bool:
    """A rate-limit turn close enough to be waited for in the fetch loop (LOOP_WAIT_MS)."""
    return (not admission.go and not admission.too_late and not admission.already_done
            and not admission.job_verdict and admission.wait_ms <= LOOP_WAIT_MS)


def _job_outcome(url: str, ref: JobRef, verdict: str) -> Outcome:
    """The acked outcome of a job's message whose run is not running."""
    if verdict == "paused":
        return Outcome("paused", url, detail=f"job {ref.scope} paused: parked until resumed")
    if verdict == "deleted":
        return Outcome("cancelled", url, detail=f"job {ref.name!r} deleted: dropped")
    return Outcome("cancelled", url, detail=f"job {ref.scope} is not running: dropped")
