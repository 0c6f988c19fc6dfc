"""What a download worker does with one media request: the pages' politeness, then its own steps.

:meth:`MediaProcessor.process` has the shape of :meth:`common.work.processor.Processor.process`
(the fetch loops and the worker run either). The journey:

1. **Decode**      the body as a work message, its URL canonical (a page's step);
2. **Arrive**      a redelivery counted; a URL whose deliveries keep dying is poison;
3. **Wait**        a message early for its ``not_before`` parked again;
4. **Robots**      the asset's own host's robots.txt (ROBOTS_ENABLED), as for a page;
5. **Admit**       its turn in the domain's rate limit: the same Redis log the domain's pages
                   take their turns from, so a site is not hit harder because it also serves
                   images; its done mark (the asset's own, ``identity_url``); no cache;
6. **FetchAsset**  streamed to a spool file, capped by type, resumed where it broke off;
7. **StoreAsset**  the job's quota, then the store by content hash (confirmed, or retried);
8. **RecordAsset** the asset record into ``assets``, the done mark with it.

Steps 1-5 are the pages' own (common/work/steps/); 6-8 are common/media/steps.py. A failure
ends as a page's does (:meth:`~common.work.giving_up.GivingUp.settle`): retried on its media
queue with backoff, or dead-lettered with its reason and a failure record.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import redis

from common.core.config import Settings
from common.intake.crawl import ThreadProducers
from common.media.download import Downloader
from common.media.steps import FetchAsset, RecordAsset, StoreAsset
from common.media.store import AssetStore, open_store
from common.media.tools import ToolDownloader
from common.store.dedupe import DoneSet, SeenSet
from common.store.results import ResultStore
from common.web.ratelimit import RateLimiter
from common.web.robots import robots_fetcher
from common.work.giving_up import GivingUp
from common.work.job_book import JobBook
from common.work.outcome import Outcome
from common.work.poison import PoisonGuard, StuckWatch
from common.work.processor import Endings
from common.work.robots_gate import RobotsGate
from common.work.steps.admit import Admit
from common.work.steps.arrive import Arrive
from common.work.steps.decode import Decode
from common.work.steps.robots import Robots
from common.work.steps.trip import Trip
from common.work.steps.wait import Wait

logger = logging.getLogger(__name__)


class MediaProcessor(Endings):
    """A download worker's steps, built once; :meth:`process` runs them on each delivery."""

    renderer = None  # the worker asks every processor for its browsers: a download worker has none

    def __init__(self, settings: Settings, client: redis.Redis,
                 downloader: Downloader | None = None, store: AssetStore | None = None) -> None:
        """``store``: MEDIA_STORE's (ConfigError when it cannot be opened)."""
        self.client = client
        self.jobs = jobs = JobBook(settings, client)
        self.downloader = downloader or Downloader(settings)
        self.store = store or open_store(settings)
        limiter = RateLimiter(client, settings)
        results = ResultStore(client, settings.results_maxlen)
        self.seen = SeenSet(client, settings.seen_buckets)
        self.poison = PoisonGuard(client, settings.poison_deliveries, settings.failures_ttl_s)
        self.watch = StuckWatch(self.poison, max(settings.stuck_page_s,
                                                 settings.media_timeout_s + 60))
        self.give_up = GivingUp(settings, client, limiter,
                                DoneSet(client, settings.seen_buckets), self.seen, results,
                                self.poison)
        self.gate = RobotsGate(settings, client, limiter, robots_fetcher(settings)) \
            if settings.robots_enabled else None
        self.decode = Decode.from_settings(settings)
        self.arrive = Arrive(self.poison, self.watch)
        self.wait = Wait.from_settings(settings, jobs)
        self.robots = Robots(self.gate, jobs)
        self.admit = Admit(limiter, results, self.give_up, client, use_cache=False,
                           max_wait_s=settings.max_wait_s, jobs=jobs)
        self.producers = ThreadProducers(settings, client)  # redirects to other origins
        self.tools = ToolDownloader(settings) if settings.media_tools else None
        self.fetch = FetchAsset(self.downloader, limiter, jobs, self.producers,
                                settings.max_redirects, self.tools)
        self.put = StoreAsset(self.store, client, jobs)
        self.record = RecordAsset(results, settings)

    def process(self, body: bytes, queue: str, redelivered: bool = False,
                expiration_ms: int | None = None) -> Outcome:
        """The outcome of one media-queue delivery (the arguments as Processor.process's)."""
        trip = Trip.begin(body, queue, redelivered, expiration_ms)
        end = self.decode.decode_message(trip) or self.arrive.count_arrival(trip)
        if end is None:
            try:
                end = (self.wait.wait_out(trip)
                       or self.robots.ask_robots(trip)
                       or self.admit.take_turn(trip)
                       or self.fetch.fetch_asset(trip)
                       or self.put.store_asset(trip)
                       or self.record.record_asset(trip))
            finally:
                self.arrive.depart(trip.progress)
            self.poison.clear(trip.progress)
        outcome = end if isinstance(end, Outcome) else self.give_up.settle(trip, end)
        return outcome if trip.job is None else replace(outcome, job=trip.job.scope)

    def warm(self) -> None:
        """Nothing to start per fetch loop (no user code runs here)."""

    def close(self) -> None:
        self.watch.stop()
        self.downloader.close()
        if self.tools is not None:
            self.tools.close()
        self.producers.close()
        if self.gate is not None:
            self.gate.proxies.flush()
            self.gate.fetcher.close()
