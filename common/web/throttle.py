"""Adaptive per-domain throttle, shared by the fleet in Redis and applied by the admit script.

The rate limit (common/web/ratelimit.py) is the ceiling a domain is never asked above; this
module lowers it while the site pushes back, for every worker at once:

* **Block.** A 429 or a 503, or a ``Retry-After`` on any transient answer (408, 429, 5xx),
  blocks the whole domain: until the ``Retry-After`` time (capped at RETRY_AFTER_MAX_S), else
  on a curve: THROTTLE_BLOCK_START_S (60 s), times THROTTLE_BLOCK_FACTOR (2) per new incident,
  at most THROTTLE_BLOCK_MAX_S (a day), plus up to THROTTLE_JITTER (10%) at random, the curve
  forgotten after THROTTLE_FORGIVE_S (30 min) without a bad answer — StormCrawler's #1984 and
  Nutch's NUTCH-2946 curve. Answers to requests sent before the block ended do not escalate
  it again: requests in flight when a site starts refusing are one incident, not many.
  A block does not lower the rate: once it is over the domain gets its configured rate (the
  curve answers a site that refuses again), and URLs parked meanwhile booked their slots from
  the block's end at the configured spacing.
* **Rate (AIMD).** A timeout, or an answer slower than THROTTLE_SLOW_FACTOR × the domain's
  recent median (and than THROTTLE_SLOW_MIN_S), multiplies the domain's rate by
  THROTTLE_DECREASE (once per round: only answers to requests sent after the last cut cut
  again); each healthy answer (to a request sent after the last cut) adds THROTTLE_INCREASE of
  the configured rate back, never above
  it, never below THROTTLE_RATE_FLOOR of it. The state expires by itself THROTTLE_FORGIVE_S
  after the last bad answer, so a recovered site gets its configured rate back even if nobody
  fetches from it meanwhile. The slowed rate gates the permits only: slots are still booked at
  the configured spacing (common/web/ratelimit.py), so the backlog is not scheduled at the
  slowed pace, and the configured rate is back the moment the rate is.

Round trips: none added. The admit script reads ``throttle:{domain}`` (one HMGET of a missing
key for a healthy domain) and applies what the worker learnt since its last admit of that
domain (healthy answers, a slow answer); a 429/503/timeout is reported by :data:`REPORT_LUA`
inside the failure's existing pipeline (common/work/giving_up.py ``failed``). Each worker
keeps its own latency sample per domain (the last :data:`SAMPLES` answers) for the median.
"""

from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from common.core.backoff import parse_retry_after_s
from common.core.config import Settings
from common.core.urls import domain_of
from common.store.keys import THROTTLED, throttle_key
from common.store.marks import Retime
from common.store.slots import domain_shard, part, parts
from common.web.fetch import FetchResult

logger = logging.getLogger(__name__)

BLOCK_STATUSES = frozenset({429, 503})
SAMPLES = 20  # answers per domain the median is taken over (per worker)
MIN_SAMPLES = 5  # fewer: no median yet, nothing is judged slow
MAX_DOMAINS = 10_000  # domains a worker keeps samples for (least recently used dropped)
MIN_FLOOR = 0.001  # THROTTLE_RATE_FLOOR=0 would mean "never": one request per 1000 slots

