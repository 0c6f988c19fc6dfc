"""The recrawl schedule in Redis: per-URL next-visit times, taken under a fencing token, and
intervals that adapt to how often each page changes.

Keys (:mod:`common.store.keys`): ``schedule:due`` (ZSET url → next visit, Redis ms clock),
``schedule:inflight`` (HASH url → ``token:due_ms:taken_ms``), ``schedule:state`` (HASH url →
JSON ``{i, h, id, v, c, e, m}``: interval s, last content_hash, last results id learned,
visits, changes, last ETag, last Last-Modified). Every step is one Lua script
(:mod:`common.intake.schedule_scripts`), so it is atomic and one round trip:

* :meth:`Schedule.take` checks the lease (``schedule:lease`` must hold the caller's fencing
  token, :mod:`common.intake.recrawler`), takes over in-flight entries of an older token that
  are a lease old (a leader that died between taking and rescheduling), then moves due URLs to
  ``schedule:inflight``, each with the validators its state holds (:attr:`Due.validators`,
  sent as ``If-None-Match`` / ``If-Modified-Since``). A deposed leader takes nothing.
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
  dead letter leave the interval as it is. The same record's ``etag`` / ``last_modified``
  become the URL's validators (``e``, ``m``): a 304 updates those it carries, any other
  record carrying one replaces both, a record carrying none keeps them. Only scheduled URLs
  have a state, so only they cost memory for validators.

Each published visit carries the nonce ``sched:{due_ms}`` (:attr:`Due.nonce`): the done mark
of one due time. A due time published twice (a leader killed after the broker confirmed and
before it rescheduled) is one outcome at the workers, never two.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import redis

from common.core.config import Settings
from common.core.errors import ConfigError, InvalidURL
from common.core.urls import canonicalize
from common.intake.schedule_scripts import ADD_LUA, LEARN_LUA, SETTLE_LUA, TAKE_LUA
from common.store.keys import ScheduleKey, schedule_key
from common.web.curl import sendable

ADD_BATCH = 1000


@dataclass(frozen=True)
class Due:
    """One due visit: the URL, the due time (ms) it was taken for, and the validators of the
    last visit (``""``: none)."""

    url: str
    due_ms: int
    etag: str = ""
    last_modified: str = ""

    @property
    def nonce(self) -> str:
        """The recrawl nonce of this due time: one done mark, so one outcome, per due time."""
        return f"sched:{self.due_ms}"

    @property
    def validators(self) -> dict[str, str]:
        """``{"etag": ..., "last_modified": ...}`` with the keys it has (the work message's
        ``extra["validators"]``, which the worker sends as conditional request headers)."""
        return {k: v for k, v in (("etag", self.etag), ("last_modified", self.last_modified))
                if v}


class Observation(NamedTuple):
    """What one result record says, for :meth:`Schedule.learn` (``""``: nothing)."""

    url: str
    id: str  #: its ``results`` stream id
    kind: str  #: ``h`` a content_hash to compare, ``u`` unchanged (a 304), ``n`` nothing
    hash: str = ""
    etag: str = ""
    last_modified: str = ""


def observation(record: dict[str, Any]) -> tuple[str, str]:
    """What a result record says about a change: ``('u', '')`` unchanged (a 304), ``('h',
    hash)`` a content_hash to compare, ``('n', '')`` nothing (cache hit, no hash, not 2xx)."""
    status = record.get("status")
    if status == 304 or record.get("unchanged") is True:
        return "u", ""
    digest = record.get("content_hash")
    if (isinstance(digest, str) and digest and not record.get("cached")
            and isinstance(status, int) and 200 <= status < 300):
        return "h", digest
    return "n", ""


def validators(record: dict[str, Any]) -> tuple[str, str]:
    """A 2xx or 304 record's ``(etag, last_modified)``; ``""`` for one absent or not short
    printable ASCII (it goes back to the site as a request header)."""
    status = record.get("status")
    if not isinstance(status, int) or not (200 <= status < 300 or status == 304):
        return "", ""
    return (sendable(record.get("etag")) or "", sendable(record.get("last_modified")) or "")


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
        added, updated = self._add(keys=_keys("state", "due", "inflight"),
                                   args=["1" if replace else "0", *batch])
        summary.added += added
        summary.updated += updated
        summary.kept += len(batch) // 3 - added - updated

    def take(self, token: int, limit: int, stale_ms: int) -> list[Due] | None:
        """Move up to ``limit`` due URLs (first those an older token left in flight at least
        ``stale_ms`` ago) into ``schedule:inflight`` under ``token``. None: the lease is not
        ``token``'s (deposed), nothing was taken."""
        flat = self._take(keys=_keys("lease", "due", "inflight", "state"),
                          args=[token, limit, stale_ms])
        if flat is None:
            return None
        return [Due(_text(flat[i]), int(flat[i + 1]), _text(flat[i + 2]), _text(flat[i + 3]))
                for i in range(0, len(flat), 4)]

    def settle(self, token: int, urls: list[str]) -> int:
        """Published: next visit at now + interval. Returns how many were still ``token``'s."""
        return self._settle_as(token, "next", urls)

    def release(self, token: int, urls: list[str]) -> int:
        """Not published: back to their due time, taken again at the next tick."""
        return self._settle_as(token, "back", urls)

    def _settle_as(self, token: int, mode: str, urls: list[str]) -> int:
        if not urls:
            return 0
        return int(self._settle(keys=_keys("inflight", "due", "state"),
                                args=[token, mode, *urls]))

    def learn(self, observations: Iterable[tuple[str, ...]]) -> int:
        """Adapt intervals and keep validators from observations in stream order (each an
        :class:`Observation` or a tuple of its fields, the last ones optional). Returns how
        many intervals changed; unscheduled URLs are ignored."""
        args = [value for item in observations for value in Observation(*item)]
        if not args:
            return 0
        s = self.settings
        return int(self._learn(keys=_keys("state", "due"),
                               args=[self.min_s, self.max_s, s.schedule_growth,
                                     s.schedule_shrink, *args]))

    def remove(self, raw_urls: Iterable[str]) -> int:
        """Unschedule URLs (one in flight is published once more, then dropped)."""
        urls = [canonicalize(u, max_length=self.settings.max_url_length) for u in raw_urls]
        if not urls:
            return 0
        pipe = self.client.pipeline(transaction=True)
        pipe.hdel(schedule_key("state"), *urls)
        pipe.zrem(schedule_key("due"), *urls)
        return int(pipe.execute()[0])

    def entry(self, raw_url: str) -> dict[str, Any] | None:
        """One URL's schedule: interval_s, next_visit (epoch s), in_flight, visits, changes."""
        url = canonicalize(raw_url, max_length=self.settings.max_url_length)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(schedule_key("state"), url)
        pipe.zscore(schedule_key("due"), url)
        pipe.hexists(schedule_key("inflight"), url)
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
        pipe.hlen(schedule_key("state"))
        pipe.zcount(schedule_key("due"), "-inf", now_ms)
        pipe.hlen(schedule_key("inflight"))
        pipe.zrange(schedule_key("due"), 0, 0, withscores=True)
        pipe.get(schedule_key("lease"))
        scheduled, due, in_flight, first, lease = pipe.execute()
        return {"scheduled": scheduled, "due": due, "in_flight": in_flight,
                "next_visit_in_s": round(max(0.0, first[0][1] - now_ms) / 1000, 1)
                if first else None,
                "leader": _text(lease) if lease else None}


def _keys(*names: ScheduleKey) -> list[str]:
    """The schedule's keys a script is given, by name (one slot on a cluster)."""
    return [schedule_key(name) for name in names]
