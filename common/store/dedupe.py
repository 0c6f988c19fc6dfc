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

# Each KEYS[i] is claim:{fp}. ARGV[1] token, ARGV[2] ttl ms. Returns 1 per key the caller
# holds now (newly claimed, or already claimed with the same token), else 0.
CLAIM_LUA = """
local held = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) then
    held[i] = 1
  elseif redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    held[i] = 1
  else
    held[i] = 0
  end
end
return held
"""


class Claims:
    """Short-lived claims on URLs being published, so that two pages linking the same new URL
    at the same moment publish it once (crawl mode). The token names the claiming page: the
    same page, redelivered after its worker died mid-publish, takes its claims over."""

    def __init__(self, client: redis.Redis, ttl_ms: int = CLAIM_TTL_MS) -> None:
        self.client = client
        self.ttl_ms = ttl_ms
        self._claim = client.register_script(CLAIM_LUA)

    def take(self, fps: Sequence[Fingerprint], token: str) -> list[bool]:
        """Claim ``fps`` for ``token``; True for each one the caller holds (one round trip)."""
        if not fps:
            return []
        held = self._claim(keys=[claim_key(fp.hex) for fp in fps], args=[token, self.ttl_ms])
        return [bool(flag) for flag in held]

    def keys(self, fps: Sequence[Fingerprint]) -> list[str]:
        return [claim_key(fp.hex) for fp in fps]