# Shared by the admit script (ratelimit.ADMIT_LUA) and REPORT_LUA.
# throttle:{domain} HASH: level (incidents on the curve), until (block end, ms), rate (fraction
# of the configured rate), cut_at (ms of the last decrease), last_bad (ms), since (ms the
# episode began), reason, status. PEXPIRE: the block left + forgive. ``throttled`` ZSET indexes
# the domains with a state (score: when it expires) for the status view.
# config: "start_ms factor max_ms forgive_ms decrease floor increase".
FUNCTIONS_LUA = """
local function throttle_config(text)
  local c = {}
  for x in string.gmatch(text, '%S+') do c[#c + 1] = tonumber(x) end
  return c
end
local function throttle_report(key, index, domain, now, c, kind, sent, retry_ms, jitter,
                               status, reason)
  local s = redis.call('HMGET', key, 'level', 'until', 'rate', 'cut_at', 'last_bad', 'since')
  local level, untl = tonumber(s[1]) or 0, tonumber(s[2]) or 0
  local rate, cut_at = tonumber(s[3]) or 1, tonumber(s[4]) or 0
  local last_bad, since = tonumber(s[5]) or 0, tonumber(s[6]) or 0
  if untl <= now and now - last_bad > c[4] then level = 0 end
  if since == 0 or (untl <= now and rate >= 1) then since = now end
  if kind == 'block' then
    local ms = retry_ms
    local fresh = (sent > 0 and sent >= untl) or (sent == 0 and untl <= now)
    if ms <= 0 and fresh then
      level = level + 1
      ms = math.floor(math.min(c[1] * c[2] ^ (level - 1), c[3]) * (1 + jitter))
    end
    if ms > 0 and now + ms > untl then untl = now + ms end
  end
  if kind == 'cut' and (sent == 0 or sent >= cut_at) then
    rate = math.max(c[6], rate * c[5])
    cut_at = now
  end
  redis.call('HSET', key, 'level', level, 'until', untl, 'rate', rate, 'cut_at', cut_at,
             'last_bad', now, 'since', since, 'status', status, 'reason', reason)
  local ttl = math.max(untl - now, 0) + c[4]
  redis.call('PEXPIRE', key, ttl)
  redis.call('ZADD', index, now + ttl, domain)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', now)
  return untl
end
-- argv[i] domain, [i+1] config, [i+2] healthy answers since this worker's last admit ('0', or
-- 'count oldest_send_ms'), [i+3] a slow answer's send time (ms, '0': none), [i+4] its reason.
-- Returns the state for the reply (or false), the block end (ms, 0: none), the rate fraction.
local function throttle_admit(key, index, now, argv, i)
  if argv[i + 3] ~= '0' then
    throttle_report(key, index, argv[i], now, throttle_config(argv[i + 1]), 'cut',
                    tonumber(argv[i + 3]), 0, 0, '', argv[i + 4])
  end
  local s = redis.call('HMGET', key, 'rate', 'until', 'reason', 'status', 'since', 'cut_at')
  if not s[1] then return false, 0, 1 end
  local rate, untl = tonumber(s[1]), tonumber(s[2])
  local ok, ok_sent = string.match(argv[i + 2], '^(%d+) ?(%d*)$')
  ok, ok_sent = tonumber(ok) or 0, tonumber(ok_sent) or 0
  -- Answers to requests sent before the last cut do not undo it: as a timeout sent before
  -- it does not cut again, they were answered before the site slowed (one round each way).
  if ok > 0 and rate < 1 and ok_sent >= (tonumber(s[6]) or 0) then
    rate = math.min(1, rate + ok * throttle_config(argv[i + 1])[7])
    redis.call('HSET', key, 'rate', rate)
  end
  return {tostring(rate), untl, math.max(untl - now, 0), s[3], s[4], s[5]}, untl, rate
end
"""

# KEYS[1] throttle:{domain}  KEYS[2] throttled
# ARGV[1] domain  ARGV[2] config  ARGV[3] kind ('block' or 'cut')  ARGV[4] send time ms (0: ?)
# ARGV[5] Retry-After ms (0: none, the curve)  ARGV[6] jitter drawn  ARGV[7] status  ARGV[8] why
REPORT_LUA = FUNCTIONS_LUA + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return throttle_report(KEYS[1], KEYS[2], ARGV[1], now, throttle_config(ARGV[2]), ARGV[3],
                       tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7],
                       ARGV[8])
"""


@dataclass(frozen=True)
class ThrottleState:
    """A domain's throttle as Redis holds it (times on Redis's clock, ms)."""

    rate: float  # fraction of the configured rate
    blocked_until_ms: int
    blocked_ms: int  # block left when it was read
    reason: str
    status: int | None
    since_ms: int

    @property
    def active(self) -> bool:
        """Blocked, or slower than the configured rate."""
        return self.blocked_ms > 0 or self.rate < 1

    @classmethod
    def from_reply(cls, reply: Any) -> ThrottleState | None:
        if not reply:
            return None
        rate, until, left, reason, status, since = (
            v.decode() if isinstance(v, bytes) else v for v in reply)
        return cls(float(rate), int(until), int(left), reason or "",
                   int(status) if status else None, int(since or 0))


class Signal(Protocol):
    """A failed attempt as the processor describes it (common/work/outcome.Failure)."""

    reason: str
    status: int | None
    retry_after: str | None


@dataclass
class _Seen:
    """What one worker learnt about a domain since its last admit there."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    healthy: int = 0
    healthy_sent_ms: int = 0  # the oldest send time of those ``healthy`` answers
    slow: tuple[int, str] | None = None  # (send time ms, why)


