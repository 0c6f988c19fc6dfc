"""The recrawl schedule in Redis: per-URL next-visit times, taken under a fencing token, and
intervals that adapt to how often each page changes.

Keys (:mod:`common.store.keys`): ``schedule:due`` (ZSET url → next visit, Redis ms clock),
``schedule:inflight`` (HASH url → ``token:due_ms:taken_ms``), ``schedule:state`` (HASH url →
JSON ``{i, h, id, v, c}``). Every step is one Lua script, so it is atomic and one round trip:

* :meth:`Schedule.take` checks the lease (``schedule:lease`` must hold the caller's fencing
  token, :mod:`common.intake.recrawler`), takes over in-flight entries of an older token that
  are a lease old (a leader that died between taking and rescheduling), then moves due URLs to
  ``schedule:inflight``. A deposed leader takes nothing.
* :meth:`Schedule.settle` reschedules what was published (now + interval); :meth:`release`
  puts back what was not, at its old due time. Both touch only entries that still carry the
  caller's token, so a leader that lost its entries to a newer one changes nothing.
* :meth:`Schedule.learn` takes what result records say (the scheduler reads ``results`` as
  a sink, :class:`common.intake.recrawler.Learner`): for a scheduled URL, a record newer than
  the last one learned (stream ids; replays change nothing) is compared with the last visit. The rule is StormCrawler's AdaptiveScheduler:
  changed ``content_hash`` → ``i = floor((1 - SHRINK)·i + SHRINK·min)``; unchanged, or a 304
  / ``unchanged: true`` → ``i = ceil(i·(1 + GROWTH))``; both within
  [SCHEDULE_MIN_INTERVAL_S, SCHEDULE_MAX_INTERVAL_S], and the next visit moves to now + i.
  The first visit (nothing to compare), a cache hit, a record without ``content_hash`` and a
  dead letter leave the interval as it is.

Each published visit carries the nonce ``sched:{due_ms}`` (:attr:`Due.nonce`): the done mark
of one due time. A due time published twice (a leader killed after the broker confirmed and
before it rescheduled) is one outcome at the workers, never two.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from common.core.config import Settings
from common.core.errors import ConfigError, InvalidURL
from common.core.urls import canonicalize
from common.store.keys import (
    SCHEDULE_DUE,
    SCHEDULE_INFLIGHT,
    SCHEDULE_LEASE,
    SCHEDULE_STATE,
)

ADD_BATCH = 1000

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS[1] schedule:state  KEYS[2] schedule:due  KEYS[3] schedule:inflight
# ARGV[1] '1': replace the interval and next visit of URLs already scheduled, '0': keep them
# ARGV[2..] url, interval s, first visit after ms; ... Returns {added, updated}.
ADD_LUA = _NOW + """
local added, updated = 0, 0
for i = 2, #ARGV, 3 do
  local url, iv, at = ARGV[i], tonumber(ARGV[i + 1]), now + tonumber(ARGV[i + 2])
  local raw = redis.call('HGET', KEYS[1], url)
  local st = nil
  if not raw then
    st = {i = iv, v = 0, c = 0}
    added = added + 1
  elseif ARGV[1] == '1' then
    st = cjson.decode(raw)
    st.i = iv
    updated = updated + 1
  end
  if st then
    redis.call('HSET', KEYS[1], url, cjson.encode(st))
    if redis.call('HEXISTS', KEYS[3], url) == 0 then
      redis.call('ZADD', KEYS[2], string.format('%d', at), url)
    end
  end
