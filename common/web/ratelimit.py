"""Per-domain rate limit shared by every worker, decided atomically in Redis.

One Lua script (:data:`ADMIT_LUA`) is the worker's first round trip for every URL. It:

1. returns the cached response when ``content:{url}`` holds one (a cache hit needs no permit);
2. else applies a *sliding log* limit: at most ``amount`` permits in any ``window + guard``
   milliseconds, timestamps from Redis's own clock (TIME), so worker clocks never matter;
3. when the domain is full, books the caller a future slot instead of a plain "no": the slot is
   ``max(when the oldest permit leaves the window, the domain's next free slot)`` and the next
   free slot moves on by ``(window + guard) / amount``. Parked URLs thus wake up staggered,
   one per free slot, instead of all at once; never before it, and a page queues behind them.

Why a sliding log and not INCR/EXPIRE windows: fixed windows allow 2×amount across a window
boundary, and the limit is checked against the *site's* request log. Why not the ``limits``
library's moving window: we need "when will there be room" and the cache lookup from the same
atomic call: one round trip (NOTES.md #11). ``limits`` parses the notation.
The guard (RATE_LIMIT_GUARD, a fraction of the window kept free) absorbs server-side jitter:
permits are moved to their request's real send time (:func:`retime_permit`).
The same call applies the domain's adaptive throttle (common/web/throttle.py): a blocked domain
books slots from the block's end on; a slowed one lets one request through per
``spacing / rate`` while slots are still booked at the configured spacing (a URL that finds the
window full books the next free slot), so the configured rate is back the moment the rate is;
and it enforces MAX_WAIT_S: a URL whose slot would come later than its wait allows books
nothing and is told so (go = 3). A robots.txt Crawl-delay is capped (ROBOTS_MAX_CRAWL_DELAY_S).

A job's message (issue 26) has its job's state decided first, in the same call: the script
reads ``job:{name}`` (state, run) and ``jobs:version``. Its run running: as above, and the
version comes back (the worker's job book reloads when it moved). Paused, same run: the verdict
"paused" before anything is booked (the worker parks the message in ``job:{name}:parked``).
Anything else (cancelled, finished, an older run): "cancelled", the message's done mark set and
``cancelled`` added to its run's counters only when the mark is new, so a redelivery is not
counted twice. A deleted job's message marks and counts nothing ("deleted"). The default job's
call has no job keys and runs no job command. On a Redis Cluster: :func:`admit_keys`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import redis

from common.core.config import Settings
from common.store.hot_script import HotScript
from common.store.keys import (
    JOBS_VERSION,
    THROTTLED,
    content_key,
    job_key,
    job_run_key,
    rate_log_key,
    rate_slot_key,
    throttle_key,
)
from common.store.marks import DoneMark, Permit, Retime
from common.store.slots import GIVEN_LUA, absent, domain_shard, part, refuse_on_cluster
from common.web.throttle import (
    FUNCTIONS_LUA,
    Signal,
    Throttle,
    ThrottleState,
    describe,
    read_states,
)


class JobRun(Protocol):
    """A message's job run (common.jobs.registry.JobRef; the jobs room is above this one)."""

    @property
    def name(self) -> str: ...

    @property
    def run(self) -> int: ...

