"""The seen-set (URLs accepted, shared by every producer) and the done-set (URLs whose outcome is
recorded, shared by every worker).

Fingerprints (:mod:`common.core.urls`) are spread over ``SEEN_BUCKETS`` small Redis sets
(``crawled_urls:{b}``, see :mod:`common.store.keys`) holding 64-bit integers, so every bucket stays in
Redis's compact intset encoding (set-max-intset-entries, 512 by default): about 8 bytes a URL
plus a small per-key overhead, where a set of hex strings costs 80+ bytes (NOTES.md #4).
Exact: the only false positive is a full 64-bit collision inside one bucket.

A job's run has its own fingerprints (``job_fingerprint``, scope "name/run") in the same sets.
Its claim script also holds ``limits.pages``: a new URL is claimed only while the run's
``known`` plus its live reservations (``job:{name}:run:{n}:claimed``, one per claimed URL not
yet seen, ending with the claim) stay under it; its mark-seen script raises ``known`` by the
URLs newly seen. So the limit is exact across producers and workers, but for a publish slower
than CLAIM_TTL_MS (its reservation lapses before its confirm is counted).

Every operation is one pipelined round trip for a whole batch; on a Redis Cluster one script
call per shard of the batch's buckets (a bucket and its URLs' claims share a hash tag,
common/store/slots.py), all in one cluster pipeline (each primary's calls sent together), each
atomic on its own; a done mark lives in its URL's domain shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from common.core.urls import Fingerprint, job_fingerprint
from common.store.keys import DONE_PREFIX, SEEN_PREFIX, claim_key, job_run_key, seen_bucket
from common.store.marks import DoneMark
from common.store.slots import refuse_on_cluster, run_by_shard, spread, url_shard

# KEYS[i] the bucket of fingerprint i, ARGV[i] its member. One command for a whole batch:
# redis-py packs and parses one command instead of a pipeline of one per URL.
SISMEMBER_EACH_LUA = """
local found = {}
for i, key in ipairs(KEYS) do found[i] = redis.call('SISMEMBER', key, ARGV[i]) end
return found
"""
SADD_EACH_LUA = """
local added = {}
for i, key in ipairs(KEYS) do added[i] = redis.call('SADD', key, ARGV[i]) end
return added
"""


class SeenSet:
    """A set of URL fingerprints in ``buckets`` small intsets under ``prefix``.

    The seen-set (``crawled_urls:``) and the done-set (``done:``) share this layout.
    """

    def __init__(self, client: redis.Redis, buckets: int, prefix: str = SEEN_PREFIX) -> None:
        self.client = client
        self.buckets = buckets
        self.prefix = prefix
        self._sismember_each = client.register_script(SISMEMBER_EACH_LUA)
        self._sadd_each = client.register_script(SADD_EACH_LUA)

    def key(self, fp: Fingerprint) -> str:
        return seen_bucket(fp.bucket(self.buckets), self.prefix)

    def claim(self, fp: Fingerprint) -> str:
        """The URL's ``claim:`` key, in its bucket's slot."""
        return claim_key(fp.hex, fp.bucket(self.buckets))

    def by_slot(self, fps: Sequence[Fingerprint], script: Any,
                build: Callable[[list[int]], tuple[list[str], list[Any]]]) -> list:
        """``script`` for all of ``fps`` at once, or on a cluster per bucket shard (one
        pipeline): :func:`common.store.slots.run_by_shard`."""
        return run_by_shard(self.client, script, len(fps),
                            lambda i: fps[i].bucket(self.buckets), build)

    def add_many(self, fps: Sequence[Fingerprint]) -> list[bool]:
        """Mark fingerprints as seen; True for each one that was new (one round trip)."""
        if not fps:
            return []
        added = self.by_slot(fps, self._sadd_each, lambda ix: (
            [self.key(fps[i]) for i in ix], [fps[i].member for i in ix]))
        return [flag == 1 for flag in spread(added, len(fps))]

    def remove_many(self, fps: Sequence[Fingerprint]) -> int:
        """Forget fingerprints (unconfirmed publishes, expired messages). Returns how many."""
        if not fps:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for fp in fps:
            pipe.srem(self.key(fp), fp.member)
        return sum(pipe.execute())

    def contains_many(self, fps: Sequence[Fingerprint]) -> list[bool]:
        if not fps:
            return []
        found = self.by_slot(fps, self._sismember_each, lambda ix: (
            [self.key(fps[i]) for i in ix], [fps[i].member for i in ix]))
        return [bool(flag) for flag in spread(found, len(fps))]

    def count(self) -> int:
        """Number of fingerprints, by SCARD over the existing buckets (for stats)."""
        total = 0
        keys = list(self.client.scan_iter(match=f"{self.prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            pipe = self.client.pipeline(transaction=False)
            for key in keys[start:start + 1000]:
                pipe.scard(key)
            total += sum(pipe.execute())
        return total


class DoneSet:
    """URLs whose outcome (one result or one dead letter) is recorded: a redelivered message of
    a done URL is acked without a second outcome (``done:{b}``, NOTES.md #14)."""

    def __init__(self, client: redis.Redis, buckets: int) -> None:
        self.client = client
        self.fingerprints = SeenSet(client, buckets, prefix=DONE_PREFIX)

    def mark_for(self, url: str, nonce: str | None = None, scope: str | None = None) -> DoneMark:
        """The done mark of ``url``'s outcome, or with a recrawl ``nonce`` that of one refresh;
        ``scope``: a job's run ("name/run", :attr:`JobRef.scope`), None for the default job."""
        fp = job_fingerprint(f"{url}#recrawl:{nonce}" if nonce else url, scope)
        return DoneMark(seen_bucket(fp.bucket(self.fingerprints.buckets), DONE_PREFIX,
                                    url_shard(url)), fp.member)

    def contains(self, mark: DoneMark) -> bool:
        return bool(self.client.sismember(mark.key, mark.member))

    def add(self, mark: DoneMark) -> None:
        """Record that a URL's outcome is final (once its dead letter is confirmed)."""
        self.client.sadd(mark.key, mark.member)

    def forget(self, urls: Sequence[str], scope: str | None = None) -> int:
        """Clear the marks of ``urls`` (a DLQ replay makes them new again), within a job's run
        ``scope`` or the default job's. Returns how many."""
        if not urls:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for url in urls:
            mark = self.mark_for(url, scope=scope)
            pipe.srem(mark.key, mark.member)
        return sum(pipe.execute())


#: How long a claim keeps other pages off a URL; far longer than publishing a batch.
CLAIM_TTL_MS = 120_000

#: A producer's own token (``producer:{id}``, one per :class:`common.intake.producer.Producer`)
#: starts so: another producer takes such a claim over, a page never does.
PRODUCER_TOKEN_PREFIX = "producer:"

# The seen check and the claim in one atomic step, so no claim is taken on a URL that another
# caller marked seen (and dropped its claim) between a separate check and claim.
# KEYS[2i-1] the seen bucket of URL i, KEYS[2i] its claim:{fp}; with a page budget (ARGV[4] >=
# 0) two more: the run's counters (field known) and its reservations ZSET (member = the URL's
# member, score = when its claim ends). ARGV[1] token, ARGV[2] ttl ms, ARGV[3] the token prefix
# the caller may take over ('' for none), ARGV[4] the run's page budget (-1: none), ARGV[4+i]
# URL i's member. Returns per URL 1 = the caller holds it now (not seen; claimed by it, newly,
# again or taken over), 0 = seen or claimed by another, 2 = over the run's budget (a budget
# counts known URLs and live reservations: what is being published counts before its confirm).
CLAIM_UNSEEN_LUA = """
local held = {}
local prefix = ARGV[3]
local budget = tonumber(ARGV[4])
local n = #KEYS / 2
local room, reserved, lease_end
if budget >= 0 then
  n = n - 1
  reserved = KEYS[#KEYS]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  lease_end = now + tonumber(ARGV[2])
  redis.call('ZREMRANGEBYSCORE', reserved, '-inf', now)
  room = budget - tonumber(redis.call('HGET', KEYS[#KEYS - 1], 'known') or '0')
         - redis.call('ZCARD', reserved)
end
for i = 1, n do
  local claim = KEYS[2 * i]
  local member = ARGV[4 + i]
  if redis.call('SISMEMBER', KEYS[2 * i - 1], member) == 1 then
    held[i] = 0
  else
    local holder = redis.call('GET', claim)
    if holder and holder ~= ARGV[1]
       and (prefix == '' or string.sub(holder, 1, #prefix) ~= prefix) then
      held[i] = 0
    elseif reserved and not redis.call('ZSCORE', reserved, member) and room <= 0 then
      held[i] = 2
    else
      redis.call('SET', claim, ARGV[1], 'PX', ARGV[2])
      if reserved and redis.call('ZADD', reserved, lease_end, member) == 1 then
        room = room - 1
      end
      held[i] = 1
    end
  end
end
if reserved then redis.call('PEXPIRE', reserved, ARGV[2]) end
return held
"""

# Confirmed URLs: mark each seen, then drop its claim, in one step (no moment where a URL is
# neither seen nor claimed). KEYS as CLAIM_UNSEEN_LUA's (with a run: its counters and its
# reservations after the pairs), ARGV[1] the counter field ('' without a run), ARGV[1+i] URL
# i's member. A run's field is raised by the URLs newly marked seen. Returns that number.
SEEN_UNCLAIM_LUA = """
local n = #KEYS / 2
local field = ARGV[1]
if field ~= '' then n = n - 1 end
local added = 0
for i = 1, n do
  added = added + redis.call('SADD', KEYS[2 * i - 1], ARGV[1 + i])
  redis.call('DEL', KEYS[2 * i])
  if field ~= '' then redis.call('ZREM', KEYS[#KEYS], ARGV[1 + i]) end
end
if field ~= '' and added > 0 then redis.call('HINCRBY', KEYS[#KEYS - 1], field, added) end
return added
"""

# KEYS[i] claim:{fp} of URL i (and with a run, last, its reservations ZSET); ARGV[1] token,
# ARGV[2] '1' with a run, ARGV[2+i] URL i's member. Drops the claims (and reservations) the
# token still holds.
RELEASE_LUA = """
local dropped = 0
local n = #KEYS
if ARGV[2] == '1' then n = n - 1 end
for i = 1, n do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    dropped = dropped + redis.call('DEL', KEYS[i])
    if ARGV[2] == '1' then redis.call('ZREM', KEYS[#KEYS], ARGV[2 + i]) end
  end
end
return dropped
"""

#: What :meth:`Claims.take_unseen` says of each URL.
TAKEN, HELD, OVER_BUDGET = 0, 1, 2


@dataclass(frozen=True)
class RunBudget:
    """A job's run as the claim scripts see it: its counters hash (``known``, raised when its
    URLs are marked seen) and its page budget (``limits.pages``; None: no limit)."""

    name: str
    run: int
    pages: int | None = None

    @property
    def counters(self) -> str:
        return job_run_key(self.name, self.run)

    @property
    def reservations(self) -> str:
        """ZSET of the run's claimed URLs not yet seen (``job:{name}:run:{n}:claimed``)."""
        return f"{self.counters}:claimed"


class Claims:
    """Short-lived claims on URLs being published (``claim:{fp}``), so that a URL is published
    once although the seen-set is written only after the broker's confirm (NOTES.md #5, #16).

    Pages in crawl mode claim their new links with the page's token: two pages linking the same
    new URL at the same moment publish it once, and the same page, redelivered after its worker
    died mid-publish, takes its claims over. The producer claims seeds with its own token
    (:data:`PRODUCER_TOKEN_PREFIX`): a page that links a seed (itself, say) while the seed's
    confirm is on its way counts it as a duplicate. Another producer takes a producer's claim
    over (a rerun after a kill -9 must not wait out the lease); a claim never makes a URL seen.
    """

    def __init__(self, client: redis.Redis, ttl_ms: int = CLAIM_TTL_MS) -> None:
        self.client = client
        self.ttl_ms = ttl_ms
        self._claim_unseen = client.register_script(CLAIM_UNSEEN_LUA)
        self._seen_unclaim = client.register_script(SEEN_UNCLAIM_LUA)
        self._release = client.register_script(RELEASE_LUA)

    def take_unseen(self, seen: SeenSet, fps: Sequence[Fingerprint], token: str, *,
                    take_over: str = "", budget: RunBudget | None = None) -> list[int]:
        """Claim for ``token`` each of ``fps`` that ``seen`` does not hold, in one atomic round
        trip: :data:`HELD` for each one the caller holds now, else :data:`TAKEN` (or
        :data:`OVER_BUDGET`: a new URL beyond the run's page budget, not claimed).

        Args:
            take_over: a token prefix whose claims the caller takes over (a producer:
                :data:`PRODUCER_TOKEN_PREFIX`); "" takes over none but the caller's own.
            budget: a job's run with a page limit: known URLs plus live reservations never
                exceed it, across every producer and worker.
        """
        if not fps:
            return []
        extra: list[str] = []
        limit = -1
        if budget is not None and budget.pages is not None:
            refuse_on_cluster("a job's page budget")
            extra, limit = [budget.counters, budget.reservations], budget.pages

        def claim(ix: list[int]) -> tuple[list[str], list[Any]]:
            keys = [key for i in ix for key in (seen.key(fps[i]), seen.claim(fps[i]))]
            return [*keys, *extra], [token, self.ttl_ms, take_over, limit,
                                     *(fps[i].member for i in ix)]

        held = seen.by_slot(fps, self._claim_unseen, claim)
        return [int(flag) for flag in spread(held, len(fps))]

    def mark_seen(self, seen: SeenSet, fps: Sequence[Fingerprint],
                  run: RunBudget | None = None) -> int:
        """Mark confirmed URLs seen and drop their claims (one atomic round trip); a job's
        ``run`` counts those newly seen as ``known`` in the same script. Returns that number."""
        if not fps:
            return 0
        if run is not None:
            refuse_on_cluster("a job's run counters")
        extra = [run.counters, run.reservations] if run is not None else []

        def mark(ix: list[int]) -> tuple[list[str], list[Any]]:
            keys = [key for i in ix for key in (seen.key(fps[i]), seen.claim(fps[i]))]
            return [*keys, *extra], ["known" if run else "", *(fps[i].member for i in ix)]

        return sum(int(added) for _ix, added in seen.by_slot(fps, self._seen_unclaim, mark))

    def release(self, fps: Sequence[Fingerprint], token: str,
                run: RunBudget | None = None, seen: SeenSet | None = None) -> int:
        """Drop the claims ``token`` still holds on ``fps`` (not published: failed, over
        budget), so a page may publish them at once; a job's ``run`` its reservations too.
        ``seen`` places the claims (needed on a cluster). Returns how many."""
        if not fps:
            return 0
        if seen is None:  # one bucket will do outside cluster mode
            refuse_on_cluster("releasing claims without their seen-set")
        seen = seen or SeenSet(self.client, 1)
        if run is not None:
            refuse_on_cluster("a job's run reservations")
        extra = [run.reservations] if run is not None else []

        def drop(ix: list[int]) -> tuple[list[str], list[Any]]:
            return ([*(seen.claim(fps[i]) for i in ix), *extra],
                    [token, "1" if run else "", *(fps[i].member for i in ix)])

        return sum(int(n) for _ix, n in seen.by_slot(fps, self._release, drop))