end
return {added, updated}
"""

# KEYS[1] schedule:lease  KEYS[2] schedule:due  KEYS[3] schedule:inflight
# ARGV[1] fencing token  ARGV[2] most URLs to take  ARGV[3] age (ms) after which an older
# token's in-flight entry is taken over (the caller's own, left by a tick that failed, at
# once: its loop takes only after settling). Returns false when the lease is not the caller's,
# else {url, due_ms, url, due_ms, ...}.
TAKE_LUA = _NOW + """
local held = redis.call('GET', KEYS[1])
if not held or string.match(held, '^(%d+):') ~= ARGV[1] then return false end
local token, limit, stale = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out, n = {}, 0
local entry = ARGV[1] .. ':%s:' .. string.format('%d', now)
local flat = redis.call('HGETALL', KEYS[3])
for i = 1, #flat, 2 do
  if n >= limit then break end
  local tok, due, taken = string.match(flat[i + 1], '^(%d+):(%d+):(%d+)$')
  if tok and (tonumber(tok) == token or
              (tonumber(tok) < token and now - tonumber(taken) >= stale)) then
    redis.call('HSET', KEYS[3], flat[i], string.format(entry, due))
    out[#out + 1] = flat[i]
    out[#out + 1] = due
    n = n + 1
  end
end
if n < limit then
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
                         limit - n)
  for i = 1, #due, 2 do
    local at = string.format('%d', tonumber(due[i + 1]))
    redis.call('ZREM', KEYS[2], due[i])
    redis.call('HSET', KEYS[3], due[i], string.format(entry, at))
    out[#out + 1] = due[i]
    out[#out + 1] = at
  end
end
return out
"""

# KEYS[1] schedule:inflight  KEYS[2] schedule:due  KEYS[3] schedule:state
# ARGV[1] fencing token  ARGV[2] 'next' (published: now + interval) or 'back' (not published:
# its old due time)  ARGV[3..] urls. Only entries still carrying the token; a URL removed from
# the schedule meanwhile is dropped. Returns how many were settled.
SETTLE_LUA = _NOW + """
local n = 0
for i = 3, #ARGV, 1 do
  local url = ARGV[i]
  local entry = redis.call('HGET', KEYS[1], url)
  local tok, due = string.match(entry or '', '^(%d+):(%d+):')
  if tok == ARGV[1] then
    redis.call('HDEL', KEYS[1], url)
    local raw = redis.call('HGET', KEYS[3], url)
    if raw then
      local at = due
      if ARGV[2] == 'next' then at = string.format('%d', now + cjson.decode(raw).i * 1000) end
      redis.call('ZADD', KEYS[2], at, url)
    end
    n = n + 1
  end
end
return n
"""

# KEYS[1] schedule:state  KEYS[2] schedule:due
# ARGV[1] min s  ARGV[2] max s  ARGV[3] growth  ARGV[4] shrink
# ARGV[5..] url, results stream id, kind ('h': content_hash to compare, 'u': unchanged (304),
# 'n': nothing to compare), hash; ... Returns how many intervals were adapted.
LEARN_LUA = _NOW + """
local function newer(a, b)
  if not b then return true end
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not bm then return true end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
local lo, hi = tonumber(ARGV[1]), tonumber(ARGV[2])
local grow, shrink = tonumber(ARGV[3]), tonumber(ARGV[4])
local adapted = 0
for i = 5, #ARGV, 4 do
  local url, id, kind, hash = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local raw = redis.call('HGET', KEYS[1], url)
  local st = raw and cjson.decode(raw)
  if st and newer(id, st.id) then
    st.id = id
    st.v = (st.v or 0) + 1
    local changed = nil
    if kind == 'u' then
      changed = false
    elseif kind == 'h' then
      if st.h then changed = st.h ~= hash end
      st.h = hash
    end
    if changed ~= nil then
      local iv = st.i
      if changed then
        iv = math.floor((1 - shrink) * iv + shrink * lo)
        st.c = (st.c or 0) + 1
      else
        iv = math.ceil(iv * (1 + grow))
      end
      st.i = math.max(lo, math.min(hi, iv))
      redis.call('ZADD', KEYS[2], 'XX', string.format('%d', now + st.i * 1000), url)
      adapted = adapted + 1
    end
    redis.call('HSET', KEYS[1], url, cjson.encode(st))
  end
end
return adapted
"""


@dataclass(frozen=True)
class Due:
    """One due visit: the URL and the due time (ms) it was taken for."""

    url: str
    due_ms: int

    @property
    def nonce(self) -> str:
        """The recrawl nonce of this due time: one done mark, so one outcome, per due time."""
        return f"sched:{self.due_ms}"


@dataclass
class AddSummary:
    added: int = 0
    updated: int = 0
    kept: int = 0  # already scheduled, left as they were
    invalid: int = 0

    def merge(self, other: AddSummary) -> None:
        self.added += other.added
        self.updated += other.updated
        self.kept += other.kept
        self.invalid += other.invalid

    def line(self) -> str:
        return (f"added={self.added} updated={self.updated} kept={self.kept} "
                f"invalid={self.invalid}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Schedule:
    """The recrawl schedule of one Redis (see the module docstring)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        if settings.schedule_min_interval_s > settings.schedule_max_interval_s:
            raise ConfigError(f"SCHEDULE_MIN_INTERVAL_S={settings.schedule_min_interval_s} is "
                              f"above SCHEDULE_MAX_INTERVAL_S={settings.schedule_max_interval_s}")
        self.client = client
        self.settings = settings
        self.min_s = settings.schedule_min_interval_s
        self.max_s = settings.schedule_max_interval_s
        self._add = client.register_script(ADD_LUA)
        self._take = client.register_script(TAKE_LUA)
        self._settle = client.register_script(SETTLE_LUA)
        self._learn = client.register_script(LEARN_LUA)

    def clamp(self, interval_s: float) -> int:
        return max(self.min_s, min(self.max_s, int(interval_s)))

    def add(self, items: Iterable[tuple[str, int, float]], *, replace: bool) -> AddSummary:
        """Schedule ``(raw url, interval s, first visit after s)`` items, canonicalised, in
        batches of ADD_BATCH. ``replace``: a URL already scheduled gets the new interval and
        first visit; else it keeps its own (a learned interval survives a sitemap re-read)."""
        summary = AddSummary()
        batch: list[Any] = []
        for raw, interval_s, delay_s in items:
            try:
                url = canonicalize(raw, max_length=self.settings.max_url_length)
            except InvalidURL:
                summary.invalid += 1
                continue
            batch += [url, self.clamp(interval_s), int(delay_s * 1000)]
            if len(batch) >= 3 * ADD_BATCH:
                self._add_batch(batch, replace, summary)
                batch = []
        if batch:
            self._add_batch(batch, replace, summary)
        return summary

    def _add_batch(self, batch: list[Any], replace: bool, summary: AddSummary) -> None:
        added, updated = self._add(keys=[SCHEDULE_STATE, SCHEDULE_DUE, SCHEDULE_INFLIGHT],
                                   args=["1" if replace else "0", *batch])
        summary.added += added
        summary.updated += updated
        summary.kept += len(batch) // 3 - added - updated

    def take(self, token: int, limit: int, stale_ms: int) -> list[Due] | None:
        """Move up to ``limit`` due URLs (first those an older token left in flight at least
        ``stale_ms`` ago) into ``schedule:inflight`` under ``token``. None: the lease is not
        ``token``'s (deposed), nothing was taken."""
        flat = self._take(keys=[SCHEDULE_LEASE, SCHEDULE_DUE, SCHEDULE_INFLIGHT],
                          args=[token, limit, stale_ms])
        if flat is None:
            return None
        return [Due(_text(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]

    def settle(self, token: int, urls: list[str]) -> int:
        """Published: next visit at now + interval. Returns how many were still ``token``'s."""
        return self._settle_as(token, "next", urls)

    def release(self, token: int, urls: list[str]) -> int:
        """Not published: back to their due time, taken again at the next tick."""
        return self._settle_as(token, "back", urls)

    def _settle_as(self, token: int, mode: str, urls: list[str]) -> int:
        if not urls:
            return 0
        return int(self._settle(keys=[SCHEDULE_INFLIGHT, SCHEDULE_DUE, SCHEDULE_STATE],
                                args=[token, mode, *urls]))

    def learn(self, observations: Iterable[tuple[str, str, str, str]]) -> int:
        """Adapt intervals from ``(url, results stream id, kind, hash)`` observations in
        stream order (kind: ``h`` a content_hash, ``u`` unchanged, ``n`` nothing to compare).
        Returns how many intervals changed; unscheduled URLs are ignored."""
        args = [value for item in observations for value in item]
        if not args:
            return 0
        s = self.settings
        return int(self._learn(keys=[SCHEDULE_STATE, SCHEDULE_DUE],
                               args=[self.min_s, self.max_s, s.schedule_growth,
                                     s.schedule_shrink, *args]))

    def remove(self, raw_urls: Iterable[str]) -> int:
        """Unschedule URLs (one in flight is published once more, then dropped)."""
        urls = [canonicalize(u, max_length=self.settings.max_url_length) for u in raw_urls]
        if not urls:
            return 0
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(SCHEDULE_STATE, *urls)
        pipe.zrem(SCHEDULE_DUE, *urls)
        return int(pipe.execute()[0])

    def entry(self, raw_url: str) -> dict[str, Any] | None:
        """One URL's schedule: interval_s, next_visit (epoch s), in_flight, visits, changes."""
        url = canonicalize(raw_url, max_length=self.settings.max_url_length)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(SCHEDULE_STATE, url)
        pipe.zscore(SCHEDULE_DUE, url)
        pipe.hexists(SCHEDULE_INFLIGHT, url)
        raw, score, in_flight = pipe.execute()
        if raw is None:
            return None
        state = orjson.loads(raw)
        return {"url": url, "interval_s": int(state["i"]),
                "next_visit": None if score is None else score / 1000,
                "in_flight": bool(in_flight), "visits": int(state.get("v", 0)),
                "changes": int(state.get("c", 0))}

    def status(self) -> dict[str, Any]:
        """The whole schedule: scheduled, due now, in flight, next visit, the lease holder."""
        now_s, now_us = self.client.time()
        now_ms = now_s * 1000 + now_us // 1000
        pipe = self.client.pipeline(transaction=False)
        pipe.hlen(SCHEDULE_STATE)
        pipe.zcount(SCHEDULE_DUE, "-inf", now_ms)
        pipe.hlen(SCHEDULE_INFLIGHT)
        pipe.zrange(SCHEDULE_DUE, 0, 0, withscores=True)
        pipe.get(SCHEDULE_LEASE)
        scheduled, due, in_flight, first, lease = pipe.execute()
        return {"scheduled": scheduled, "due": due, "in_flight": in_flight,
                "next_visit_in_s": round(max(0.0, first[0][1] - now_ms) / 1000, 1)
                if first else None,
                "leader": _text(lease) if lease else None}
