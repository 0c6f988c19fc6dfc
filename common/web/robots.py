"""robots.txt: fetched once per origin for the whole fleet, cached in Redis, parsed by protego.

``robots:{origin}`` holds ``{"status": ..., "body": ..., "fetched_at": ...}`` (and ``kind``
when failed) for ROBOTS_TTL_S (24 h). Status, per RFC 9309:

* ``ok``           2xx: the rules in ``body`` apply;
* ``allow_all``    4xx (no robots.txt): everything is allowed;
* ``unavailable``  5xx, timeout, connection error: the site may be down; URLs of the origin
                   are retried later with backoff (a transient failure). The entry lives a
                   quarter of RETRY_BASE_S, less than the shortest first retry delay (half of
                   it), so each retry asks robots.txt again;
* ``failed``       a permanent fetch failure (``kind``: tls_certificate, invalid,
                   too_many_redirects...): the origin's URLs are dead-lettered
                   ``fetch_{kind}`` at once, with the fetch's message. The entry lives
                   RETRY_BASE_S, only so the origin's queued URLs do not each pay a handshake
                   (one attempt per origin per RETRY_BASE_S); ``dlq replay`` deletes it
                   (:func:`forget_failures`), so a replay after a fix fetches afresh.

A robots.txt is hostile input too (NOTES #12): at most MAX_ROBOTS_BYTES of it is read (a line
cut there is dropped), and protego only ever sees the group we obey, capped
(common/web/robots_rules.py), so parsing, matching and memory are bounded per origin.

Each worker keeps parsed good entries (``ok``, ``allow_all``) in memory (:class:`LocalRules`)
for LOCAL_TTL_S, so robots costs no round trip on the hot path; expired entries are dropped,
and all of them together stay within LOCAL_MAX_BYTES (measured per entry) and
LOCAL_MAX_ORIGINS, the least recently used evicted first. The other entries are read from
Redis each time: no worker believes a failure longer than the fleet does, and a replay that
deleted it is seen at once.

:meth:`RobotsStore.refresh` is the one place robots.txt is fetched and stored. Its caller
hands it the fetch, and with it its own wait policy: a worker fetches only while it holds
``robots:lock:{origin}`` and parks the URL when that lock or a rate-limit permit is not to be
had now; the sitemap reader sleeps until its permit is due. Either way the robots.txt
request takes a rate-limit permit like any other request. A fetch the address guard refuses
(kind ``blocked``) stores nothing: no request left, so nothing about the site is known.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from protego import Protego
from redis.cluster import key_slot

from common.core.config import Settings
from common.core.errors import FetchError
from common.store import slots
from common.store.keys import robots_key, robots_lock_key
from common.web.fetch import Fetcher, FetchResult
from common.web.robots_rules import deep_size, reduce

logger = logging.getLogger(__name__)

ROBOTS_PATH = "/robots.txt"

LOCAL_TTL_S = 60.0
LOCAL_MAX_ORIGINS = 10_000
LOCAL_MAX_BYTES = 16 * 1024 * 1024  # >= 16 worst-case origins (~1 MiB), thousands of usual ones
LOCAL_SWEEP_S = 5.0
LOCK_MS = 30_000
MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309: parse at least 500 KiB; Google: the rest is ignored
MAX_MATCH_URL_CHARS = 8 * 1024  # longer URLs (4x MAX_URL_LENGTH) are not judged: disallowed

ALLOW_ALL = "allow_all"
RULES = "ok"
UNAVAILABLE = "unavailable"
FAILED = "failed"
GOOD = frozenset({RULES, ALLOW_ALL})


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.lower()}"


def robots_url(origin: str) -> str:
    """Where ``origin``'s (``scheme://host[:port]``) robots.txt lives."""
    return origin + ROBOTS_PATH


@dataclass(frozen=True)
class RobotsEntry:
    status: str
    body: str = ""
    detail: str = ""
    kind: str = ""  # FAILED: the FetchError kind


class RobotsRules:
    """A parsed entry: answers allowed/crawl-delay for one origin.

    ``entry.body`` is the reduced robots.txt (robots_rules.reduce: the group we obey, capped,
    and the Sitemap lines), not the site's text, which only Redis keeps. ``dropped`` counts
    the rules and Sitemap lines the caps left out; ``size_bytes`` estimates the memory held.
    """

    def __init__(self, entry: RobotsEntry, user_agent: str) -> None:
        self.user_agent = user_agent
        self.dropped = 0
        self._parser: Protego | None = None
        if entry.status == RULES:
            reduced = reduce(entry.body, user_agent)
            entry = RobotsEntry(RULES, reduced.text, entry.detail, entry.kind)
            self._parser = Protego.parse(reduced.text)
            self.dropped = reduced.dropped
            self._parser.can_fetch("/", user_agent)  # builds protego's lazy index now
        self.entry = entry
        self.size_bytes = deep_size(self)

    @property
    def unavailable(self) -> bool:
        return self.entry.status == UNAVAILABLE

    @property
    def failed(self) -> bool:
        """robots.txt could not be fetched for a permanent reason (``entry.kind``)."""
        return self.entry.status == FAILED

    def allows(self, url: str) -> bool:
        if self._parser is None:
            return True
        # Matching costs up to a scan of the URL per wildcard rule; no URL the fleet accepts
        # is this long (the producer refuses more than MAX_URL_LENGTH), a crawled link may be.
        return len(url) <= MAX_MATCH_URL_CHARS and self._parser.can_fetch(url, self.user_agent)

    def crawl_delay_s(self) -> float | None:
        if self._parser is None:
            return None
        delay = self._parser.crawl_delay(self.user_agent)
        return float(delay) if delay else None


