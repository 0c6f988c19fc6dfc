"""The scheduler process: one active replica through a lease in Redis, due URLs re-enqueued
through the producer path as recrawls, visits learned from the results.

Lease (``schedule:lease``, ``schedule:fence``): a replica takes it with ``SET NX PX`` under a
fencing token from ``INCR schedule:fence``, in one script; the holder renews it every tick
(SCHEDULE_LEASE_S / 4, at most 1 s) and deletes it on a clean stop. A killed leader's lease
expires by itself and the next replica to try takes it: a new leader within SCHEDULE_LEASE_S
plus one tick. Every take of due URLs checks the token in the same script, so a deposed
leader takes nothing; what it had taken and not rescheduled is taken over by the new leader
(:meth:`common.intake.schedule.Schedule.take`).

One tick of the leader: unless the work queues already hold SCHEDULE_MAX_QUEUED messages
(due URLs wait in the schedule rather than in queues whose TTL would expire them), take up
to SCHEDULE_BATCH due URLs into ``schedule:inflight`` → route and publish them as recrawls
with confirms (the producer's own publish-and-retry, with the due time's nonce and the last
visit's ETag / Last-Modified as ``extra["validators"]``, read by the same take, so the worker
asks "changed since?") → reschedule the confirmed ones at now + interval, put the others back
at their due time. A full batch is followed by the next at once (after renewing the lease).

A due time published twice (the leader killed after the broker had the batch and before it
was rescheduled: the new leader publishes it again) carries the same nonce both times, so the
workers' done set records one outcome for it.

While it leads, a replica also runs ``learn`` (the root script passes a result-sink loop:
``common.sink.reader.run_sink`` with :class:`Learner`, registered as the sink ``scheduler``),
which feeds what each result record says (:func:`common.intake.schedule.observation` and
:func:`~common.intake.schedule.validators`) to :meth:`Schedule.learn`; it stops when the lease
is lost. URLs get a schedule from ``scheduler.py add`` (any interval,
:func:`~common.core.values.parse_duration`) or ``scheduler.py sitemap`` (:func:`schedule_site`: seeded as
sitemap_producer.py does, each new URL's first interval from its ``changefreq``, else half the
age of its ``lastmod``, else SCHEDULE_INTERVAL_S).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import redis

from common.broker import topology
from common.core.backoff import reconnect_delay_s
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, REDIS_UNAVAILABLE, ServiceUnavailable
from common.core.urls import fingerprint
from common.intake.producer import Producer, _Accepted
from common.intake.schedule import AddSummary, Due, Schedule, observation, validators
from common.intake.sitemaps import SitemapReader, SiteReport, produce_site
from common.store.keys import RESULTS_STREAM, schedule_key
from common.store.slots import whole

logger = logging.getLogger(__name__)

#: The result-sink name (and consumer) the leader reads ``results`` as.
SINK_NAME = "scheduler"

# KEYS[1] schedule:lease  KEYS[2] schedule:fence  ARGV[1] owner  ARGV[2] ttl ms
# The lease is "token:owner". Renewed when the caller holds it; taken (SET NX PX) with a new
# token when nobody does. Returns the caller's token, or 0 when another replica holds it.
HOLD_LUA = """
local held = redis.call('GET', KEYS[1])
if held then
  local token, owner = string.match(held, '^(%d+):(.*)$')
  if owner ~= ARGV[1] then return 0 end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(token)
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[1], 'NX', 'PX', ARGV[2])
return token
"""
# KEYS[1] schedule:lease  ARGV[1] owner. Deletes the lease only if the caller holds it.
RELEASE_LUA = """
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^%d+:(.*)$') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


#: sitemaps.org ``<changefreq>`` → first interval (Schedule.add clamps it to the min and max).
CHANGEFREQ_S = {"always": 0, "hourly": 3600, "daily": 86400, "weekly": 7 * 86400,
                "monthly": 30 * 86400, "yearly": 365 * 86400, "never": 10 ** 9}
def first_interval(default_s: int, changefreq: str | None, lastmod: datetime | None,
                   now: datetime) -> float:
    """A sitemap URL's first interval: its ``changefreq``, else half the age of its
    ``lastmod`` (a page unchanged that long is not likely to change much sooner), else
    ``default_s`` (SCHEDULE_INTERVAL_S)."""
    if changefreq in CHANGEFREQ_S:
        return CHANGEFREQ_S[changefreq]
    if lastmod is not None and (age_s := (now - lastmod).total_seconds()) > 0:
        return age_s / 2
    return default_s


