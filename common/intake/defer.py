"""Fairness across domains: a domain's URLs wait in Redis until their turn is near.

Published all at once, 50,000 URLs of one domain sit in the work queue ahead of every other
domain, and the workers consume and park them one by one in the hold queues before reaching
the others (NOTES.md). So the producer paces each domain at its rate (the limiter's
``rate_for`` and slot spacing):

* :class:`Deferral` (the producer path, one Lua call per batch): each URL takes its domain's
  next release slot ``deferred:next:{domain}``, which moves on by one spacing per URL. A URL
  whose slot is within DEFER_LEAD_S of now is published as before; a later one goes, with its
  full body and queue, into the ZSET ``deferred``, scored by slot minus the lead. The producer
  then marks it seen like a confirmed one: the write to Redis is its confirm.
* :class:`Releaser` (a daemon thread in every worker, its own Redis client and AMQP
  connection): one Lua call claims up to DEFER_BATCH due members into ``deferred:inflight``
  under a lease (DEFER_LEASE_S), so two releasers never take the same one; published with
  confirms, then removed; a dead releaser's batch (kill -9) is claimed again after its lease.

A job's pace (``politeness.rate_limit``): its URLs take the run's own slots of each domain,
``deferred:next:{name}/{run}:{domain}``, at the stricter of its rate and the domain's (the
fleet's limiter the ceiling of all jobs). The first lead × rate URLs of a domain (20 at 2/s,
DEFER_LEAD_S 10) go at the domain's rate, the job's after them; DEFER_LEAD_S=0 drops the pace.
A deferred job message keeps its body (``job``, ``run``): the releaser publishes it as it was.

Crash guarantees: no URL is lost; one may be published twice only where the done mark makes
it one outcome: a producer killed between deferring and marking seen defers it again on a
rerun; a releaser killed between publishing and removing publishes it again a lease later.
Both copies meet ``done:{b}`` (the admit check, the result script's SADD): one result.
Member: ``"{domain} {queue} {ttl_ms or -}\\n{body}"``; the keys: common/store/keys.py.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pika
import redis

from common.broker.connection import open_publisher
from common.broker.publisher import ConfirmingPublisher
from common.core.backoff import reconnect_delay_s
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, PublishError, ServiceUnavailable
from common.store.connection import redis_client
from common.store.keys import deferred_key, deferred_next_key
from common.web.ratelimit import Rate, RateLimiter

logger = logging.getLogger(__name__)

#: A releaser looks for due members when the next one is due, but at most every MIN_POLL_S
#: and at least every half DEFER_LEAD_S, up to POLL_S (the lead covers that lateness); an idle
#: releaser is one call every few seconds, not a per-page cost (the bench's hot-path row).
MIN_POLL_S, POLL_S = 0.2, 5.0
# KEYS[1] deferred  KEYS[2] deferred:counts  KEYS[2+d] deferred:next:{domain d}, d = 1..D
# ARGV[1] lead ms  ARGV[2] D  ARGV[2+d] domain d's spacing ms  ARGV[2+D+d] domain d's name
# ARGV[3+2D...] pairs: the URL's domain number, its member.
# Returns one flag per URL: 0 = publish now, 1 = deferred (in KEYS[1]). A domain's slot key
# outlives its last slot by a minute; then the domain starts afresh.
DEFER_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lead = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local slots = {}
for d = 1, n do
  local slot = tonumber(redis.call('GET', KEYS[2 + d]) or '0')
  if slot < now then slot = now end
  slots[d] = slot
end
local flags = {}
for i = 3 + 2 * n, #ARGV, 2 do
  local d = tonumber(ARGV[i])
  local slot = slots[d]
  slots[d] = slot + tonumber(ARGV[2 + d])
  if slot - now <= lead then
    flags[#flags + 1] = 0
  else
    if redis.call('ZADD', KEYS[1], slot - lead, ARGV[i + 1]) == 1 then
      redis.call('HINCRBY', KEYS[2], ARGV[2 + n + d], 1)
    end
    flags[#flags + 1] = 1
  end
end
for d = 1, n do
  redis.call('SET', KEYS[2 + d], slots[d], 'PX', slots[d] - now + 60000)
end
return flags
"""