def robots_fetcher(settings: Settings) -> Fetcher:
    """A Fetcher that reads no more of a robots.txt than is used (MAX_ROBOTS_BYTES)."""
    return Fetcher(settings.with_overrides(max_body_bytes=MAX_ROBOTS_BYTES))


def entry_for_response(status: int | None, body: bytes, error: str | None = None, *,
                       truncated: bool = False) -> RobotsEntry:
    """Turn a robots.txt fetch into an entry (RFC 9309 §2.3.1).

    At most MAX_ROBOTS_BYTES of the body is used (Google ignores the rest too); when the body
    was longer (or the fetch cut it: ``truncated``), the line cut in two is dropped as well, so
    no rule is read shorter, and broader, than the site wrote it.
    """
    if status is None or status >= 500 or status == 429:
        return RobotsEntry(UNAVAILABLE, detail=error or f"status {status}")
    if status >= 400:
        return RobotsEntry(ALLOW_ALL, detail=f"status {status}")
    if status >= 300:  # redirects exhausted: treat as unavailable
        return RobotsEntry(UNAVAILABLE, detail=f"status {status}")
    if truncated or len(body) > MAX_ROBOTS_BYTES:
        body = body[:MAX_ROBOTS_BYTES]
        body = body[:max(body.rfind(b"\n"), body.rfind(b"\r")) + 1]
        return RobotsEntry(RULES, body=body.decode("utf-8", errors="replace"),
                           detail=f"cut at {len(body)} bytes (limit {MAX_ROBOTS_BYTES})")
    return RobotsEntry(RULES, body=body.decode("utf-8", errors="replace"))


class LocalRules:
    """Parsed entries of one process, by origin: each kept for its TTL, at most ``max_bytes``
    (their ``size_bytes``) and ``max_origins`` together, the least recently used evicted first.

    Expired entries are dropped when looked up and by a sweep at most every LOCAL_SWEEP_S
    (a full pass: entries expire out of their LRU order). Thread-safe.
    """

    def __init__(self, max_bytes: int = LOCAL_MAX_BYTES, max_origins: int = LOCAL_MAX_ORIGINS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.max_origins = max_origins
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[str, tuple[float, RobotsRules]] = OrderedDict()
        self._lock = threading.Lock()
        self._next_sweep = clock() + LOCAL_SWEEP_S

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, origin: str) -> bool:
        return origin in self._entries

    def get(self, origin: str) -> RobotsRules | None:
        now = self.clock()
        with self._lock:
            self._sweep(now)
            hit = self._entries.get(origin)
            if hit is None:
                return None
            if hit[0] <= now:
                self._drop(origin)
                return None
            self._entries.move_to_end(origin)
            return hit[1]

    def put(self, origin: str, rules: RobotsRules, ttl_s: float) -> None:
        now = self.clock()
        with self._lock:
            self._sweep(now)
            if origin in self._entries:
                self._drop(origin)
            self._entries[origin] = (now + ttl_s, rules)
            self.bytes += rules.size_bytes
            # The newest entry stays even alone over the budget: it is about to be used.
            while len(self._entries) > 1 and (self.bytes > self.max_bytes
                                              or len(self._entries) > self.max_origins):
                self._drop(next(iter(self._entries)))

    def _drop(self, origin: str) -> None:
        _expires, rules = self._entries.pop(origin)
        self.bytes -= rules.size_bytes

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + LOCAL_SWEEP_S
        for origin in [o for o, (expires, _r) in self._entries.items() if expires <= now]:
            self._drop(origin)