def schedule_entries(schedule: Schedule, entries: Iterable[Any]) -> AddSummary:
    """Schedule sitemap entries (:class:`common.intake.sitemap_files.Entry`) not scheduled
    yet, each first revisited one interval from now (the producer seeds them now)."""
    now, default_s = datetime.now(UTC), schedule.settings.schedule_interval_s
    items = []
    for entry in entries:
        interval_s = schedule.clamp(first_interval(default_s, entry.changefreq, entry.lastmod,
                                                   now))
        items.append((entry.url, interval_s, interval_s))
    return schedule.add(items, replace=False)


def schedule_site(target: str, reader: SitemapReader, producer: Producer, schedule: Schedule,
                  max_urls: int | None = None) -> tuple[SiteReport, AddSummary]:
    """Seed ``target``'s sitemaps through ``producer`` (as sitemap_producer.py does) and
    schedule their URLs (:func:`schedule_entries`)."""
    added = AddSummary()
    report = produce_site(target, reader, producer, max_urls=max_urls,
                          on_entries=lambda entries: added.merge(
                              schedule_entries(schedule, entries)))
    return report, added


class Lease:
    """A leader lease on ``key`` (the recrawl scheduler's, or the job runner's
    ``jobs:lease``), held by ``owner`` (unique per process); fencing tokens from
    ``schedule:fence``."""

    def __init__(self, client: redis.Redis, ttl_ms: int, owner: str | None = None,
                 key: str | None = None) -> None:
        self.client = client
        self.key = key or schedule_key("lease")
        self.ttl_ms = ttl_ms
        self.owner = owner or uuid.uuid4().hex
        self._hold = client.register_script(HOLD_LUA)
        self._release = client.register_script(RELEASE_LUA)

    def hold(self) -> int:
        """Take or renew the lease: the fencing token, or 0 when another replica holds it."""
        return int(self._hold(keys=[self.key, schedule_key("fence")], args=[self.owner,
                                                                    self.ttl_ms]))

    def release(self) -> bool:
        """Give the lease up (a clean stop): another replica takes over at its next tick."""
        return bool(self._release(keys=[self.key], args=[self.owner]))


class RecrawlProducer(Producer):
    """The producer path for due URLs: already canonical, routed by ROUTING_RULES, deferred
    or published persistently with confirms and retries, each with its due time's nonce.
    Uses the Producer's own steps (``_defer``, ``_publish_with_retries``), which report per
    URL where ``submit`` only counts."""

    _channel: Any = None

    def queued(self) -> int | None:
        """Messages ready in the work queues (passive declares); None when unknown."""
        try:
            self._ensure_publisher()
            if self._channel is None or not self._channel.is_open:
                assert self._connection is not None
                self._channel = self._connection.channel()
            return sum(self._channel.queue_declare(queue=name, passive=True).method.message_count
                       for name in topology.PAGE_QUEUES)
        except AMQP_CONNECTION_LOST as exc:
            logger.warning("scheduler: queue depths unknown (%s); publishing anyway", exc)
            self.close()
            return None

    def publish_due(self, due: list[Due]) -> tuple[list[Due], list[Due]]:
        """Publish (or defer, as the producer does: fairness across domains), each with the
        validators of its last visit (``extra["validators"]``, the worker's conditional
        request); returns (confirmed or deferred, not confirmed)."""
        accepted = []
        for item in due:
            route = self.router.route(item.url)
            extra = {"validators": given} if (given := item.validators) else None
            accepted.append(_Accepted(item.url, fingerprint(item.url), route.queue,
                                      route.ttl_ms, 0, item.nonce, extra))
        deferred = self._defer(accepted)
        published, _failed = self._publish_with_retries(
            [item for item in accepted if id(item) not in deferred], [])
        ok = {item.url for item in (*deferred.values(), *published)}
        return [d for d in due if d.url in ok], [d for d in due if d.url not in ok]

    def keepalive(self) -> None:
        """Let pika answer the broker's heartbeats while no URL is due (an idle blocking
        connection is closed by the broker after two missed heartbeats)."""
        if self._connection is None:
            return
        try:
            self._connection.process_data_events(time_limit=0)
        except AMQP_CONNECTION_LOST as exc:
            logger.info("scheduler: broker connection lost while idle (%s); reconnecting at "
                        "the next publish", exc)
            self.close()

    def mark_seen(self, due: list[Due]) -> None:
        """Mark published URLs as seen (a later plain seed of them is a duplicate)."""
        self.seen.add_many([fingerprint(d.url) for d in due])