# KEYS[1] content:{url}   KEYS[2] ratelimit:{domain}   KEYS[3] ratelimit:{domain}:next
# KEYS[4] done:{b} (or "" to skip the check)   KEYS[5] throttle:{domain}   KEYS[6] throttled
# ARGV[1] amount  ARGV[2] span_ms (window + guard)  ARGV[3] spacing_ms  ARGV[4] check cache (0/1)
# ARGV[5] the URL's done-set member  ARGV[6] its booked slot (ms, 0 = none, -1 = none: queue)
# ARGV[7] how long the URL may still wait (ms, -1 = no limit)  ARGV[8..12] the throttle's
# A job's message only (the default job's call has none of these, and pays for none):
# KEYS[7] job:{name}  KEYS[8] jobs:version  KEYS[9] job:{name}:run:{run}  ARGV[13] its run
# Last, when the page's cookie jar is wanted (7 or 10 keys in all): cookies:{job}|{site}|0.0
# Returns {cached_body or false, go, wait_ms, permit member, booked slot ms, throttle or false,
#          jobs:version (a job's message only), job verdict (go = 4 only),
#          the jar's fields and values (go = 1 with a jar key only)}
#   go: 1 = go now (a permit was logged under `permit member`), 0 = wait, 2 = already done,
#       3 = its slot would come after its wait limit (nothing booked), 4 = its job's run is not
#       running: "paused" (nothing booked) or "cancelled" (its done mark set; counted
#       `cancelled` in its run's counters when newly set)
ADMIT_LUA = GIVEN_LUA + """
local jobv, verdict
if ARGV[13] then
  local job = redis.call('HMGET', KEYS[7], 'state', 'run')
  jobv = redis.call('GET', KEYS[8]) or '0'
  if job[1] ~= 'running' or job[2] ~= ARGV[13] then
    verdict = 'cancelled'
    if job[1] == 'paused' and job[2] == ARGV[13] then verdict = 'paused'
    elseif not job[1] then verdict = 'deleted' end
  end
end
local jar_key = (#KEYS == 7 or #KEYS == 10) and KEYS[#KEYS]
if given(KEYS[4]) and redis.call('SISMEMBER', KEYS[4], ARGV[5]) == 1 then
  return {false, 2, 0, '', 0, jobv and false, jobv}
end
if verdict then
  -- A deleted job marks and counts nothing: its name and run numbers may be taken again.
  if verdict == 'cancelled' and given(KEYS[4]) and redis.call('SADD', KEYS[4], ARGV[5]) == 1
  then redis.call('HINCRBY', KEYS[9], 'cancelled', 1) end
  return {false, 4, 0, '', 0, false, jobv, verdict}
end
if ARGV[4] == '1' then
  local cached = redis.call('GET', KEYS[1])
  if cached then return {cached, 1, 0, '', 0, jobv and false, jobv} end
end
local amount = tonumber(ARGV[1])
local span = tonumber(ARGV[2])
local spacing = tonumber(ARGV[3])
local queued, booked = ARGV[6] == '-1', math.max(tonumber(ARGV[6]), 0)
local wait_left = tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state, blocked_until, rate = false, 0, 1
-- A healthy domain (no state, nothing to report) pays one EXISTS; the throttle's functions
-- are only defined (a closure each, per call) for a domain that has a state.
if ARGV[11] ~= '0' or redis.call('EXISTS', KEYS[5]) == 1 then
""" + FUNCTIONS_LUA + """
  state, blocked_until, rate = throttle_admit(KEYS[5], KEYS[6], now, ARGV, 8)
end
-- A slowed domain: one request per spacing / rate besides the window (the gate), no bursts;
-- slots still booked at the configured spacing (the rate is back at once), no stampede.
local gate = 0
if rate < 1 then gate = math.ceil(spacing / rate) end
local keep = math.max(span, gate)
if blocked_until > now then  -- a blocked domain: slots from the block's end on, staggered
  local slot = tonumber(redis.call('GET', KEYS[3]) or '0')
  if slot < blocked_until then slot = blocked_until end
  if wait_left >= 0 and slot - now > wait_left then
    return {false, 3, slot - now, '', 0, state, jobv}
  end
  redis.call('SET', KEYS[3], slot + spacing, 'PX', slot + spacing - now + span)
  return {false, 0, slot - now, '', slot, state, jobv}
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - keep)
local count = redis.call('ZCARD', KEYS[2])  -- the window: (now - span, now]
local in_span = count
if keep > span then in_span = redis.call('ZCOUNT', KEYS[2], '(' .. (now - span), '+inf') end
local free_at = 0
if in_span >= amount then
  local entry = redis.call('ZRANGE', KEYS[2], count - amount, count - amount, 'WITHSCORES')
  free_at = tonumber(entry[2]) + span  -- exactly: a millisecond more is 30 ms a 30 s crawl
end
if gate > 0 and count > 0 then
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  free_at = math.max(free_at, tonumber(last[2]) + gate)
end
local slot = 0  -- a page with no slot yet (booked = -1) queues behind the booked URLs
if booked > now then free_at = math.max(free_at, booked) end  -- never before its slot
if queued and free_at <= now then slot = tonumber(redis.call('GET', KEYS[3]) or '0') end
if free_at <= now and slot <= now then
  local member = t[1] .. t[2] .. ':' .. count
  redis.call('ZADD', KEYS[2], now, member)
  redis.call('PEXPIRE', KEYS[2], keep * 2)
  if jar_key then  -- the page's cookie jar, read in this round trip (common/web/sessions.py)
    return {false, 1, 0, member, 0, state, jobv or false, false, redis.call('HGETALL', jar_key)}
  end
  return {false, 1, 0, member, 0, state, jobv}
end
if booked > 0 and (rate >= 1 or booked > now) then
  -- It keeps its place (on a slowed domain, full by design, one due books the next one).
  return {false, 0, free_at - now, '', booked, state, jobv}
end
slot = math.max(tonumber(redis.call('GET', KEYS[3]) or '0'), free_at)
if wait_left >= 0 and slot - now > wait_left then
  return {false, 3, slot - now, '', 0, state, jobv}
end
redis.call('SET', KEYS[3], slot + spacing, 'PX', slot + spacing - now + span)
return {false, 0, slot - now, '', slot, state, jobv}
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
    too_late: bool = False  # its slot would come after its wait limit (MAX_WAIT_S)
    throttle: ThrottleState | None = None  # the domain's throttle, when it has one
    #: A job's message whose run is not running: "paused", or "cancelled" (its done mark
    #: set and counted; also an older run, a finished one), or "deleted" (nothing marked).
    job_verdict: str = ""
    jobs_version: int | None = None  # jobs:version, with every job's admission
    #: The cookie jar asked for (``jar_key``), field -> value, when the page may go now.
    jar: dict[bytes, bytes] | None = None


#: A rendered page's own requests to its site (scripts, XHR...), logged as permits at once
#: (common/web/renderer.py): the next pages of the site wait for them to leave the window.
CHARGE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, tonumber(ARGV[1]) do
  redis.call('ZADD', KEYS[1], now, t[1] .. t[2] .. ':sub' .. i)
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
"""
#: The most sub-requests one page is charged for (a page making thousands is capped by its
#: time; its site is protected by the wait the first thousand cost).
MAX_CHARGE = 1000


