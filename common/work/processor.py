"""What a worker does with one message, decided off the I/O thread.

:meth:`Processor.process` runs in a fetch loop's task (common/work/fetch_loops.py) and returns an
:class:`~common.work.outcome.Outcome`: what must be durably published before the delivery may
be acked.

Per URL, in order: decode → canonicalise → poison check (redeliveries only,
common/work/poison.py) → wait out ``not_before`` → robots.txt → rate limit and cache (one Lua
call) → fetch → classify (common/core/errors.py) → parse and extract → record or retry or DLQ.
Each step is entered on the delivery's :class:`~common.work.poison.Progress`, so a worker that
dies on a page leaves the stage behind, and a page stuck in parse ends the worker.
Hot path: two Redis round trips (the admit script, the result script); robots rules come
from the worker's memory once known.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import redis

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.errors import (
    OK,
    PERMANENT,
    BadMessage,
    FetchError,
    InvalidURL,
    classify_status,
)
from common.core.urls import canonicalize, domain_of
from common.intake.crawl import LinkFollower
from common.store.dedupe import DoneSet, SeenSet
from common.store.keys import COUNTERS
from common.store.marks import DoneMark, Retime
from common.store.results import ResultStore
from common.web import cache as response_cache
from common.web import multi
from common.web.fetch import Fetcher, FetchResult
from common.web.ratelimit import RateLimiter
from common.web.robots import RobotsRules, robots_fetcher
from common.work import metrics
from common.work.archive import Archive, with_archive
from common.work.expired import release_expired
from common.work.giving_up import GivingUp
from common.work.outcome import (
    Failure,
    Outcome,
    not_before_too_late,
    park,
    wait_left_ms,
    waited_too_long,
)
from common.work.page_record import PageReader
from common.work.poison import PoisonGuard, Progress, StuckWatch
from common.work.record import bound, fetch_record
from common.work.redirects import HandOffFailed, Redirects, scope_of
from common.work.revisit import conditional_headers
from common.work.robots_gate import Refused, RobotsGate

logger = logging.getLogger(__name__)

class Processor(GivingUp):
    def __init__(self, settings: Settings, client: redis.Redis,
                 fetcher: Fetcher | None = None) -> None:
        self.settings = settings
        self.client = client
        self.fetcher = fetcher or Fetcher(settings)
        self.results = ResultStore(client, settings.results_maxlen)
        self.limiter = RateLimiter(client, settings)
        self.gate = RobotsGate(settings, client, self.limiter,
                               fetcher or robots_fetcher(settings))  # reads <= 500 KiB
        self.seen = SeenSet(client, settings.seen_buckets)
        self.done = DoneSet(client, settings.seen_buckets)
        self.follower = LinkFollower(settings, client) if settings.crawl_enabled else None
        self.redirects = Redirects(settings, client, self.follower)
        self.pages = PageReader(settings)  # EXTRACT_RULES, EXTRACTOR: ConfigError if bad
        self.archive = Archive.from_settings(settings)  # ARCHIVE=warc
        self.poison = PoisonGuard(client, settings.poison_deliveries, settings.failures_ttl_s)
        self.watch = StuckWatch(self.poison, max(  # started by the worker; never before
            settings.stuck_page_s,  # the limits user code and regexes already have ran out
            settings.extractor_timeout_s + settings.rules_regex_timeout_s + 5))

    # -- entry points -------------------------------------------------------------------------
    def process(self, body: bytes, queue: str, redelivered: bool = False) -> Outcome:
        """The outcome of one work-queue delivery; ``redelivered``: the broker's flag (a
        delivery of it ended before without an outcome)."""
        try:
            message = WorkMessage.from_json(body)
        except BadMessage as exc:
            return self._dead_letter_raw(body, "<unparsable>", BadMessage.reason, str(exc))
        try:
            url = canonicalize(message.url, max_length=self.settings.max_url_length)
        except InvalidURL as exc:
            return self._dead_letter_raw(body, message.url, InvalidURL.reason, str(exc))
        progress, verdict = self.poison.arrive(url, redelivered)
        if verdict is not None:
            if self._is_done(url, message):
                self.poison.clear(progress)
                return Outcome("already_done", url, detail="redelivered, outcome recorded")
            return self._dead_letter(message, url, queue,
                                     Failure("poison", error=verdict.error()))
        self.watch.add(progress)
        try:
            outcome = self._process(message, url, queue, progress)
        finally:
            self.watch.discard(progress)
        self.poison.clear(progress)  # a tracked URL reached an outcome: not poison
        return outcome

    def _process(self, message: WorkMessage, url: str, queue: str,
                 progress: Progress) -> Outcome:
        not_before = message.extra.get("not_before")
        if isinstance(not_before, int | float):  # finite: messages refuse NaN and Infinity
            remaining_ms = (not_before - time.time()) * 1000
            if remaining_ms > 0 and (late := not_before_too_late(
                    message, remaining_ms, self.settings.max_wait_s,
                    max(self.settings.retry_max_s, self.settings.retry_after_max_s))):
                return self._dead_letter(message, url, queue, late)  # MAX_WAIT_S bounds it
            if topology.hold_level(remaining_ms) is not None:
                return park(message, queue, remaining_ms, "waiting")
            if remaining_ms > 0:
                # Under HOLD_MIN_MS (50 ms) early: not worth another hop, and arriving early
                # would find the window still full. A short sleep (the loop's other tasks run).
                multi.sleep(remaining_ms / 1000)

        rules = None
        if self.settings.robots_enabled:
            progress.enter("robots")
            found = self.gate.rules(url, message, queue)
            if isinstance(found, Outcome):
                return found
            if isinstance(found, Refused):
                return self._dead_letter(message, url, queue, found.failure)
            rules = found
            if rules.unavailable:
                return self._failed(url, message, queue,
                                    Failure("robots_unavailable", error=rules.entry.detail))
            if not rules.allows(url):
                if self._is_done(url, message):
                    return Outcome("already_done", url, detail="redelivered, already dead-lettered")
                self.client.hincrby(COUNTERS, "robots_blocked", 1)
                return self._dead_letter(message, url, queue, Failure("robots_disallowed"))
        return self._admit_and_fetch(url, message, queue, rules, progress)

    def process_expired(self, body: bytes, death: str | None = None) -> Outcome:
        """A message that left a work queue by its TTL: release its fingerprint and count it.
        One that a quorum queue dropped past its delivery limit is poison instead: every
        delivery of it ended without an outcome, and it must not come back."""
        if death == "delivery_limit":
            return self._poison_dropped(body)
        return release_expired(body, self.seen)

    def worker_error(self, body: bytes, exc: BaseException) -> Outcome:
        """The outcome for a message whose processing raised an unexpected exception."""
        return self._dead_letter_raw(body, "<unknown>", "worker_error",
                                     f"{type(exc).__name__}: {exc}")

    # -- steps ----------------------------------------------------------------------------------
    def _admit_and_fetch(self, url: str, message: WorkMessage, queue: str,
                         rules: RobotsRules | None, progress: Progress) -> Outcome:
        domain = domain_of(url)
        rate = self.limiter.rate_for(domain, rules.crawl_delay_s() if rules else None)
        use_cache = self.settings.cache_ttl_s > 0
        done = self._done_mark(url, message)
        booked = message.extra.get("slot")
        progress.enter("admit")
        with multi.yielding():  # the loop's other tasks run while Redis answers
            admission = self.limiter.admit(
                domain, rate, cache_url=url if use_cache else None, done=done,
                booked_ms=booked if type(booked) is int else 0,
                max_wait_ms=wait_left_ms(message, self.settings.max_wait_s))
        metrics.show_throttle(domain, admission.throttle)
        if admission.already_done:  # acked only once the replicas hold that outcome too
            self.results.confirm_replicated(url)
            return Outcome("already_done", url, detail="redelivered, outcome already recorded")
        if admission.too_late:  # MAX_WAIT_S: its turn would come after its wait limit
            return self._dead_letter(message, url, queue, waited_too_long(message, admission))
        if admission.cached is not None:
            try:
                response = response_cache.decode(url, admission.cached)
            except ValueError as exc:
                logger.warning("%s", exc)
            else:
                metrics.CACHE_HITS.inc()
                return self._record(url, message, queue, response, done, cached=True,
                                    rules=rules, progress=progress)
        if not admission.go:
            metrics.count_rate_limited(self.client)
            booked_message = replace(message, extra={**message.extra,
                                                     "slot": admission.slot_ms})
            return park(booked_message, queue, admission.wait_ms, "rate limit")
        if "slot" in message.extra or "parked_at" in message.extra:
            message = replace(message, extra={k: v for k, v in message.extra.items()
                                              if k not in ("slot", "parked_at")})

        if use_cache:
            metrics.CACHE_MISSES.inc()
        progress.enter("fetch")
        try:
            response = self.fetcher.fetch(url, headers=conditional_headers(message),
                                          follow=self.redirects.follow_rule(url, rules))
            metrics.FETCH_SECONDS.observe(response.elapsed_ms / 1000)
            metrics.FETCH_BYTES.inc(len(response.body))
            self.limiter.throttle.observe(domain, response)  # healthy or slow: told at next admit
        except FetchError as exc:
            retime = Retime(admission.permit, exc.sent_at)
            failure = Failure(f"fetch_{exc.kind}", error=f"{exc.kind}: {exc}")
            if exc.transient:
                return self._failed(url, message, queue, failure, retime=retime)
            return self._dead_letter(message, url, queue, failure, retime=retime)
        if self.archive is not None:  # in the WARC file before its outcome is stored
            response = self.archive.write(response)
        retime = Retime(admission.permit, response.sent_at)
        if response.redirect_to is not None or response.status == 304:
            return self._unparsed(url, message, queue, response, done, retime)
        verdict = classify_status(response.status)
        if verdict == OK:
            return self._record(url, message, queue, response, done, cached=False, rules=rules,
                                retime=retime, progress=progress)
        failure = Failure(f"http_{response.status}", status=response.status,
                           retry_after=response.headers.get("retry-after"))
        if verdict == PERMANENT:
            return with_archive(self._dead_letter(message, url, queue, failure, retime=retime),
                                response)
        return with_archive(self._failed(url, message, queue, failure, retime=retime), response)

    def _unparsed(self, url: str, message: WorkMessage, queue: str, response: FetchResult,
                  done: DoneMark, retime: Retime) -> Outcome:
        """A result with nothing to parse: a 304 (``unchanged``) or a redirect handed to the
        producer path (common/work/redirects.py)."""
        record = fetch_record(url, response, worker=self.settings.worker_id, queue=queue,
                              depth=message.depth, attempts=message.attempts + 1, cached=False)
        if response.redirect_to is None:
            record["unchanged"] = True
        else:
            hops = message.extra.get("hops")
            hops = (hops if type(hops) is int else 0) + response.redirects + 1
            if hops > self.settings.max_redirects:
                return self._dead_letter(message, url, queue, Failure(
                    "fetch_too_many_redirects", status=response.status,
                    error=f"more than {self.settings.max_redirects} redirects"), retime=retime)
            try:
                record.update(self.redirects.hand_off(url, message, queue, response.redirect_to,
                                                      hops, f"{done.key}:{done.member}"))
            except HandOffFailed as exc:
                return self._failed(url, message, queue, Failure(
                    "redirect_not_queued", status=response.status, error=str(exc)), retime)
        self.results.record(record, clear_failures=message.attempts > 0, done=done,
                            retime=retime)
        return Outcome("result", url, detail=f"status {response.status}"
                       + (f" to {record['redirect_to']} ({record['redirect']})"
                          if "redirect_to" in record else " (unchanged)"))

    def _record(self, url: str, message: WorkMessage, queue: str, response: FetchResult,
                done: DoneMark, *, cached: bool, rules: RobotsRules | None = None,
                retime: Retime | None = None, progress: Progress | None = None) -> Outcome:
        """``done`` is the URL's done mark, as computed for the admit call."""
        read = self.pages.read(url, response, queue=queue, depth=message.depth,
                               attempts=message.attempts + 1, cached=cached, progress=progress)
        if progress is not None:
            progress.enter("record")
        record, token = read.record, f"{done.key}:{done.member}"
        if "redirected_from" in message.extra:  # reached through a redirect (redirects.py)
            record["redirected_from"] = message.extra["redirected_from"]
        if self.follower is not None and read.follow is not None:
            followed = self.follower.follow_plan(response.final_url, read.follow,
                                                 message.depth, rules, page_token=token,
                                                 scope=scope_of(message))
            if followed is not None:
                record["followed"] = followed.new
        if read.call:  # EXTRACTOR's follow URLs (common/work/user_extractor.py)
            read.call.enqueue(self.follower, message.depth, rules, token)
        bound(record, self.settings.max_record_bytes)
        cache_value = None
        if not cached and self.settings.cache_ttl_s > 0:
            value = response_cache.encode(response, self.settings.cache_max_bytes)
            cache_value = (value, self.settings.cache_ttl_s) if value is not None else None
        counters = {"cache_hits": 1} if cached else (
            {"cache_misses": 1} if self.settings.cache_ttl_s > 0 else {})
        for kind, count in read.counters.items():  # user code and regexes stopped (issue 23)
            counters[kind] = count
            metrics.USER_CODE_STOPPED.labels(kind).inc(count)
        with multi.yielding():
            self.results.record(record, cache=cache_value, counters=counters,
                                clear_failures=message.attempts > 0, done=done,
                                retime=retime)
        return Outcome("result", url, detail=f"status {response.status}"
                       + (" (cached)" if cached else ""))

    def close(self) -> None:
        """Close what the processor opened: the fetch handles, crawl mode's producer."""
        self.watch.stop()
        if self.pages.custom is not None:  # EXTRACTOR's child processes
            self.pages.custom.close()
        self.fetcher.close()
        self.gate.fetcher.close()
        self.redirects.close()
        if self.archive is not None:
            self.archive.close()
        if self.follower is not None:
            self.follower.close()

