"""Per-domain rate limit shared by every worker, decided atomically in Redis.

One Lua script (:data:`ADMIT_LUA`) is the worker's first round trip for every URL. It:

1. returns the cached response when ``content:{url}`` holds one (a cache hit needs no permit);
2. else applies a *sliding log* limit: at most ``amount`` permits in any ``window + guard``
   milliseconds, timestamps from Redis's own clock (TIME), so worker clocks never matter;
3. when the domain is full, books the caller a future slot instead of a plain "no": the slot is
   ``max(when the oldest permit leaves the window, the domain's next free slot)`` and the next
   free slot moves on by ``(window + guard) / amount``. Parked URLs thus wake up staggered,
   one per free slot, instead of all at once.

Why a sliding log and not INCR/EXPIRE windows: fixed windows allow 2×amount across a window
boundary, and the limit is checked against the *site's* request log. Why not the ``limits``
library's moving window: we need "when will there be room" from the same atomic call, and the
cache lookup in it too, to stay at one round trip (NOTES.md #11). ``limits`` parses the notation.

The guard (RATE_LIMIT_GUARD, a fraction of the window kept free) absorbs server-side jitter:
permits are moved to their request's real send time (:func:`retime_permit`), so what is left
is the network and the site's own clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis

from common.core.config import Settings
from common.store.keys import content_key, rate_log_key, rate_slot_key
from common.store.marks import DoneMark, Permit, Retime

# KEYS[1] content:{url}   KEYS[2] ratelimit:{domain}   KEYS[3] ratelimit:{domain}:next
# KEYS[4] done:{b} (or "" to skip the check)
# ARGV[1] amount  ARGV[2] span_ms (window + guard)  ARGV[3] spacing_ms  ARGV[4] check cache (0/1)
# ARGV[5] the URL's done-set member  ARGV[6] the caller's booked slot (ms, 0 = none)
# Returns {cached_body or false, go, wait_ms, permit member, booked slot ms}
#   go: 1 = go now (a permit was logged under `permit member`), 0 = wait, 2 = already done
ADMIT_LUA = """
if KEYS[4] ~= '' and redis.call('SISMEMBER', KEYS[4], ARGV[5]) == 1 then
  return {false, 2, 0, '', 0}
end
if ARGV[4] == '1' then
  local cached = redis.call('GET', KEYS[1])
  if cached then return {cached, 1, 0, '', 0} end
end
local amount = tonumber(ARGV[1])
local span = tonumber(ARGV[2])
local spacing = tonumber(ARGV[3])
local booked = tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - span)
local count = redis.call('ZCARD', KEYS[2])
if count < amount then
  local member = t[1] .. t[2] .. ':' .. count
  redis.call('ZADD', KEYS[2], now, member)
  redis.call('PEXPIRE', KEYS[2], span * 2)
  return {false, 1, 0, member, 0}
end
local entry = redis.call('ZRANGE', KEYS[2], count - amount, count - amount, 'WITHSCORES')
local free_at = tonumber(entry[2]) + span + 1
if booked > 0 and booked <= now + spacing then
  -- The caller's booked slot is due but a late request still fills the window: it keeps its
  -- place and waits for that request to leave the window, instead of queueing again.
  return {false, 0, free_at - now, '', booked}
end
local slot = tonumber(redis.call('GET', KEYS[3]) or '0')
if slot < free_at then slot = free_at end
redis.call('SET', KEYS[3], slot + spacing, 'PX', slot + spacing - now + span)
return {false, 0, slot - now, '', slot}
"""


@dataclass(frozen=True)
class Rate:
    amount: int
    window_ms: int

    @property
    def per_second(self) -> float:
        return self.amount * 1000 / self.window_ms

    def stricter(self, other: Rate | None) -> Rate:
        if other is None:
            return self
        return other if other.per_second < self.per_second else self


@dataclass(frozen=True)
class Admission:
    go: bool
    wait_ms: int = 0
    cached: bytes | None = None
    already_done: bool = False  # the URL's outcome is already recorded: nothing to do
    permit: Permit | None = None  # the permit logged, to re-time it to the send time
    slot_ms: int = 0  # the slot booked for a denied caller (Redis clock)


class RateLimiter:
    """Rates per domain and the atomic admit call."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.default = Rate(*settings.rate_limit)
        self.overrides = tuple((host, Rate(*rate)) for host, rate in settings.rate_limit_overrides)
        self.guard = settings.rate_limit_guard
        self._admit = client.register_script(ADMIT_LUA)

    def rate_for(self, domain: str, crawl_delay_s: float | None = None) -> Rate:
        """The configured rate for ``domain``, made stricter by a robots.txt Crawl-delay."""
        rate = self.default
        for host, override in self.overrides:
            if domain == host or domain.endswith("." + host):
                rate = override
                break
        if crawl_delay_s and crawl_delay_s > 0:
            rate = rate.stricter(Rate(1, max(1, math.ceil(crawl_delay_s * 1000))))
        return rate

    def admit(self, domain: str, rate: Rate, cache_url: str | None = None,
              done: DoneMark | None = None, booked_ms: int = 0) -> Admission:
        """One round trip: already done, a cache hit, a permit now, or how long to wait for a
        booked slot. ``done`` is the URL's done mark, checked first;
        ``booked_ms`` the slot this URL was given when it was parked (it keeps its place)."""
        span_ms = rate.window_ms + math.ceil(rate.window_ms * self.guard)
        spacing_ms = math.ceil(span_ms / rate.amount)
        done_key, member = done or ("", 0)
        log_key = rate_log_key(domain)
        cached, go, wait_ms, permit, slot_ms = self._admit(
            keys=[content_key(cache_url or ""), log_key, rate_slot_key(domain), done_key],
            args=[rate.amount, span_ms, spacing_ms, 1 if cache_url else 0, member,
                  int(booked_ms)])
        if go == 2:
            return Admission(go=False, already_done=True)
        permit_member = permit.decode() if isinstance(permit, bytes) else permit
        return Admission(go=bool(go), wait_ms=int(wait_ms), cached=cached or None,
                         permit=Permit(log_key, permit_member) if permit_member else None,
                         slot_ms=int(slot_ms))


def retime_permit(pipe: redis.client.Pipeline, retime: Retime) -> None:
    """Move a permit's time in the log to when its request was really sent (ZADD XX GT).

    The window is then judged on send times: a request that left late (a busy thread, a
    loaded machine) cannot let the next one follow it too closely at the site.
    """
    permit, sent_at = retime
    if permit is not None and sent_at is not None:
        pipe.zadd(permit.log_key, {permit.member: int(sent_at * 1000)}, xx=True, gt=True)
