"""The seen-set (URLs accepted, shared by every producer) and the done-set (URLs whose outcome is
recorded, shared by every worker).

Fingerprints (:mod:`common.core.urls`) are spread over ``SEEN_BUCKETS`` small Redis sets
(``crawled_urls:{b}``, see :mod:`common.store.keys`) holding 64-bit integers, so every bucket stays in
Redis's compact intset encoding (set-max-intset-entries, 512 by default): about 8 bytes a URL
plus a small per-key overhead, where a set of hex strings costs 80+ bytes (NOTES.md #4).
Exact: the only false positive is a full 64-bit collision inside one bucket.

Every operation is one pipelined round trip for a whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from common.core.urls import Fingerprint, fingerprint
from common.store.keys import DONE_PREFIX, SEEN_PREFIX, claim_key, seen_bucket
from common.store.marks import DoneMark

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

    def add_many(self, fps: Sequence[Fingerprint]) -> list[bool]:
        """Mark fingerprints as seen; True for each one that was new (one round trip)."""
        if not fps:
            return []
        added = self._sadd_each(keys=[self.key(fp) for fp in fps],
                                args=[fp.member for fp in fps])
        return [flag == 1 for flag in added]

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
        found = self._sismember_each(keys=[self.key(fp) for fp in fps],
                                     args=[fp.member for fp in fps])
        return [bool(flag) for flag in found]

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

    def mark_for(self, url: str, nonce: str | None = None) -> DoneMark:
        """The done mark of ``url``'s outcome, or with a recrawl ``nonce`` that of one refresh."""
        fp = fingerprint(f"{url}#recrawl:{nonce}" if nonce else url)
        return DoneMark(self.fingerprints.key(fp), fp.member)

    def contains(self, mark: DoneMark) -> bool:
        return bool(self.client.sismember(mark.key, mark.member))

    def add(self, mark: DoneMark) -> None:
        """Record that a URL's outcome is final (once its dead letter is confirmed)."""
        self.client.sadd(mark.key, mark.member)

    def forget(self, urls: Sequence[str]) -> int:
        """Clear the marks of ``urls`` (a DLQ replay makes them new again). Returns how many."""
        return self.fingerprints.remove_many([fingerprint(url) for url in urls])


#: How long a claim keeps other pages off a URL; far longer than publishing a batch.
CLAIM_TTL_MS = 120_000

#: A producer's own token (``producer:{id}``, one per :class:`common.intake.producer.Producer`)
#: starts so: another producer takes such a claim over, a page never does.
PRODUCER_TOKEN_PREFIX = "producer:"

# The seen check and the claim in one atomic step, so no claim is taken on a URL that another
# caller marked seen (and dropped its claim) between a separate check and claim.
# KEYS[2i-1] the seen bucket of URL i, KEYS[2i] its claim:{fp}. ARGV[1] token, ARGV[2] ttl ms,
# ARGV[3] the token prefix the caller may take over ('' for none), ARGV[3+i] URL i's member.
# Returns 1 per URL the caller holds now (not seen; claimed by it, newly, again or taken
# over), else 0 (seen, or claimed by another).
CLAIM_UNSEEN_LUA = """
local held = {}
local prefix = ARGV[3]
for i = 1, #KEYS / 2 do
  local claim = KEYS[2 * i]
  if redis.call('SISMEMBER', KEYS[2 * i - 1], ARGV[3 + i]) == 1 then
    held[i] = 0
  elseif redis.call('SET', claim, ARGV[1], 'NX', 'PX', ARGV[2]) then
    held[i] = 1
  else
    local holder = redis.call('GET', claim)
    if holder == ARGV[1] or (prefix ~= '' and string.sub(holder, 1, #prefix) == prefix) then
      redis.call('SET', claim, ARGV[1], 'PX', ARGV[2])
      held[i] = 1
    else
      held[i] = 0
    end
  end
end
return held
"""

# Confirmed URLs: mark each seen, then drop its claim, in one step (no moment where a URL is
# neither seen nor claimed). KEYS as CLAIM_UNSEEN_LUA, ARGV[i] URL i's member.
SEEN_UNCLAIM_LUA = """
for i = 1, #KEYS / 2 do
  redis.call('SADD', KEYS[2 * i - 1], ARGV[i])
  redis.call('DEL', KEYS[2 * i])
end
return #KEYS / 2
"""

# Each KEYS[i] is claim:{fp}; ARGV[1] token. Drops the claims the token still holds.
RELEASE_LUA = """
local dropped = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then dropped = dropped + redis.call('DEL', key) end
end
return dropped
"""


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
                    take_over: str = "") -> list[bool]:
        """Claim for ``token`` each of ``fps`` that ``seen`` does not hold, in one atomic round
        trip; True for each one the caller holds now.

        Args:
            take_over: a token prefix whose claims the caller takes over (a producer:
                :data:`PRODUCER_TOKEN_PREFIX`); "" takes over none but the caller's own.
        """
        if not fps:
            return []
        keys: list[str] = []
        for fp in fps:
            keys += (seen.key(fp), claim_key(fp.hex))
        held = self._claim_unseen(keys=keys, args=[token, self.ttl_ms, take_over,
                                                   *(fp.member for fp in fps)])
        return [bool(flag) for flag in held]

    def mark_seen(self, seen: SeenSet, fps: Sequence[Fingerprint]) -> None:
        """Mark confirmed URLs seen and drop their claims (one atomic round trip)."""
        if not fps:
            return
        keys: list[str] = []
        for fp in fps:
            keys += (seen.key(fp), claim_key(fp.hex))
        self._seen_unclaim(keys=keys, args=[fp.member for fp in fps])

    def release(self, fps: Sequence[Fingerprint], token: str) -> int:
        """Drop the claims ``token`` still holds on ``fps`` (not published: failed, over
        budget), so a page may publish them at once. Returns how many."""
        if not fps:
            return 0
        return int(self._release(keys=[claim_key(fp.hex) for fp in fps], args=[token]))