class Throttle:
    """The worker's side: its latency samples, the feedback for the next admit, reports."""

    def __init__(self, settings: Settings) -> None:
        floor = max(settings.throttle_rate_floor, MIN_FLOOR)
        self.config = " ".join(str(v) for v in (
            round(settings.throttle_block_start_s * 1000), settings.throttle_block_factor,
            round(settings.throttle_block_max_s * 1000), round(settings.throttle_forgive_s * 1000),
            settings.throttle_decrease, floor, settings.throttle_increase))
        self.jitter = settings.throttle_jitter
        self.retry_after_max_s = settings.retry_after_max_s
        self.slow_factor = settings.throttle_slow_factor
        self.slow_min_ms = settings.throttle_slow_min_s * 1000
        self.worker_id = settings.worker_id
        self._lock = threading.Lock()
        self._domains: OrderedDict[str, _Seen] = OrderedDict()

    def admit_args(self, domain: str) -> list[Any]:
        """The admit script's throttle arguments, with (and clearing) what this worker learnt
        about ``domain`` since its last admit there."""
        with self._lock:
            seen = self._domains.get(domain)
            if seen is None:
                return [domain, self.config, 0, 0, ""]
            healthy, slow = seen.healthy, seen.slow
            seen.healthy, seen.slow = 0, None
        return [domain, self.config, f"{healthy} {seen.healthy_sent_ms}" if healthy else 0,
                slow[0] if slow else 0, slow[1] if slow else ""]

    def observe(self, domain: str, response: FetchResult) -> None:
        """Note an answer (no Redis call): healthy, or slow against the domain's median.
        Transient statuses are reported by :meth:`report` with their failure."""
        if response.status in (408, 429) or response.status >= 500:
            return
        elapsed = response.elapsed_ms
        with self._lock:
            seen = self._domains.get(domain)
            if seen is None:
                seen = self._domains[domain] = _Seen()
                if len(self._domains) > MAX_DOMAINS:
                    self._domains.popitem(last=False)
            else:
                self._domains.move_to_end(domain)
            median = statistics.median(seen.samples) if len(seen.samples) >= MIN_SAMPLES else None
            seen.samples.append(elapsed)
            sent_ms = int((response.sent_at or time.time() - elapsed / 1000) * 1000)
            if median is not None and elapsed > max(self.slow_factor * median, self.slow_min_ms):
                seen.slow = (sent_ms, f"slow: {elapsed / 1000:.2f} s, median {median / 1000:.2f} s")
                logger.info("throttle %s: %s %s (worker %s)", domain, seen.slow[1], response.url,
                            self.worker_id)
            else:
                if not seen.healthy or sent_ms < seen.healthy_sent_ms:
                    seen.healthy_sent_ms = sent_ms
                seen.healthy += 1

    def report(self, pipe: redis.client.Pipeline, url: str, failure: Signal,
               retime: Retime | None) -> bool:
        """Add the throttle report of a failed attempt to ``pipe`` (the failure's own round
        trip), if it is one: a block (429, 503, a Retry-After) or a cut (a timeout)."""
        status, kind, retry_ms = failure.status, None, 0
        asked = parse_retry_after_s(failure.retry_after) if status else None
        if status in BLOCK_STATUSES or (asked and asked > 0):
            kind = "block"
            if asked and asked > 0:
                retry_ms = round(min(asked, self.retry_after_max_s) * 1000)
        elif failure.reason == "fetch_timeout":
            kind = "cut"
        if kind is None:
            return False
        sent_at = retime.sent_at if retime is not None else None
        why = failure.reason + (f", Retry-After {retry_ms / 1000:g} s" if retry_ms else "")
        domain = domain_of(url)
        logger.info("throttle %s: %s after %s %s (worker %s)", domain,
                    "blocked" if kind == "block" else "slowed", why, url, self.worker_id)
        index = part(THROTTLED, domain_shard(domain))  # on a cluster the domain's shard's
        pipe.eval(REPORT_LUA, 2, throttle_key(domain), index, domain, self.config, kind,
                  int(sent_at * 1000) if sent_at else 0, retry_ms,
                  random.uniform(0, self.jitter), status or "", why)
        return True


def read_states(client: redis.Redis, limit: int = 50) -> list[tuple[str, dict[str, str], int]]:
    """The domains with a throttle state, as (domain, hash, Redis now ms), most recent first."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    domains = [d.decode() for name in parts(THROTTLED)  # on a cluster, one per shard
               for d in client.zrevrangebyscore(name, "+inf", now_ms, start=0, num=limit)]
    pipe = client.pipeline(transaction=False)
    for domain in domains:
        pipe.hgetall(throttle_key(domain))
    found = []
    for domain, raw in zip(domains, pipe.execute(), strict=True):
        if raw:
            found.append((domain, {k.decode(): v.decode() for k, v in raw.items()}, now_ms))
    return found


def describe(state: dict[str, str], now_ms: int, per_second: float) -> dict[str, Any]:
    """One status-view row of a domain's throttle ``state`` (its hash), against the domain's
    configured rate (``per_second``)."""
    rate, until = float(state.get("rate", 1)), int(state.get("until", 0))
    since = int(state.get("since", 0))
    blocked_s = max(0, until - now_ms) / 1000
    if blocked_s > 0:
        shown = f"blocked {blocked_s:.0f} s more (until {_clock(until)})"
    else:
        shown = f"{rate:.0%} of its rate: {rate * per_second:.3g}/s of {per_second:.3g}/s"
    return {"rate": round(rate, 4), "rate_per_s": round(rate * per_second, 4),
            "blocked_s": round(blocked_s, 1), "blocked_until": until or None,
            "reason": state.get("reason", ""), "last_status": int(state["status"])
            if state.get("status") else None, "since": since or None,
            "incidents": int(state.get("level", 0)), "active": blocked_s > 0 or rate < 1,
            "text": f"{shown}; why: {state.get('reason', '?')}, since {_clock(since)}"}


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) if ms else "?"