class Learner:
    """A result sink (``common.sink.reader.Sink``) that learns from each ``results`` entry;
    failure records are acknowledged without effect. Idempotent: replays change nothing."""

    name = SINK_NAME

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def write(self, entries: list[Any]) -> None:
        self.schedule.learn((e.record["url"], e.id, *observation(e.record),
                             *validators(e.record)) for e in entries
                            if whole(e.stream) == RESULTS_STREAM  # a cluster's: its part
                            and isinstance(e.record.get("url"), str))

    def close(self) -> None:
        """Nothing to close: every batch is in Redis when write returns."""


class Recrawler:
    """The scheduler loop of one replica (see the module docstring)."""

    def __init__(self, settings: Settings, schedule: Schedule, lease: Lease,
                 producer: RecrawlProducer,
                 learn: Callable[[threading.Event], object] | None = None) -> None:
        self.schedule = schedule
        self.lease = lease
        self.producer = producer
        self.learn = learn
        self.batch = settings.schedule_batch
        self.max_queued = settings.schedule_max_queued
        self.holding = False
        self.stale_ms = lease.ttl_ms
        self.tick_s = min(1.0, settings.schedule_lease_s / 4)
        self.token = 0
        self.published = 0
        self._learning: tuple[threading.Event, threading.Thread] | None = None

    def run(self, stop: threading.Event) -> int:
        """Lead or wait until ``stop``; then give the lease up. Returns the exit code (0)."""
        attempt = 0
        try:
            while not stop.is_set():
                try:
                    self._lead(self.lease.hold())
                    busy = bool(self.token) and self.tick() >= self.batch
                    attempt = 0
                except (*REDIS_UNAVAILABLE, redis.exceptions.OutOfMemoryError,
                        ServiceUnavailable) as exc:
                    attempt += 1
                    delay = reconnect_delay_s(attempt)
                    logger.warning("scheduler: %s; retry in %.1f s", exc, delay)
                    stop.wait(delay)
                    continue
                if not busy:
                    self.producer.keepalive()
                    stop.wait(self.tick_s)
        finally:
            self._lead(0, stopping=True)
            try:
                self.lease.release()
            except REDIS_UNAVAILABLE as exc:
                logger.warning("scheduler: lease not released (it expires by itself): %s", exc)
            self.producer.close()
        return 0

    def tick(self) -> int:
        """One batch: take, publish, reschedule. Returns how many URLs were taken."""
        token = self.token
        queued = self.producer.queued()
        if self.holding != (queued is not None and queued >= self.max_queued):
            self.holding = not self.holding
            logger.info("scheduler: %s (%s messages in the work queues, SCHEDULE_MAX_QUEUED=%d)",
                        "holding due URLs back" if self.holding else "publishing again", queued,
                        self.max_queued)
        if self.holding:
            return 0
        due = self.schedule.take(token, self.batch, self.stale_ms)
        if not due:
            return 0
        started = time.monotonic()
        try:
            published, failed = self.producer.publish_due(due)
        except BaseException:
            self.schedule.release(token, [d.url for d in due])
            raise
        settled = self.schedule.settle(token, [d.url for d in published])
        self.schedule.release(token, [d.url for d in failed])
        self.producer.mark_seen(published)
        self.published += len(published)
        logger.info("scheduler: %d due URLs re-enqueued, %d back for retry, in %.0f ms "
                    "(token %d%s)", len(published), len(failed),
                    (time.monotonic() - started) * 1000, token,
                    "" if settled == len(published) else
                    f"; {len(published) - settled} taken over by a newer leader meanwhile")
        return len(due)

    def _lead(self, token: int, stopping: bool = False) -> None:
        """Follow a change of leadership: start or stop learning, say so once. Learning that
        ended by itself (its sink group retired meanwhile) starts again while leading."""
        if token and token != self.token:
            logger.info("scheduler %s leads (fencing token %d)", self.lease.owner, token)
        elif self.token and not token and not stopping:
            logger.warning("scheduler %s lost the lease (token %d)", self.lease.owner,
                           self.token)
        self.token = token
        if self._learning is not None and not self._learning[1].is_alive():
            self._learning = None
        if token and self._learning is None and self.learn is not None:
            stop = threading.Event()
            thread = threading.Thread(target=self.learn, args=(stop,), name="learn",
                                      daemon=True)
            thread.start()
            self._learning = (stop, thread)
        elif not token and self._learning is not None:
            stop, thread = self._learning
            stop.set()
            thread.join(timeout=30)
            self._learning = None
