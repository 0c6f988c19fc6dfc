"""The worker's ways to give up on a URL: retry later, dead-letter, poison.

One :class:`GivingUp` per processor (common/work/processor.py). A step that ends a delivery
without a result returns an :data:`~common.work.outcome.Ending` (park, retry, dead letter);
:meth:`GivingUp.settle` turns it into the :class:`~common.work.outcome.Outcome` to publish,
here and only here. Nothing is acked here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import redis

from common.broker import topology
from common.broker.deadletter import dead_letter_headers, utc_now_iso
from common.broker.messages import WorkMessage
from common.core.backoff import retry_delay_s
from common.core.config import Settings
from common.core.errors import BadMessage, InvalidURL
from common.core.urls import canonicalize, identity_url, job_fingerprint
from common.jobs.registry import JobRef
from common.store.dedupe import DoneSet, SeenSet
from common.store.keys import COUNTERS, failures_key
from common.store.marks import DoneMark, Retime
from common.store.results import ResultStore
from common.web.ratelimit import RateLimiter, retime_permit
from common.work import metrics
from common.work.archive import with_archive
from common.work.outcome import (
    Ending,
    Failure,
    Outcome,
    Park,
    Retry,
    dead_letter,
    park,
)
from common.work.poison import PoisonGuard
from common.work.record import failure_record

if TYPE_CHECKING:
    from common.work.steps.trip import Trip


class GivingUp:
    """Retries, dead letters and done marks, from the settings they need (never kept whole)."""

    def __init__(self, settings: Settings, client: redis.Redis, limiter: RateLimiter,
                 done: DoneSet, seen: SeenSet, results: ResultStore,
                 poison: PoisonGuard) -> None:
        self.client = client
        self.limiter = limiter
        self.done = done
        self.seen = seen
        self.results = results
        self.poison = poison
        self.worker_id = settings.worker_id
        self.max_url_length = settings.max_url_length
        self.max_retries = settings.max_retries
        self.failures_ttl_s = settings.failures_ttl_s
        self.retry_base_s = settings.retry_base_s
        self.retry_max_s = settings.retry_max_s
        self.retry_after_max_s = settings.retry_after_max_s

    def settle(self, trip: Trip, end: Ending) -> Outcome:
        """The outcome of a delivery a step ended with ``end``; a failure record carries the
        response's place in the archive, if it was archived."""
        message = trip.message
        if isinstance(end, Park):
            return park(end.message or message, trip.queue, end.delay_ms, end.why)
        failure = end.failure
        if message is None:  # Decode: the body is not a message to act on
            return self.dead_letter_raw(trip.body, trip.url or "<unparsable>",
                                        failure.reason, failure.error or failure.reason)
        if isinstance(end, Retry):
            outcome = self.failed(trip.url, message, trip.queue, failure, end.retime)
        elif end.unless_done and self.is_done(trip.url, message):
            if trip.progress is not None:
                self.poison.clear(trip.progress)  # its outcome is recorded: not poison
            return Outcome("already_done", trip.url, detail="redelivered, outcome recorded")
        else:
            outcome = self.dead_letter(message, trip.url, trip.queue, failure,
                                       retime=end.retime, count=end.count)
        return with_archive(outcome, trip.response) if trip.response is not None else outcome

    def failed(self, url: str, message: WorkMessage, queue: str,
                failure: Failure, retime: Retime | None = None) -> Outcome:
        """A transient failure: count it in Redis, then retry later or give up."""
        key = failures_key(url)
        pipe = self.client.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, self.failures_ttl_s)
        self.limiter.report(pipe, url, failure, retime)  # permit re-time; 429/503/timeout throttle
        failures = int(pipe.execute()[0])
        first_failure = message.extra.get("first_failure") or utc_now_iso()
        updated = replace(message, attempts=failures,
                          extra={**message.extra, "first_failure": first_failure,
                                 "last_status": failure.status, "last_error": failure.error})
        if failures > self.max_retries:
            return self.dead_letter(updated, url, queue, failure, gave_up=True)
        delay_s = retry_delay_s(failures, failure.retry_after, base_s=self.retry_base_s,
                                max_s=self.retry_max_s,
                                retry_after_max_s=self.retry_after_max_s)
        self.client.hincrby(COUNTERS, "retries", 1)
        metrics.RETRIES.inc()
        return park(updated, queue, delay_s * 1000, turn=False,  # MAX_WAIT_S counts after it
                    why=f"retry {failures}/{self.max_retries} after {failure.reason}")

    def dead_letter(self, message: WorkMessage, url: str, queue: str, failure: Failure, *,
                     gave_up: bool = False, retime: Retime | None = None,
                     count: str | None = None) -> Outcome:
        """Dead-letter ``message`` (``max_retries`` when ``gave_up``); ``count``: a
        ``stats:counters`` field to add one to, in the same round trip."""
        reason = "max_retries" if gave_up else failure.reason
        headers = dead_letter_headers(
            reason, attempts=message.attempts if gave_up else message.attempts + 1,
            last_status=failure.status, last_error=failure.error or failure.reason,
            first_failure=message.extra.get("first_failure"))
        headers["failure"] = failure.reason
        extra = {k: v for k, v in message.extra.items() if k not in ("not_before", "slot")}
        body = replace(message, url=url, extra=extra).to_json()
        pipe = self.client.pipeline(transaction=False)
        pipe.hincrby(COUNTERS, f"dead_lettered:{reason}", 1)
        if count is not None:
            pipe.hincrby(COUNTERS, count, 1)
        if retime is not None:
            retime_permit(pipe, retime)
        pipe.execute()
        record = self._failure_record(url, headers, queue, message.depth)
        job = JobRef.of(message.extra)
        if job is not None:  # counted in the run's counters as it is appended (results.py)
            record.update(job.fields())
        return dead_letter(url, body, headers, f"{reason} ({failure.reason})", record,
                           mark_done=self.done_mark(url, message))

    def done_mark(self, url: str, message: WorkMessage) -> DoneMark:
        """The done mark of this message's outcome: the URL's, for a recrawl (a ``nonce``
        in the message) that of this one refresh, for a job's message that of its run."""
        nonce = message.extra.get("nonce")
        nonce = nonce if isinstance(nonce, str) else None
        job = JobRef.of(message.extra)
        return self.done.mark_for(identity_url(url, "media" in message.extra), nonce,
                                  scope=job.scope if job is not None else None)

    def is_done(self, url: str, message: WorkMessage) -> bool:
        return self.done.contains(self.done_mark(url, message))

    def dead_letter_raw(self, body: bytes, url: str, reason: str, error: str) -> Outcome:
        """Dead-letter a body no step could act on (not a message; the processing raised). A
        job's message among them still ends its URL in its run: its failure record carries
        the job and its done mark, so the run counts it, once."""
        headers = dead_letter_headers(reason, last_error=error)
        self.client.hincrby(COUNTERS, f"dead_lettered:{reason}", 1)
        record, mark = self._failure_record(url, headers, None, None), None
        try:
            message = WorkMessage.from_json(body)
            job = JobRef.of(message.extra)
            canonical = canonicalize(message.url, max_length=self.max_url_length)
        except (BadMessage, InvalidURL):
            job = None  # not a job's URL to end: the record as it is
        if job is not None:
            record.update(url=canonical, depth=message.depth, **job.fields())
            mark = self.done_mark(canonical, message)
        return dead_letter(url, body, headers, f"{reason}: {error}", record, mark_done=mark)

    def _failure_record(self, url: str, headers: dict[str, Any], queue: str | None,
                        depth: int | None) -> dict[str, Any]:
        return failure_record(url, headers, worker=self.worker_id, queue=queue,
                              depth=depth)

    def record_dead_letter(self, mark: DoneMark | None, record: dict[str, Any] | None) -> None:
        """The dead letter is confirmed: mark the URL done and append its failure record, in
        one round trip (once per URL: a second confirm of the same URL appends nothing)."""
        if record is None:
            if mark is not None:
                self.done.add(mark)
            return
        self.results.record_failure(record, mark)
        if (record.get("failure") == "fetch_blocked" and record.get("depth") == 0
                and not record.get("url_truncated")):
            self._release_blocked(record["url"], mark, JobRef.of(record))

    def _release_blocked(self, url: str, mark: DoneMark | None, job: JobRef | None) -> None:
        """A seed the address guard refused is not final: once FETCH_ALLOW_NETWORKS allows its
        network, producing it again must fetch it. Its done and seen marks go (one round
        trip), after its one failure record is in (as an expired message's seen mark). Links
        (depth > 0) keep theirs: no one produces them again, but every other page linking
        them would, each to one more dead letter; ``dlq replay`` retries them."""
        fp = job_fingerprint(url, job.scope if job is not None else None)
        pipe = self.client.pipeline(transaction=False)
        if mark is not None:
            pipe.srem(mark.key, mark.member)
        pipe.srem(self.seen.key(fp), fp.member)
        pipe.execute()

    def poison_dropped(self, body: bytes) -> Outcome:
        try:
            message = WorkMessage.from_json(body)
            url = canonicalize(message.url, max_length=self.max_url_length)
        except (BadMessage, InvalidURL) as exc:
            return self.dead_letter_raw(body, "<unparsable>", "poison",
                                         f"past the queue's delivery limit; {exc}")
        if self.is_done(url, message):
            return Outcome("already_done", url, detail="past the delivery limit, recorded")
        return self.dead_letter(message, url, topology.NORMAL_QUEUE, Failure(
            "poison", error=f"past the quorum queue's delivery limit "
                            f"({topology.DELIVERY_LIMIT}); last stage "
                            f"{self.poison.last_stage(url)}"))
