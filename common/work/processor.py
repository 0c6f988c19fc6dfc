"""What a worker does with one delivery: the steps of its journey, run in order.

:meth:`Processor.process` runs in a fetch loop's task (common/work/fetch_loops.py) and returns
an :class:`~common.work.outcome.Outcome`: what must be durably published before the delivery
may be acked. The journey is :data:`common.work.steps.STEPS`, one module each:

1. **Decode**   the body as a work message, its URL canonical, its own headers checked;
2. **Arrive**   a redelivery counted; a URL whose deliveries keep dying is poison;
3. **Route**    a page that needs a browser sent on to the render queue (HTTP workers);
4. **Wait**     a message early for its ``not_before`` parked again, or slept out;
5. **Robots**   robots.txt asked (ROBOTS_ENABLED): disallowed, unavailable, or on;
6. **Admit**    the rate-limit turn and the cache, one Redis call: park, a cached page, go;
7. **Fetch**    one GET (the message's headers under a revisit's conditional ones), with the
                page's cookies and proxy (common/work/identities.py); in a render worker,
                the page loaded in Chromium (common/web/renderer.py);
8. **Archive**  the exchange into the WARC file (ARCHIVE=warc);
9. **HandOff**  a 304, or a redirect to another origin handed to the producer path: recorded;
10. **Classify** an error status retried or dead-lettered;
11. **Read**    parsed once: extraction rules, handlers or EXTRACTOR, the links to follow;
12. **Shell**   a plain page that turns out to need a browser sent to the render queue;
13. **Follow**  the page's links and follow requests published (crawl mode, user code);
14. **Record**  the record, cache entry and counters stored, one Redis call.

Each step returns None (the next goes on) or how the trip ends: an outcome, or an
:data:`~common.work.outcome.Ending` (park, retry, dead letter) that
:meth:`~common.work.giving_up.GivingUp.settle` turns into one, the only place that gives up.
What a step learns travels on the delivery's :class:`~common.work.steps.trip.Trip`, never
from step to step. Each
stage is entered on the delivery's :class:`~common.work.poison.Progress`, so a worker that dies
on a page leaves the stage behind, and a page stuck in parse ends the worker. Hot path: two
Redis round trips (Admit's script, Record's script; with cookies on, the default, the admit
script also returns the page's cookie jar, and a pooled session's costs a third, its slot
chosen before the fetch: common/web/sessions.py), the loop's other tasks running during each; robots rules come from the worker's memory once known.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import redis

from common.core.config import Settings
from common.store.dedupe import DoneSet, SeenSet
from common.store.marks import DoneMark
from common.store.results import ResultStore
from common.web.fetch import Fetcher
from common.web.ratelimit import RateLimiter
from common.web.renderer import Renderer
from common.web.robots import robots_fetcher
from common.work.expired import release_expired
from common.work.giving_up import GivingUp
from common.work.identities import Identities
from common.work.job_book import JobBook
from common.work.outcome import Outcome
from common.work.poison import PoisonGuard, StuckWatch
from common.work.redirects import Redirects
from common.work.render_route import RenderRoute
from common.work.robots_gate import RobotsGate
from common.work.steps.admit import Admit
from common.work.steps.archive import Archive
from common.work.steps.arrive import Arrive
from common.work.steps.classify import Classify
from common.work.steps.decode import Decode
from common.work.steps.fetch import Fetch
from common.work.steps.follow import Follow
from common.work.steps.hand_off import HandOff
from common.work.steps.read import Read
from common.work.steps.record import Record
from common.work.steps.robots import Robots
from common.work.steps.route import Route
from common.work.steps.shell import Shell
from common.work.steps.trip import Trip
from common.work.steps.wait import Wait

logger = logging.getLogger(__name__)


class Endings:
    """How any worker's processor ends a delivery no step saw: an expired message, a bug, a
    confirmed dead letter (``give_up`` and ``seen``: the processor's)."""

    give_up: GivingUp
    seen: SeenSet

    def process_expired(self, body: bytes, death: str | None = None) -> Outcome:
        """A message that left a work queue by its TTL: release its fingerprint and count it.
        One that a quorum queue dropped past its delivery limit is poison instead: every
        delivery of it ended without an outcome, and it must not come back."""
        if death == "delivery_limit":
            return self.give_up.poison_dropped(body)
        return release_expired(body, self.seen)

    def worker_error(self, body: bytes, exc: BaseException) -> Outcome:
        """The outcome for a message whose processing raised an unexpected exception."""
        return self.give_up.dead_letter_raw(body, "<unknown>", "worker_error",
                                            f"{type(exc).__name__}: {exc}")

    def record_dead_letter(self, mark: DoneMark | None, record: dict[str, Any] | None) -> None:
        """A dead letter is confirmed: mark its URL done, append its failure record."""
        self.give_up.record_dead_letter(mark, record)


class Processor(Endings):
    """The worker's steps, built once; :meth:`process` runs them on each delivery."""

    def __init__(self, settings: Settings, client: redis.Redis,
                 fetcher: Fetcher | None = None, renderer: Renderer | None = None) -> None:
        """``renderer``: a render worker's browsers (its pages are loaded in Chromium, its
        robots.txt and logins still fetched over HTTP)."""
        self.client = client
        self.renderer = renderer
        self.jobs = jobs = JobBook(settings, client)  # each job's definition and settings
        self.fetcher = fetcher or Fetcher(settings)
        limiter = RateLimiter(client, settings)
        results = ResultStore(client, settings.results_maxlen)
        self.seen = SeenSet(client, settings.seen_buckets)
        self.poison = PoisonGuard(client, settings.poison_deliveries, settings.failures_ttl_s)
        self.watch = StuckWatch(self.poison, max(  # started by the worker; never before
            settings.stuck_page_s,  # the limits user code and regexes already have ran out
            settings.handler_timeout_s + settings.rules_regex_timeout_s + 5))
        self.give_up = give_up = GivingUp(settings, client, limiter,
                                          DoneSet(client, settings.seen_buckets), self.seen,
                                          results, self.poison)
        self.gate = RobotsGate(settings, client, limiter,  # reads <= 500 KiB
                               fetcher if fetcher is not None and renderer is None
                               else robots_fetcher(settings)) if settings.robots_enabled else None
        follower = Follow.follower_for(settings, client)
        # The journey, in the order of STEPS (tests/test_layout.py holds the two together).
        self.decode = Decode.from_settings(settings)
        self.arrive = Arrive(self.poison, self.watch)
        routes = RenderRoute(settings, client, jobs) if renderer is None else None
        self.route = Route(routes)
        self.wait = Wait.from_settings(settings, jobs)
        self.robots = Robots(self.gate, jobs)
        self.identities = Identities(settings, client, jobs, self.fetcher)  # cookies, proxies
        self.admit = Admit.from_settings(settings, limiter, results, give_up, client, jobs,
                                         self.identities)
        self.fetch = Fetch(self.fetcher, limiter, self.identities, renderer)
        self.archive = Archive.from_settings(settings)
        self.hand_off = HandOff.from_settings(settings, Redirects(settings, client, follower),
                                              results, jobs)
        self.classify = Classify()
        self.read = Read.from_settings(settings, jobs)
        self.shell = Shell(routes)
        self.follow = Follow(follower, jobs)
        self.record = Record.from_settings(settings, results, jobs)

    def process(self, body: bytes, queue: str, redelivered: bool = False,
                expiration_ms: int | None = None) -> Outcome:
        """The outcome of one work-queue delivery; ``redelivered``: the broker's flag (a
        delivery of it ended before without an outcome); ``expiration_ms``: its own TTL."""
        trip = Trip.begin(body, queue, redelivered, expiration_ms)
        end = self.decode.decode_message(trip) or self.arrive.count_arrival(trip)
        if end is None:  # arrived: the stuck-page watch has it until its end
            try:
                end = (self.route.route_page(trip)
                       or self.wait.wait_out(trip)
                       or self.robots.ask_robots(trip)
                       or self.admit.take_turn(trip)
                       or self.fetch.fetch_page(trip)
                       or self.archive.archive_response(trip)
                       or self.hand_off.hand_off_unparsed(trip)
                       or self.classify.classify_response(trip)
                       or self.read.read_page(trip)
                       or self.shell.check_shell(trip)
                       or self.follow.follow_links(trip)
                       or self.record.record_page(trip))
            finally:
                self.arrive.depart(trip.progress)
            self.poison.clear(trip.progress)  # a tracked URL reached its end: not poison
        outcome = end if isinstance(end, Outcome) else self.give_up.settle(trip, end)
        return outcome if trip.job is None else replace(outcome, job=trip.job.scope)

    def warm(self) -> None:
        """Called by each fetch loop as it starts: the user code's children start now."""
        self.read.warm()

    def close(self) -> None:
        """Close what the steps opened: fetch handles, the user code's processes, producers."""
        self.watch.stop()
        self.read.close()
        self.identities.flush()
        self.fetcher.close()
        if self.renderer is not None:
            self.renderer.close()  # no Chromium is left running
        if self.gate is not None:
            self.gate.proxies.flush()  # robots.txt's proxies' counters
            self.gate.fetcher.close()
        self.hand_off.close()
        self.archive.close()
        self.follow.close()
