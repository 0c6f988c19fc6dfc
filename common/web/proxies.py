"""Which proxy a fetch goes through: a pool rotated per request or sticky per session, a
failing proxy rested fleet-wide, and what each one served counted for the status view.

* :func:`parse_proxy_urls` reads PROXY_URLS (or a job's or a rule's list): http://, https://,
  socks5:// (the fleet resolves the target's name) and socks5h:// (the proxy does), each with
  a host and a port, ``user:password@`` allowed. An error names the entry redacted: a
  password never reaches a message, a log or a record (common.core.redact.redact_url).
* :func:`proxy_id` is the Redis name of a proxy: a digest of its whole URL, so two accounts on
  the same proxy are two proxies and the key never shows a credential.
* :class:`ProxyPool` chooses. ``PROXY_ROTATION=request``: round robin over the proxies that
  are not resting. With a ``sticky`` key (a session, under ``PROXY_ROTATION=session``): the
  healthy proxy that key ranks highest (rendezvous hashing), the same on every worker with no
  shared state, and a key moves only when its proxy rests. All resting: the one whose rest
  ends first (a fetch is never refused for want of a proxy; it fails and is retried).
* A failure rests the proxy fleet-wide: ``proxy:rest:{id}`` set PX PROXY_REST_S. The hot path
  never waits on Redis per page: each worker keeps a local view of the resting set, refreshed
  at most every REFRESH_S, and buffers the served/failed counters, added to ``proxy:stats``
  (HINCRBY, and ``{id}:name`` -> the redacted URL) at most every REFRESH_S.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
import threading
import time
import zlib
from collections import Counter
from urllib.parse import urlsplit

import redis

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.redact import redact_url
from common.store.keys import PROXY_STATS, proxy_rest_key
from common.web.fetch import Fetcher, FetchResult, Identity

__all__ = ["SCHEMES", "FleetProxies", "ProxyPool", "parse_proxy_urls", "proxy_id",
           "read_stats"]

logger = logging.getLogger(__name__)

SCHEMES = ("http", "https", "socks5", "socks5h")
#: Seconds between two looks at the fleet's resting set (and two flushes of the counters).
REFRESH_S = 1.0
#: Most proxy URLs whose digest is kept (a rule's list per URL would be unusual).
_MAX_KNOWN = 4096


def parse_proxy_urls(raw: str) -> tuple[str, ...]:
    """``"http://a:3128, socks5h://u:p@b:1080"`` → the URLs, in order; empty: () (direct).

    Raises:
        ValueError: an entry with another scheme, no host, or no valid port; the message
            shows the entry redacted (its password never).
    """
    urls = []
    for entry in filter(None, (part.strip() for part in raw.split(","))):
        shown = redact_url(entry)
        try:
            parts = urlsplit(entry)
            port = parts.port
        except ValueError:
            raise ValueError(f"proxy {shown!r}: the host or port does not parse") from None
        if parts.scheme.lower() not in SCHEMES:
            raise ValueError(f"proxy {shown!r}: the scheme must be one of "
                             f"{', '.join(s + '://' for s in SCHEMES)}")
        if not parts.hostname:
            raise ValueError(f"proxy {shown!r}: no host")
        if port is None:
            raise ValueError(f"proxy {shown!r}: no port (write it: host:3128, host:1080)")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"proxy {shown!r}: a proxy URL is scheme://[user:password@]host:port")
        urls.append(entry)
    return tuple(urls)


def proxy_id(url: str) -> str:
    """A short digest of the whole URL (credentials included, never revealed)."""
    return hashlib.blake2b(url.encode(), digest_size=6).hexdigest()


def read_stats(client: redis.Redis) -> dict[str, dict[str, int | str]]:
    """``proxy:stats`` by proxy id: {"name": redacted URL, "served": n, "failed": n}."""
    stats: dict[str, dict[str, int | str]] = {}
    for field, value in client.hgetall(PROXY_STATS).items():
        field = field.decode() if isinstance(field, bytes) else field
        value = value.decode() if isinstance(value, bytes) else value
        ident, _, what = field.rpartition(":")
        entry = stats.setdefault(ident, {"name": "", "served": 0, "failed": 0})
        entry[what] = value if what == "name" else int(value)
    return stats


class ProxyPool:
    """Chooses the proxy of each fetch; one per worker, shared by its threads."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.client = client
        self.rest_ms = max(1, int(settings.proxy_rest_s * 1000))
        self._lock = threading.Lock()
        self._ids: dict[str, str] = {}  # url -> proxy_id(url)
        self._named: set[str] = set()  # ids whose "{id}:name" this worker wrote
        self._turns: dict[tuple[str, ...], itertools.count[int]] = {}
        self._resting: dict[str, float] = {}  # id -> monotonic time its rest ends
        self._marked: dict[str, float] = {}  # id -> when this worker rested it (monotonic)
        self._pending: Counter[str] = Counter()  # "{id}:served" / "{id}:failed" -> not flushed
        self._due = 0.0  # monotonic time of the next refresh and flush
        self._busy = False  # a thread is refreshing (the others go on with the view they have)

    def choose(self, urls: tuple[str, ...], sticky: str | None = None) -> str | None:
        """The proxy for the next fetch, or None (direct) when ``urls`` is empty.

        Args:
            urls: the list in force (the fleet's PROXY_URLS, a job's or a rule's).
            sticky: a session's key, given under ``rotation: session``: that session keeps
                its proxy while the proxy is healthy. None: the next healthy one.
        """
        if not urls:
            return None
        now = time.monotonic()
        if now >= self._due:
            self._refresh(now)
        with self._lock:
            ids = [self._id(url) for url in urls]
            resting = self._resting
            healthy = [i for i, ident in enumerate(ids) if resting.get(ident, 0.0) <= now]
            if not healthy:  # all resting: the one back first
                return urls[min(range(len(urls)), key=lambda i: resting.get(ids[i], 0.0))]
            if sticky is not None:
                return urls[max(healthy, key=lambda i: zlib.crc32(f"{sticky}|{ids[i]}".encode()))]
            turns = self._turns.get(urls)
            if turns is None:  # each worker starts somewhere else
                turns = self._turns.setdefault(urls, itertools.count(random.randrange(len(urls))))
            return urls[healthy[next(turns) % len(healthy)]]

    def served(self, proxy: str) -> None:
        """Count a fetch ``proxy`` served (buffered; added to ``proxy:stats`` within REFRESH_S)."""
        with self._lock:
            self._pending[f"{self._id(proxy)}:served"] += 1
        if time.monotonic() >= self._due:
            self._refresh(time.monotonic())

    def failed(self, proxy: str) -> None:
        """Rest ``proxy`` fleet-wide for PROXY_REST_S and count the failure (at once: every
        worker sees the rest at its next refresh)."""
        now = time.monotonic()
        with self._lock:
            ident = self._id(proxy)
            self._resting[ident] = now + self.rest_ms / 1000
            self._marked[ident] = now
            name = None if ident in self._named else redact_url(proxy)
            self._named.add(ident)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(proxy_rest_key(ident), "1", px=self.rest_ms)
        pipe.hincrby(PROXY_STATS, f"{ident}:failed", 1)
        if name is not None:
            pipe.hset(PROXY_STATS, f"{ident}:name", name)
        pipe.execute()
        logger.warning("proxy %s failed: resting it for %.0fs fleet-wide",
                       redact_url(proxy), self.rest_ms / 1000)

    def flush(self) -> None:
        """Add the buffered counters to ``proxy:stats`` now (a worker stopping)."""
        self._refresh(time.monotonic(), force=True)

    # -- internals ---------------------------------------------------------------------------
    def _id(self, url: str) -> str:
        """``proxy_id(url)``, remembered (the lock is held)."""
        ident = self._ids.get(url)
        if ident is None:
            if len(self._ids) >= _MAX_KNOWN:
                self._ids.clear()
            ident = self._ids[url] = proxy_id(url)
        return ident

    def _refresh(self, now: float, force: bool = False) -> None:
        """Look at which proxies rest fleet-wide and flush the counters: one pipeline, by one
        thread at a time, at most every REFRESH_S (unless forced)."""
        with self._lock:
            if self._busy or (now < self._due and not force):
                return
            self._busy = True
            self._due = now + REFRESH_S
            urls_by_id = {ident: url for url, ident in self._ids.items()}
            pending, self._pending = self._pending, Counter()
            names = {ident: redact_url(urls_by_id[ident]) for ident in urls_by_id
                     if ident not in self._named}
        try:
            ids = list(urls_by_id)
            pipe = self.client.pipeline(transaction=False)
            for ident in ids:
                pipe.pttl(proxy_rest_key(ident))
            for field, count in pending.items():
                pipe.hincrby(PROXY_STATS, field, count)
            if names:
                pipe.hset(PROXY_STATS, mapping={f"{i}:name": n for i, n in names.items()})
            replies = pipe.execute()
        except redis.RedisError:
            with self._lock:  # counted again at the next flush, not lost
                self._pending.update(pending)
                self._busy = False
            raise
        with self._lock:
            self._named.update(names)
            for ident, ttl_ms in zip(ids, replies, strict=False):
                if ttl_ms is not None and ttl_ms > 0:
                    self._resting[ident] = now + ttl_ms / 1000
                elif self._marked.get(ident, -1.0) < now:  # not rested here since we looked
                    self._resting.pop(ident, None)
            self._busy = False


class FleetProxies:
    """The fleet's own requests that are no page's (robots.txt, sitemaps) through PROXY_URLS:
    behind a proxy-only egress they must go the pages' way too. Direct without PROXY_URLS."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.urls = parse_proxy_urls(settings.proxy_urls) if settings.proxy_urls else ()
        self.pool = ProxyPool(settings, client) if self.urls else None

    def fetch(self, fetcher: Fetcher, url: str, **kwargs: object) -> FetchResult:
        """``fetcher.fetch(url, **kwargs)`` through the next healthy proxy; a proxy that fails
        is rested (the FetchError, kind ``proxy``, is re-raised: the caller retries)."""
        if self.pool is None:
            return fetcher.fetch(url, **kwargs)
        proxy = self.pool.choose(self.urls)
        try:
            response = fetcher.fetch(url, identity=Identity(proxy=proxy), **kwargs)
        except FetchError as exc:
            if exc.kind == "proxy" and proxy is not None:
                self.pool.failed(proxy)
            raise
        if proxy is not None:
            self.pool.served(proxy)
        return response

    def flush(self) -> None:
        """The process stops: the buffered counters go to Redis."""
        if self.pool is not None:
            self.pool.flush()
