"""The one path every URL takes into the fleet: canonicalise → dedupe → route → confirmed publish.

``producer.py``, ``sitemap_producer.py`` and crawl mode all go through :class:`Producer`.

Per batch of ``PRODUCER_BATCH`` URLs: one Lua call asks which fingerprints are already seen
and claims the others (``claim:{fp}``, a lease: the producer's own token, or in crawl mode the
page's), the new URLs are published persistently without waiting on each confirm, the batch's
confirms are awaited together, and only then does a second call mark the confirmed ones as seen
and drop their claims. So no URL is ever marked seen without a confirmed message, whenever the
producer dies (kill -9, OOM kill): running the same input again publishes what was not marked
(a producer takes another producer's claims over). And no worker sees a new URL unclaimed: a
page linking a seed whose confirm is on its way counts it as a duplicate, so a seed is fetched
once (NOTES.md #5). The price is a rare duplicate message (two producers, or a rerun, publishing
the same URL in the same moment), which the workers' done-set turns into exactly one result. A
publish that is not confirmed (nack, unroutable, channel lost) is retried on a fresh connection,
and a URL that never gets through is left unmarked, its claim dropped, and counted as failed.

URLs whose host the fetch address guard refuses (FETCH_ALLOW_NETWORKS) are reported, not
queued and not marked seen, when the producer is given a :class:`HostCheck`
(common/intake/hosts.py): the seeding commands (producer.py, sitemap_producer.py).

Fairness (common/intake/defer.py): before publishing, one more Lua call gives each URL its
domain's next release slot; URLs due later than DEFER_LEAD_S are written to Redis instead
(``deferred``), which counts as their confirm, and the workers' releasers publish them on time.
A job's URLs (``job=``, common/intake/job_intake.py) are deduped per run, carry ``job`` and
``run``, count as its ``known`` in the mark-seen script, stop at ``limits.pages`` in the claim
script (known + claimed: exact across producers and workers), take its pace and priority.
An asset (``extra["media"]``, common/media/) is fingerprinted as one and goes to a media queue.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import pika.exceptions
import redis

from common.broker import topology
from common.broker.connection import open_publisher
from common.broker.deadletter import DLQ_EXCHANGE, DLQ_ROUTING_KEY, dead_letter_headers
from common.broker.messages import WorkMessage
from common.broker.publisher import ConfirmingPublisher
from common.core.backoff import reconnect_delay_s
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, InvalidURL, ServiceUnavailable
from common.core.urls import Fingerprint, canonicalize, domain_of, fingerprint, identity_url
from common.intake.defer import Deferral, Pending
from common.intake.hosts import HostCheck, Refused
from common.intake.job_intake import JobIntake, JobRun, JobTerms, JobTermsBook
from common.intake.routing import Router
from common.store.dedupe import HELD, OVER_BUDGET, PRODUCER_TOKEN_PREFIX, Claims, SeenSet
from common.store.keys import COUNTERS

logger = logging.getLogger(__name__)

#: Filter applied after dedupe: canonical URLs in, one keep/drop verdict each out.
Keep = Callable[[list[str]], list[bool]]
Invalid = tuple[str, str, dict[str, Any]]  # a URL as given, why, its letter's job fields

PUBLISH_ATTEMPTS = 3


COUNTS = ("read", "new", "duplicate", "invalid", "failed", "over_budget", "deferred")


@dataclass
class ProduceSummary:
    read: int = 0
    new: int = 0
    duplicate: int = 0
    invalid: int = 0
    failed: int = 0
    over_budget: int = 0
    deferred: int = 0  #: of ``new``: waiting in Redis for their turn (common/intake/defer.py)
    per_queue: Counter[str] = field(default_factory=Counter)
    refused: Refused = field(default_factory=Refused)  #: hosts the address guard blocks

    def merge(self, other: ProduceSummary) -> None:
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.per_queue.update(other.per_queue)
        self.refused.merge(other.refused)

    def line(self) -> str:
        queues = " ".join(f"{q}={self.per_queue.get(q, 0)}" for q in topology.WORK_QUEUES)
        refused = f" refused={self.refused.count}" if self.refused.count else ""
        over = f" over_budget={self.over_budget}" if self.over_budget else ""
        return (f"read={self.read} new={self.new} duplicate={self.duplicate} "
                f"invalid={self.invalid} failed={self.failed}{over}{refused} {queues}")

    def as_dict(self) -> dict[str, Any]:
        return {**{name: getattr(self, name) for name in COUNTS}, "refused": self.refused.count,
                "per_queue": {q: self.per_queue.get(q, 0) for q in topology.WORK_QUEUES}}


@dataclass(frozen=True)
class _Accepted:
    url: str
    fp: Fingerprint
    queue: str
    ttl_ms: int | None
    depth: int
    nonce: str | None = None
    extra: dict[str, Any] | None = None  # more message fields (a redirect's scope, validators)

    def message(self) -> WorkMessage:
        extra = {**(self.extra or {}), **({"nonce": self.nonce} if self.nonce else {})}
        return WorkMessage(url=self.url, depth=self.depth, fp=self.fp.hex, extra=extra)

    def pending(self) -> Pending:
        return Pending(domain_of(self.url), self.queue, self.ttl_ms, self.message().to_json())


def batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


class Producer:
    """Feeds URLs into the queues. Owns one AMQP connection; borrows a Redis client."""

    def __init__(self, settings: Settings, redis_client: redis.Redis,
                 router: Router | None = None, hosts: HostCheck | None = None) -> None:
        """``hosts``: refuse URLs the fetch address guard blocks (default: no check)."""
        self.settings = settings
        self.seen = SeenSet(redis_client, settings.seen_buckets)
        self.claims = Claims(redis_client)
        self.token = f"{PRODUCER_TOKEN_PREFIX}{uuid.uuid4().hex}"  # this producer's claims
        self.hosts = hosts
        self.deferral = Deferral(settings, redis_client)
        self.jobs = JobTermsBook(redis_client)  # the terms of the runs it serves
        self.router = router or Router.from_setting(settings.routing_rules)
        self._connection: pika.BlockingConnection | None = None
        self._publisher: ConfirmingPublisher | None = None

    def __enter__(self) -> Producer:
        self._ensure_publisher()  # fail fast, before anything is marked as seen
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None and self._connection.is_open:
            try:
                self._connection.close()
            except AMQP_CONNECTION_LOST as exc:
                logger.debug("closing a broken AMQP connection: %s", exc)
        self._connection, self._publisher = None, None

    def _ensure_publisher(self) -> ConfirmingPublisher:
        if self._publisher is None:
            self._connection, self._publisher = open_publisher(self.settings)
        return self._publisher

    def submit(self, raw_urls: Iterable[str], *, force_priority: bool = False,
               depth: int = 0, keep: Keep | None = None,
               recrawl: bool = False, claim_token: str | None = None,
               extra: dict[str, Any] | None = None, job: JobRun | None = None,
               job_spec: JobTerms | None = None) -> ProduceSummary:
        """Send URLs through canonicalise → dedupe → route → publish; return the counts.

        Args:
            raw_urls: URLs as given.
            force_priority: route every URL to priority_queue.
            recrawl: enqueue even URLs seen before (a refresh). Each such message carries a
                ``nonce`` so its outcome is recorded once, as a new result of its own.
            depth: crawl depth written into the messages.
            keep: called with the canonical URLs that passed dedupe; returns one bool each.
                URLs it rejects (e.g. over a per-domain page budget) are not published nor
                marked seen, their claims are dropped, and they count as ``over_budget``.
            claim_token: claim each new URL for this token before publishing it (crawl mode:
                the page's own token); URLs claimed by another token count as duplicates.
                Without it the producer claims them with its own token, taking over the
                claims of other producers (a rerun after a kill) but not those of pages.
            extra: fields added to every message (a redirect target's ``scope`` and
                ``redirected_from``).
            job: the run (JobRef) the URLs enter (None: the default job), ``job_spec`` its
                JobSpec (else read once per run); URLs over ``limits.pages``: ``over_budget``.

        Raises:
            ServiceUnavailable: the broker or Redis could not be reached (after backoff).
            ValueError: ``job`` unknown, or with ``recrawl`` (a job's refresh is its next run).
        """
        if job is not None and recrawl:
            raise ValueError(f"job {job.scope}: no recrawl within a run")
        intake = self.jobs.intake(job, job_spec) if job is not None else None
        total = ProduceSummary()
        for chunk in batched(raw_urls, self.settings.producer_batch):
            total.merge(self._submit_batch(chunk, force_priority, depth, keep, recrawl,
                                           claim_token, extra, intake))
        return total

    def _submit_batch(self, raw_urls: list[str], force_priority: bool, depth: int,
                      keep: Keep | None = None, recrawl: bool = False,
                      claim_token: str | None = None, extra: dict[str, Any] | None = None,
                      job: JobIntake | None = None) -> ProduceSummary:
        summary = ProduceSummary(read=len(raw_urls))
        if job is not None:
            extra, force_priority = {**(extra or {}), **job.fields()}, force_priority or job.priority
        key, media = job.fingerprint if job is not None else fingerprint, "media" in (extra or {})
        candidates: list[tuple[str, Fingerprint]] = []
        invalid: list[Invalid] = []
        for raw in raw_urls:
            try:
                url = canonicalize(raw, max_length=self.settings.max_url_length)
            except InvalidURL as exc:
                invalid.append((raw, str(exc), job.fields() if job else {}))
                continue
            candidates.append((url, key(identity_url(url, media))))
        if self.hosts is not None and candidates:
            # Never claimed nor marked seen: allowed later, produced again, they are new.
            candidates = self.hosts.keep_allowed(candidates, summary.refused)

        try:
            fresh = self._unseen(candidates, recrawl, claim_token, job)
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"Redis failed while deduplicating: {exc}") from None
        accepted: list[_Accepted] = []
        queued: set[Fingerprint] = set()  # a URL twice in one batch is published once
        for (url, fp), new in zip(candidates, fresh, strict=True):
            if new == OVER_BUDGET:  # the run knows limits.pages URLs: not claimed, not sent
                summary.over_budget += 1
                continue
            if new != HELD or fp in queued:
                summary.duplicate += 1
                continue
            queued.add(fp)
            route = self.router.route(url, force_priority=force_priority)
            queue = topology.MEDIA_TWIN[route.queue] if media else route.queue
            accepted.append(_Accepted(url, fp, queue, route.ttl_ms, depth,
                                      uuid.uuid4().hex[:16] if recrawl else None, extra))
        unpublished: list[_Accepted] = []
        if keep is not None and accepted:
            verdicts = keep([item.url for item in accepted])
            summary.over_budget += verdicts.count(False)
            unpublished = [item for item, ok in zip(accepted, verdicts, strict=True) if not ok]
            accepted = [item for item, ok in zip(accepted, verdicts, strict=True) if ok]
        summary.invalid = len(invalid)
        for raw, reason, _fields in invalid:
            logger.warning("invalid URL %r: %s", raw[:200], reason)
        deferred = self._defer(accepted, job)
        published, failed = self._publish_with_retries(
            [item for item in accepted if id(item) not in deferred], invalid)
        try:
            # Marked seen only once confirmed (or deferred): a producer killed before this line
            # leaves the URLs unmarked, and running the same input again publishes them again
            # (a message that did get through before the kill ends "already done" at the worker).
            self._mark_seen([item.fp for item in (*deferred.values(), *published)],
                            claimed=not recrawl, job=job)
            if unpublished or failed:
                self.claims.release([item.fp for item in (*unpublished, *failed)],
                                    claim_token or self.token, job and job.budget, self.seen)
            if invalid:
                # Counted like the workers' dead letters, so the status view sees them too.
                self.seen.client.hincrby(COUNTERS, f"dead_lettered:{InvalidURL.reason}",
                                         len(invalid))
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"Redis failed after publishing {len(published)} URLs "
                                     f"(they are queued; a rerun publishes them again and the "
                                     f"workers record each once): {exc}") from None
        summary.new = len(published) + len(deferred)
        summary.deferred = len(deferred)
        summary.failed = len(failed)
        for item in (*deferred.values(), *published):
            summary.per_queue[item.queue] += 1
        for item in failed:
            logger.error("not published (not marked seen): %s", item.url)
        return summary

    def _defer(self, accepted: list[_Accepted], job: JobIntake | None = None) -> dict[int, _Accepted]:
        """The accepted URLs now waiting in Redis for their turn (by ``id``)."""
        if not (self.deferral.enabled and accepted):
            return {}
        try:
            later = self.deferral.defer([item.pending() for item in accepted],
                                        job.pace if job else None)
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"Redis failed while deferring: {exc}") from None
        return {id(item): item for item, wait in zip(accepted, later, strict=True) if wait}

    def _unseen(self, candidates: list[tuple[str, Fingerprint]], recrawl: bool,
                claim_token: str | None, job: JobIntake | None) -> list[int]:
        """HELD for the candidates to publish: a recrawl's all, else those not seen (nor over a
        job's budget), claimed for ``claim_token`` or this producer's token, in one call."""
        if recrawl:
            return [HELD] * len(candidates)
        return self.claims.take_unseen(
            self.seen, [fp for _, fp in candidates], claim_token or self.token,
            take_over="" if claim_token else PRODUCER_TOKEN_PREFIX,
            budget=job.budget if job else None)

    def _mark_seen(self, fps: list[Fingerprint], *, claimed: bool, job: JobIntake | None) -> None:
        """Mark confirmed URLs as seen and drop their claims (one call; a job's ``known``)."""
        if claimed:
            self.claims.mark_seen(self.seen, fps, job.budget if job else None)
        else:
            self.seen.add_many(fps)

    def _publish_with_retries(self, accepted: list[_Accepted], invalid: list[Invalid]
                              ) -> tuple[list[_Accepted], list[_Accepted]]:
        published: list[_Accepted] = []
        todo: list[Any] = [*accepted, *invalid]
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            publisher = self._ensure_publisher()
            try:
                for item in todo:
                    self._publish_one(publisher, item)
                confirms = publisher.wait()
            except AMQP_CONNECTION_LOST as exc:
                logger.warning("broker connection lost while publishing (attempt %d/%d): %s",
                               attempt, PUBLISH_ATTEMPTS, exc)
                confirms = publisher.fail_all(f"connection lost: {type(exc).__name__}")
                self.close()
            retry = []
            for confirm in confirms:
                if confirm.ok:
                    if isinstance(confirm.token, _Accepted):
                        published.append(confirm.token)
                else:
                    retry.append(confirm.token)
            # Items the loop never got to publish (the connection died first) have no confirm
            # at all: they are retried too, never silently left marked as seen.
            answered = {id(confirm.token) for confirm in confirms}
            retry.extend(item for item in todo if id(item) not in answered)
            if not retry:
                return published, []
            reasons = Counter(c.reason for c in confirms if not c.ok)
            logger.warning("%d publishes not confirmed (%s); retrying", len(retry), dict(reasons))
            todo = retry
            time.sleep(reconnect_delay_s(attempt))
        return published, [t for t in todo if isinstance(t, _Accepted)]

    def _publish_one(self, publisher: ConfirmingPublisher, item: Any) -> None:
        if isinstance(item, _Accepted):
            publisher.publish("", item.queue, item.message().to_json(), token=item,
                              expiration_ms=item.ttl_ms)
            return
        raw, reason, fields = item
        body = WorkMessage(url=raw, extra={**fields, "error": reason}).to_json()
        publisher.publish(DLQ_EXCHANGE, DLQ_ROUTING_KEY, body, token=item,
                          headers=dead_letter_headers("invalid_url", last_error=reason))