class RobotsStore:
    """Shared (Redis) and local (memory, :class:`LocalRules`) caches of robots entries."""

    def __init__(self, client: redis.Redis, user_agent: str, ttl_s: int,
                 local: LocalRules | None = None, retry_base_s: float = 2.0) -> None:
        self.client = client
        self.user_agent = user_agent
        self.ttl_s = ttl_s
        self.local = local if local is not None else LocalRules()
        # How long a failure is believed (module docstring); at least 1 ms each.
        self.unavailable_ttl_ms = max(1, int(retry_base_s * 1000 / 4))
        self.failed_ttl_ms = max(1, int(retry_base_s * 1000))

    @classmethod
    def from_settings(cls, client: redis.Redis, settings: Settings) -> RobotsStore:
        return cls(client, settings.robots_user_agent, settings.robots_ttl_s,
                   retry_base_s=settings.retry_base_s)

    def get(self, origin: str) -> RobotsRules | None:
        """The rules for ``origin`` from memory or Redis; None when nobody has fetched them."""
        rules = self.local.get(origin)
        if rules is not None:
            return rules
        raw = self.client.get(robots_key(origin))
        if raw is None:
            return None
        data = json.loads(raw)
        rules = RobotsRules(RobotsEntry(data["status"], data.get("body", ""),
                                        data.get("detail", ""), data.get("kind", "")),
                            self.user_agent)
        self._remember(origin, rules)
        return rules

    def refresh(self, origin: str, fetch: Callable[[str], FetchResult]) -> RobotsRules:
        """Fetch ``origin``'s robots.txt with ``fetch`` (the caller's wait policy), store the
        entry fleet-wide, log it once, return its rules.

        ``fetch`` gets :func:`robots_url` of the origin and raises FetchError when no HTTP
        status came back. A transient FetchError stores "unavailable" (RFC 9309), a permanent
        one "failed" with its kind, except kind ``blocked`` (the address guard refused the
        origin), which is re-raised: nothing about the site is known.

        Raises:
            FetchError: kind ``blocked`` only; nothing was stored.
            redis.RedisError: storing the entry failed.
        """
        try:
            response = fetch(robots_url(origin))
            entry = entry_for_response(response.status, response.body,
                                       truncated=response.truncated)
        except FetchError as exc:
            if exc.kind == "blocked":
                raise
            entry = (entry_for_response(None, b"", f"{exc.kind}: {exc}") if exc.transient else
                     RobotsEntry(FAILED, detail=f"robots.txt: {exc}", kind=exc.kind))
        rules = self.put(origin, entry)
        logger.info("robots.txt for %s: %s %s%s", origin, entry.status,
                    f"{entry.kind} " if entry.kind else "", entry.detail)
        if rules.dropped:
            logger.warning("robots.txt for %s: %d rules or Sitemap lines over the caps ignored "
                           "(NOTES #12)", origin, rules.dropped)
        return rules

    def put(self, origin: str, entry: RobotsEntry) -> RobotsRules:
        ttl_ms = {UNAVAILABLE: self.unavailable_ttl_ms,
                  FAILED: self.failed_ttl_ms}.get(entry.status, self.ttl_s * 1000)
        payload = json.dumps({"status": entry.status, "body": entry.body,
                              "detail": entry.detail, "fetched_at": time.time(),
                              **({"kind": entry.kind} if entry.kind else {})})
        self.client.set(robots_key(origin), payload, px=ttl_ms)
        rules = RobotsRules(entry, self.user_agent)
        self._remember(origin, rules)
        return rules

    def try_lock(self, origin: str, owner: str) -> bool:
        return bool(self.client.set(robots_lock_key(origin), owner, nx=True, px=LOCK_MS))

    def unlock(self, origin: str) -> None:
        self.client.delete(robots_lock_key(origin))

    def _remember(self, origin: str, rules: RobotsRules) -> None:
        if rules.entry.status in GOOD:  # a failure is believed as long as Redis keeps it
            self.local.put(origin, rules, LOCAL_TTL_S)


# Delete each robots:{origin} in KEYS whose entry is not a good one (ok, allow_all): checked
# and deleted in one step, so a good entry stored meanwhile by a worker stays.
FORGET_FAILURES_LUA = """
local gone = 0
for _, key in ipairs(KEYS) do
  local raw = redis.call('GET', key)
  if raw then
    local ok, entry = pcall(cjson.decode, raw)
    if not (ok and type(entry) == 'table' and (entry.status == 'ok'
                                               or entry.status == 'allow_all')) then
      gone = gone + redis.call('DEL', key)
    end
  end
end
return gone
"""


def forget_failures_calls(origins: Iterable[str]) -> list[list[str]]:
    """The keys of each FORGET_FAILURES_LUA call: one call, on a cluster one per hash slot."""
    groups: dict[int, list[str]] = {}
    for key in sorted({robots_key(origin) for origin in origins}):
        groups.setdefault(key_slot(key.encode()) if slots.cluster() else 0, []).append(key)
    return list(groups.values())


def forget_failures(client: redis.Redis, origins: Iterable[str]) -> int:
    """Delete the fleet's "unavailable"/"failed" robots entries of ``origins`` (what ``dlq
    replay`` needs: the replayed URLs then fetch robots.txt afresh); returns how many."""
    calls = forget_failures_calls(origins)
    if not slots.cluster():
        return sum(int(client.eval(FORGET_FAILURES_LUA, len(keys), *keys)) for keys in calls)
    pipe = client.pipeline(transaction=False)  # each primary's calls sent at once
    for keys in calls:  # by name: the cluster pipeline refuses eval()
        pipe.execute_command("EVAL", FORGET_FAILURES_LUA, len(keys), *keys)
    return sum(int(gone) for gone in pipe.execute())