def admit_keys(domain: str, cache_url: str | None, done: DoneMark | None, job: JobRun | None,
               jar_key: str | None) -> list[str]:
    """:data:`ADMIT_LUA`'s KEYS; on a Redis Cluster all in the domain's shard (a job's message
    is refused there: its job keys are fleet-wide)."""
    shard = domain_shard(domain)
    keys = [content_key(cache_url) if cache_url else absent(shard), rate_log_key(domain),
            rate_slot_key(domain), done.key if done else absent(shard), throttle_key(domain),
            part(THROTTLED, shard)]
    if job is not None:
        refuse_on_cluster("a job's message")
        keys += [job_key(job.name), JOBS_VERSION, job_run_key(job.name, job.run)]
    return keys if jar_key is None else [*keys, jar_key]


class RateLimiter:
    """Rates per domain and the atomic admit call."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.default = Rate(*settings.rate_limit)
        self.overrides = tuple((host, Rate(*rate)) for host, rate in settings.rate_limit_overrides)
        self.guard = settings.rate_limit_guard
        self.max_crawl_delay_s = settings.robots_max_crawl_delay_s
        self.throttle = Throttle(settings)
        self._admit = HotScript(client, ADMIT_LUA)  # every page: redis-py's layers skipped
        self._charge = client.register_script(CHARGE_LUA)

    def rate_for(self, domain: str, crawl_delay_s: float | None = None) -> Rate:
        """The configured rate for ``domain``, made stricter by a robots.txt Crawl-delay
        (capped at ROBOTS_MAX_CRAWL_DELAY_S: ``Crawl-delay: 31536000`` is not a year)."""
        rate = self.default
        for host, override in self.overrides:
            if domain == host or domain.endswith("." + host):
                rate = override
                break
        if crawl_delay_s and crawl_delay_s > 0:
            delay_s = min(crawl_delay_s, self.max_crawl_delay_s)
            rate = rate.stricter(Rate(1, max(1, math.ceil(delay_s * 1000))))
        return rate

    def admit(self, domain: str, rate: Rate, cache_url: str | None = None,
              done: DoneMark | None = None, booked_ms: int = 0, max_wait_ms: int = -1,
              job: JobRun | None = None, jar_key: str | None = None,
              queue: bool = False) -> Admission:
        """One round trip: already done, a cache hit, a permit now, or how long to wait for a
        booked slot. ``done`` is the URL's done mark, checked first;
        ``booked_ms`` the slot this URL was given when it was parked (it keeps its place,
        never going before it); ``queue``: without one, it queues behind the booked URLs;
        ``max_wait_ms`` how long it may still wait (-1: no limit), else ``too_late``.
        ``job``: the message's job run (None: the default job, which adds nothing to the
        call); its state decides first (``job_verdict``), and ``jobs_version`` comes back.
        ``jar_key``: a cookie jar read in the same call when the page may go now
        (``Admission.jar``), so cookies cost the page no round trip of its own."""
        span_ms = rate.window_ms + math.ceil(rate.window_ms * self.guard)
        spacing_ms = math.ceil(span_ms / rate.amount)
        keys = admit_keys(domain, cache_url, done, job, jar_key)
        args = [rate.amount, span_ms, spacing_ms, 1 if cache_url else 0, done.member if done else 0,
                int(booked_ms) if booked_ms or not queue else -1, int(max_wait_ms),
                *self.throttle.admit_args(domain), *([job.run] if job is not None else [])]
        reply = self._admit(keys=keys, args=args)
        cached, go, wait_ms, permit, slot_ms = reply[:5]
        version = int(reply[6]) if len(reply) > 6 and reply[6] is not None else None
        if go == 2:
            return Admission(go=False, already_done=True, jobs_version=version)
        if go == 4:
            verdict = reply[7].decode() if isinstance(reply[7], bytes) else reply[7]
            return Admission(go=False, job_verdict=verdict, jobs_version=version)
        permit_member = permit.decode() if isinstance(permit, bytes) else permit
        return Admission(go=go == 1, wait_ms=int(wait_ms), cached=cached or None,
                         permit=Permit(keys[1], permit_member) if permit_member else None,
                         slot_ms=int(slot_ms), too_late=go == 3,
                         throttle=ThrottleState.from_reply(reply[5]) if len(reply) > 5 else None,
                         jobs_version=version,
                         jar=_pairs(reply[8]) if len(reply) > 8 else None)

    def charge(self, domain: str, requests: int) -> None:
        """Count ``requests`` more requests to ``domain`` now (a rendered page's scripts and
        XHR): they fill its window as permits do, so the site's rate holds over a crawl."""
        if requests <= 0:
            return
        rate = self.rate_for(domain)
        span_ms = rate.window_ms + math.ceil(rate.window_ms * self.guard)
        self._charge(keys=[rate_log_key(domain)], args=[min(requests, MAX_CHARGE), span_ms * 2])

    def report(self, pipe: redis.client.Pipeline, url: str, failure: Signal,
               retime: Retime | None) -> None:
        """Add a failed attempt's bookkeeping to its pipeline (no extra round trip): its
        permit moved to the send time, and the domain's throttle told of a 429, a 503, a
        Retry-After or a timeout (common/web/throttle.py)."""
        if retime is not None:
            retime_permit(pipe, retime)
        self.throttle.report(pipe, url, failure, retime)

    def throttled(self) -> list[dict]:
        """The status view's rows: each throttled domain, its rate or block, and why."""
        rows = []
        for domain, state, now_ms in read_states(self.client):
            row = describe(state, now_ms, self.rate_for(domain).per_second)
            if row["active"]:
                rows.append({"domain": domain, **row})
        return rows


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """HGETALL's flat reply from inside a script, as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def retime_permit(pipe: redis.client.Pipeline, retime: Retime) -> None:
    """Move a permit's time in the log to when its request was really sent (ZADD XX GT).

    The window is then judged on send times: a request that left late (a busy thread, a
    loaded machine) cannot let the next one follow it too closely at the site.
    """
    permit, sent_at = retime
    if permit is not None and sent_at is not None:
        pipe.zadd(permit.log_key, {permit.member: int(sent_at * 1000)}, xx=True, gt=True)
