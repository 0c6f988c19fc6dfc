"""robots.txt: fetched once per origin for the whole fleet, cached in Redis, parsed by protego.

``robots:{origin}`` holds ``{"status": ..., "body": ..., "fetched_at": ...}`` for
ROBOTS_TTL_S (24 h). Status, per RFC 9309:

* ``ok``           2xx: the rules in ``body`` apply;
* ``allow_all``    4xx (no robots.txt): everything is allowed;
* ``unavailable``  5xx, timeout, connection error: the site may be down; URLs of the origin
                   are retried later with backoff (a transient failure), and the entry is kept
                   only briefly (UNAVAILABLE_TTL_S) so robots.txt is tried again soon.

Each worker keeps parsed entries in memory for LOCAL_TTL_S, so robots costs no round trip on
the hot path. :meth:`RobotsStore.refresh` is the one place robots.txt is fetched and stored.
Its caller hands it the fetch, and with it its own wait policy: a worker fetches only while it
holds ``robots:lock:{origin}`` and parks the URL when that lock or a rate-limit permit is not to
be had now; the sitemap reader sleeps until its permit is due. Either way the robots.txt
request takes a rate-limit permit like any other request. A fetch the address guard refuses
(kind ``blocked``) stores nothing: no request left, so nothing about the site is known.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from protego import Protego

from common.core.errors import FetchError
from common.store.keys import robots_key, robots_lock_key
from common.web.fetch import FetchResult

logger = logging.getLogger(__name__)

ROBOTS_PATH = "/robots.txt"

LOCAL_TTL_S = 60.0
LOCAL_MAX_ORIGINS = 10_000
UNAVAILABLE_TTL_S = 60
LOCK_MS = 30_000
MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309: parse at least 500 KiB

ALLOW_ALL = "allow_all"
RULES = "ok"
UNAVAILABLE = "unavailable"


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

    def parser(self) -> Protego | None:
        return Protego.parse(self.body) if self.status == RULES else None


class RobotsRules:
    """A parsed entry: answers allowed/crawl-delay for one origin."""

    def __init__(self, entry: RobotsEntry, user_agent: str) -> None:
        self.entry = entry
        self.user_agent = user_agent
        self._parser = entry.parser()

    @property
    def unavailable(self) -> bool:
        return self.entry.status == UNAVAILABLE

    def allows(self, url: str) -> bool:
        return self._parser is None or self._parser.can_fetch(url, self.user_agent)

    def crawl_delay_s(self) -> float | None:
        if self._parser is None:
            return None
        delay = self._parser.crawl_delay(self.user_agent)
        return float(delay) if delay else None


def entry_for_response(status: int | None, body: bytes, error: str | None = None) -> RobotsEntry:
    """Turn a robots.txt fetch into an entry (RFC 9309 §2.3.1)."""
    if status is None or status >= 500 or status == 429:
        return RobotsEntry(UNAVAILABLE, detail=error or f"status {status}")
    if status >= 400:
        return RobotsEntry(ALLOW_ALL, detail=f"status {status}")
    if status >= 300:  # redirects exhausted: treat as unavailable
        return RobotsEntry(UNAVAILABLE, detail=f"status {status}")
    text = body[:MAX_ROBOTS_BYTES].decode("utf-8", errors="replace")
    return RobotsEntry(RULES, body=text)


class RobotsStore:
    """Shared (Redis) and local (memory) caches of robots entries."""

    def __init__(self, client: redis.Redis, user_agent: str, ttl_s: int) -> None:
        self.client = client
        self.user_agent = user_agent
        self.ttl_s = ttl_s
        self._local: OrderedDict[str, tuple[float, RobotsRules]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, origin: str) -> RobotsRules | None:
        """The rules for ``origin`` from memory or Redis; None when nobody has fetched them."""
        now = time.monotonic()
        with self._lock:
            hit = self._local.get(origin)
            if hit and hit[0] > now:
                self._local.move_to_end(origin)
                return hit[1]
        raw = self.client.get(robots_key(origin))
        if raw is None:
            return None
        data = json.loads(raw)
        rules = RobotsRules(RobotsEntry(data["status"], data.get("body", ""),
                                        data.get("detail", "")), self.user_agent)
        self._remember(origin, rules)
        return rules

    def refresh(self, origin: str, fetch: Callable[[str], FetchResult]) -> RobotsRules:
        """Fetch ``origin``'s robots.txt with ``fetch`` (the caller's wait policy), store the
        entry fleet-wide, log it once, return its rules.

        ``fetch`` gets :func:`robots_url` of the origin and raises FetchError when no HTTP
        status came back. A FetchError stores "unavailable" (RFC 9309), except kind
        ``blocked`` (the address guard refused the origin), which is re-raised: nothing about
        the site is known.

        Raises:
            FetchError: kind ``blocked`` only; nothing was stored.
            redis.RedisError: storing the entry failed.
        """
        try:
            response = fetch(robots_url(origin))
            entry = entry_for_response(response.status, response.body)
        except FetchError as exc:
            if exc.kind == "blocked":
                raise
            entry = entry_for_response(None, b"", f"{exc.kind}: {exc}")
        rules = self.put(origin, entry)
        logger.info("robots.txt for %s: %s %s", origin, entry.status, entry.detail)
        return rules

    def put(self, origin: str, entry: RobotsEntry) -> RobotsRules:
        ttl_s = UNAVAILABLE_TTL_S if entry.status == UNAVAILABLE else self.ttl_s
        payload = json.dumps({"status": entry.status, "body": entry.body,
                              "detail": entry.detail, "fetched_at": time.time()})
        self.client.set(robots_key(origin), payload, ex=ttl_s)
        rules = RobotsRules(entry, self.user_agent)
        self._remember(origin, rules)
        return rules

    def try_lock(self, origin: str, owner: str) -> bool:
        return bool(self.client.set(robots_lock_key(origin), owner, nx=True, px=LOCK_MS))

    def unlock(self, origin: str) -> None:
        self.client.delete(robots_lock_key(origin))

    def _remember(self, origin: str, rules: RobotsRules) -> None:
        ttl_s = min(LOCAL_TTL_S, UNAVAILABLE_TTL_S if rules.unavailable else LOCAL_TTL_S)
        with self._lock:
            self._local[origin] = (time.monotonic() + ttl_s, rules)
            self._local.move_to_end(origin)
            while len(self._local) > LOCAL_MAX_ORIGINS:
                self._local.popitem(last=False)