# KEYS[1] deferred  KEYS[2] deferred:inflight  ARGV[1] batch  ARGV[2] lease ms
# Claims members whose lease ran out first (their releaser died), then due ones, each leased
# until now + lease. Returns {ms until the next member is due or a lease runs out (-1: none),
# member, ...}.
CLAIM_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local batch = tonumber(ARGV[1])
local lease_end = now + tonumber(ARGV[2])
local taken = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
if #taken < batch then
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now,
                                     'LIMIT', 0, batch - #taken)) do
    redis.call('ZREM', KEYS[1], member)
    taken[#taken + 1] = member
  end
end
for _, member in ipairs(taken) do redis.call('ZADD', KEYS[2], lease_end, member) end
local wait = -1
for _, key in ipairs(KEYS) do
  local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if head[2] then
    local left = math.max(0, tonumber(head[2]) - now)
    if wait < 0 or left < wait then wait = left end
  end
end
table.insert(taken, 1, wait)
return taken
"""

# KEYS[1] deferred:inflight  KEYS[2] deferred:counts  ARGV pairs: member, its domain.
# Removes published members (once: a member re-claimed and removed by another releaser is
# not counted down twice). Returns how many were removed.
SETTLE_LUA = """
local removed = 0
for i = 1, #ARGV, 2 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    removed = removed + 1
    if redis.call('HINCRBY', KEYS[2], ARGV[i + 1], -1) <= 0 then
      redis.call('HDEL', KEYS[2], ARGV[i + 1])
    end
  end
end
return removed
"""


def spacing_ms(rate: Rate, guard: float) -> int:
    """The gap between two permits of ``rate``: the limiter's slot spacing (ratelimit.py)."""
    span_ms = rate.window_ms + math.ceil(rate.window_ms * guard)
    return math.ceil(span_ms / rate.amount)


@dataclass(frozen=True)
class Pending:
    """A message the producer is about to publish."""

    domain: str
    queue: str
    ttl_ms: int | None
    body: bytes

    def member(self) -> str:
        ttl = "-" if self.ttl_ms is None else str(int(self.ttl_ms))
        return f"{self.domain} {self.queue} {ttl}\n{self.body.decode('utf-8')}"

    @classmethod
    def from_member(cls, member: str | bytes) -> Pending:
        """Decode a ``deferred`` member; ValueError when this module did not write it."""
        text = member.decode("utf-8") if isinstance(member, bytes) else member
        head, newline, body = text.partition("\n")
        domain, queue, ttl = head.split(" ")
        if not newline or not body:
            raise ValueError("no message body")
        return cls(domain, queue, None if ttl == "-" else int(ttl), body.encode("utf-8"))


Entry = tuple[bytes, Pending]  # a claimed member and what it says


class Deferral:
    """The producer's side: which URLs to publish now and which to defer (see module doc)."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.lead_ms = round(settings.defer_lead_s * 1000)
        self.guard = settings.rate_limit_guard
        self.limiter = RateLimiter(client, settings)
        self._defer = client.register_script(DEFER_LUA)

    @property
    def enabled(self) -> bool:
        return self.lead_ms > 0

    def defer(self, items: Sequence[Pending], pace: tuple[str, Rate] | None = None) -> list[bool]:
        """Give every item its domain's next release slot, in one call; write those due later
        than the lead to ``deferred``. True for each item deferred (durably, in Redis). On a
        redis.RedisError nothing was deferred (the script is atomic). ``pace``: a job's run
        scope ("name/run") and rate, whose own slots the items take (module doc)."""
        if not self.enabled or not items:
            return [False] * len(items)
        domains = list(dict.fromkeys(item.domain for item in items))
        number = {domain: i + 1 for i, domain in enumerate(domains)}
        job_rate, slot_of = (pace[1], f"{pace[0]}:") if pace else (None, "")
        args: list[Any] = [self.lead_ms, len(domains)]
        args += [spacing_ms(self.limiter.rate_for(d).stricter(job_rate), self.guard)
                 for d in domains]
        args += domains
        for item in items:
            args += [number[item.domain], item.member()]
        flags = self._defer(keys=[deferred_key(), deferred_key("counts"),
                                  *(deferred_next_key(slot_of + d) for d in domains)], args=args)
        return [flag == 1 for flag in flags]


class Releaser:
    """Moves due deferred messages into RabbitMQ: a daemon thread in every worker process. It
    stops when ``stop`` is set or its starter (the worker's run loop) ended, batch finished."""

    def __init__(self, settings: Settings, stop: threading.Event,
                 client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.stop = stop
        self.client = client if client is not None else redis_client(settings)
        self.batch = settings.defer_batch
        self.lease_ms = max(1, round(settings.defer_lease_s * 1000))
        lead = settings.defer_lead_s
        self.poll_s = POLL_S if lead <= 0 else min(POLL_S, max(MIN_POLL_S, lead / 2))
        self.released = 0
        self._claim = self.client.register_script(CLAIM_LUA)
        self._settle = self.client.register_script(SETTLE_LUA)
        self._connection: pika.BlockingConnection | None = None
        self._publisher: ConfirmingPublisher | None = None
        self._owner: threading.Thread | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self._owner = threading.current_thread()
        self.thread = threading.Thread(target=self.run, name="deferral-releaser", daemon=True)
        self.thread.start()

    def run(self) -> None:
        """Release until stopped; Redis or broker trouble is waited out with backoff."""
        failures = 0
        try:
            while not self.stop.is_set() and (self._owner is None or self._owner.is_alive()):
                try:
                    claimed, wait_s = self.release_once()
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - Redis/broker down, or a bug: retry
                    failures += 1
                    expected = isinstance(exc, (redis.RedisError, ServiceUnavailable,
                                                PublishError, *AMQP_CONNECTION_LOST))
                    logger.log(logging.WARNING if failures == 1 or not expected else
                               logging.DEBUG, "releaser %s: %s: %s; retrying",
                               self.settings.worker_id, type(exc).__name__, exc,
                               exc_info=not expected)
                    self._close_amqp()
                    claimed, wait_s = 0, reconnect_delay_s(failures)
                if claimed < self.batch:
                    # Jitter: the releasers of several workers do not poll in step.
                    self.stop.wait(max(MIN_POLL_S, min(self.poll_s, wait_s))
                                   * random.uniform(0.8, 1))
        finally:
            self._close_amqp()

    def claim(self) -> tuple[list[bytes], float]:
        """Lease up to ``batch`` members (due, or whose lease ran out): the members, and
        seconds until the next one is due (the poll interval when none is)."""
        reply = self._claim(keys=[deferred_key(), deferred_key("inflight")],
                            args=[self.batch, self.lease_ms])
        return reply[1:], (self.poll_s if int(reply[0]) < 0 else int(reply[0]) / 1000)

    def release_once(self) -> tuple[int, float]:
        """Claim one batch, publish it with confirms, remove what was confirmed. Returns how
        many members were claimed, and seconds until the next is due (else the poll interval)."""
        self._keepalive()
        members, wait_s = self.claim()
        if not members:
            return 0, wait_s
        entries: list[Entry] = []
        for member in members:
            try:
                entries.append((member, Pending.from_member(member)))
            except (ValueError, UnicodeDecodeError) as exc:
                # Not written by this module: nothing can publish it. Said loudly, then removed.
                logger.error("dropping an unreadable deferred entry (%s): %r", exc, member[:300])
                self._settle(keys=[deferred_key("inflight"), deferred_key("counts")],
                             args=[member, member.split(b" ", 1)[0]])
        confirmed, failed = self._publish(entries)
        if confirmed:
            self._settle(keys=[deferred_key("inflight"), deferred_key("counts")],
                         args=[x for member, item in confirmed for x in (member, item.domain)])
            self.released += len(confirmed)
        if failed:
            # Claimable again at once, by any releaser (a lease that ended now).
            self.client.zadd(deferred_key("inflight"), dict.fromkeys(
                (member for member, _item in failed), 0), xx=True)
            logger.warning("releaser %s: %d deferred URLs not confirmed by the broker; "
                           "released again shortly", self.settings.worker_id, len(failed))
        logger.debug("releaser %s: released %d deferred URLs", self.settings.worker_id,
                     len(confirmed))
        return len(members), wait_s

    def _publish(self, entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
        publisher = self._ensure_publisher()
        try:
            for entry in entries:
                publisher.publish("", entry[1].queue, entry[1].body, token=entry,
                                  expiration_ms=entry[1].ttl_ms)
            confirms = publisher.wait(min(30.0, self.lease_ms / 2000))
        except AMQP_CONNECTION_LOST as exc:
            logger.warning("releaser %s: broker connection lost while publishing: %s",
                           self.settings.worker_id, exc)
            confirms = publisher.fail_all(f"connection lost: {type(exc).__name__}")
            self._close_amqp()
        ok = [c.token for c in confirms if c.ok]
        answered = {id(c.token) for c in confirms}
        failed = [c.token for c in confirms if not c.ok]
        failed += [entry for entry in entries if id(entry) not in answered]
        return ok, failed

    def _ensure_publisher(self) -> ConfirmingPublisher:
        if self._publisher is None:
            self._connection, self._publisher = open_publisher(self.settings)
        return self._publisher

    def _keepalive(self) -> None:  # pika answers the broker's heartbeats only in here
        if self._connection is not None:
            try:
                self._connection.process_data_events(time_limit=0)
            except AMQP_CONNECTION_LOST as exc:
                logger.info("releaser %s: idle broker connection lost (%s); reconnecting at "
                            "the next batch", self.settings.worker_id, exc)
                self._close_amqp()

    def _close_amqp(self) -> None:
        connection, self._connection, self._publisher = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except AMQP_CONNECTION_LOST as exc:
                logger.debug("closing a broken AMQP connection: %s", exc)


def deferred_status(client: redis.Redis, top: int = 10) -> dict[str, Any]:
    """The status view's part: deferred URLs, those being released, the ``top`` domains."""
    counts = {k.decode(): int(v) for k, v in client.hgetall(deferred_key("counts")).items()}
    largest = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    slots = client.mget([deferred_next_key(d) for d, _n in largest]) if largest else []
    return {"total": sum(counts.values()), "releasing": client.zcard(deferred_key("inflight")),
            "domains": [{"domain": domain, "deferred": n,
                         "through_in_s": round(max(0, int(slot or 0) - now_ms) / 1000)}
                        for (domain, n), slot in zip(largest, slots, strict=True)]}
