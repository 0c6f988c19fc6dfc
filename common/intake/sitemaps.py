"""Sitemaps of a site: find them (robots.txt, /sitemap.xml), fetch them under the fleet's
rules, follow indexes, feed the Producer.

A *site* (``https://host/``) is read from the ``Sitemap:`` lines of its robots.txt, else from
``/sitemap.xml``; any other URL is taken as a sitemap itself. Sitemap indexes are followed
depth first (MAX_INDEX_DEPTH levels, each sitemap read once per site, so a loop ends). What a
file may hold and how it is parsed safely is :mod:`common.intake.sitemap_files`.

Fetches use :class:`common.web.fetch.Fetcher` (address guard, own redirects, timeouts, caps) with
the body cap raised to MAX_SITEMAP_BYTES, and take a rate-limit permit for their domain first,
sleeping out the booked slot when the domain is busy (a producer may block; it is no worker).
robots.txt comes from the fleet's robots cache (``robots:{origin}``) when a worker already
fetched it; else :meth:`common.web.robots.RobotsStore.refresh` fetches and stores it, through
the same permit wait.

A sitemap that fails (HTTP error, refused, malformed) contributes no URL at all: its entries
are submitted only once the whole file has parsed. The error names the sitemap and the run
goes on with the others.

``--since``: an entry is kept when its lastmod (sitemaps), pubDate/dc:date (RSS) or
updated/published (Atom) is at or after the given time, *or when it has none* (or an
unparsable one): a missing date says nothing about age. A child sitemap listed in an index
with a lastmod before ``since`` is not fetched: nothing in it changed since then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import urljoin, urlsplit

import redis
from protego import Protego

from common.core.config import Settings
from common.core.errors import FetchError, InvalidURL, ServiceUnavailable
from common.core.urls import canonicalize, domain_of
from common.intake.job_intake import JobRun, JobTerms
from common.intake.producer import Producer, ProduceSummary
from common.intake.sitemap_files import (
    MAX_SITEMAP_BYTES,
    MAX_URLS_PER_SITEMAP,
    Entry,
    Sitemap,
    SitemapError,
    parse_sitemap,
)
from common.web.fetch import Fetcher, FetchResult
from common.web.proxies import FleetProxies
from common.web.ratelimit import RateLimiter
from common.web.robots import RULES, RobotsStore, origin_of, robots_fetcher, robots_url

logger = logging.getLogger(__name__)

MAX_INDEX_DEPTH = 3  # index → index → index → urlset; the protocol itself allows one level
MAX_SITEMAPS_PER_SITE = 100_000  # sitemap files read for one site in one run


def parse_since(raw: str) -> datetime:
    """``--since``: ``YYYY-MM-DD`` or an ISO 8601 datetime (UTC when no zone is given).

    Raises:
        ValueError: anything else.
    """
    try:
        value = datetime.fromisoformat(raw.strip())
    except ValueError:
        raise ValueError(f"expected YYYY-MM-DD or an ISO datetime, got {raw!r}") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


# -- fetching ---------------------------------------------------------------------------------


class SitemapReader:
    """Fetches sitemaps and robots.txt with the fleet's rules, and parses them."""

    def __init__(self, settings: Settings, client: redis.Redis,
                 fetcher: Fetcher | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.fetcher = fetcher or Fetcher(settings.with_overrides(
            max_body_bytes=MAX_SITEMAP_BYTES))
        # robots.txt is read no further than it is used (500 KiB), not up to a sitemap's 50 MB.
        self._robots_fetcher = fetcher or robots_fetcher(settings)
        self.limiter = RateLimiter(client, settings)
        self.robots = RobotsStore.from_settings(client, settings)
        self.proxies = FleetProxies(settings, client)  # PROXY_URLS: sitemaps go that way too
        self._sleep = sleep

    def read(self, url: str) -> Sitemap:
        """Fetch and parse one sitemap.

        Raises:
            SitemapError: not fetched, not 2xx, too big, unsafe or malformed.
            ServiceUnavailable: Redis failed (rate limit, robots cache).
        """
        response = self.fetch(url)
        if not 200 <= response.status < 300:
            raise SitemapError(f"HTTP {response.status}")
        if response.truncated:
            raise SitemapError(f"larger than {MAX_SITEMAP_BYTES} bytes (the protocol's 50 MB "
                               "limit); refused")
        return parse_sitemap(response.body, response.final_url)

    def fetch(self, url: str) -> FetchResult:
        """GET ``url`` as :meth:`fetch_politely` does; a failed fetch is a SitemapError."""
        try:
            return self.fetch_politely(url)
        except FetchError as exc:
            raise SitemapError(f"fetch failed ({exc.kind}): {exc}") from None

    def fetch_politely(self, url: str, fetcher: Fetcher | None = None) -> FetchResult:
        """GET ``url`` after taking a rate-limit permit for its domain (waiting if need be).

        Raises:
            FetchError: as :meth:`common.web.fetch.Fetcher.fetch` raises it.
            ServiceUnavailable: Redis failed (rate limit).
        """
        domain = domain_of(url)
        try:
            rules = self.robots.get(origin_of(url))
            rate = self.limiter.rate_for(domain, rules.crawl_delay_s() if rules else None)
            # Sleep out the whole booked slot: asking again earlier would book another one
            # and push the domain's next free slot further out for the workers.
            while not (admission := self.limiter.admit(domain, rate)).go:
                self._sleep(max(admission.wait_ms, 1) / 1000)
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"Redis failed (rate limit): {exc}") from None
        return self.proxies.fetch(fetcher or self.fetcher, url, accept_any_type=True)

    def robots_sitemaps(self, origin: str) -> list[str]:
        """The ``Sitemap:`` URLs of ``origin``'s robots.txt (cached fleet-wide), absolute.

        Empty when robots.txt has no rules (missing, unavailable) or the address guard refuses
        the origin (then nothing is stored, and the fallback ``/sitemap.xml`` is refused too).
        """
        try:
            rules = self.robots.get(origin)
            if rules is None:
                rules = self.robots.refresh(origin, partial(self.fetch_politely,
                                                            fetcher=self._robots_fetcher))
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"Redis failed (robots cache): {exc}") from None
        except FetchError as exc:  # only "blocked" comes out of refresh
            logger.warning("robots.txt for %s: %s: %s", origin, exc.kind, exc)
            return []
        if rules.entry.status != RULES:
            return []
        base = robots_url(origin)
        return [urljoin(base, u.strip()) for u in Protego.parse(rules.entry.body).sitemaps]


# -- one site ---------------------------------------------------------------------------------


@dataclass
class SiteReport:
    """What reading one site gave: sitemaps read, errors, URLs dropped by --since, and the
    Producer's counts."""

    site: str
    sitemaps: int = 0
    errors: list[str] = field(default_factory=list)
    filtered: int = 0
    summary: ProduceSummary = field(default_factory=ProduceSummary)

    @property
    def failed(self) -> bool:
        return bool(self.errors or self.summary.failed)

    def error(self, url: str, message: str) -> None:
        logger.error("sitemap %s: %s", url, message)
        self.errors.append(f"{url}: {message}")

    def line(self) -> str:
        return (f"site={self.site} sitemaps={self.sitemaps} errors={len(self.errors)} "
                f"filtered={self.filtered} {self.summary.line()}")

    def as_dict(self) -> dict[str, Any]:
        return {"site": self.site, "sitemaps": self.sitemaps, "errors": list(self.errors),
                "filtered": self.filtered, **self.summary.as_dict()}


def is_site_root(target: str) -> bool:
    """``https://host/`` (or no path) is a site to discover; any other URL is a sitemap."""
    parts = urlsplit(target)
    return parts.path in ("", "/") and not parts.query


def start_sitemaps(target: str, reader: SitemapReader) -> tuple[list[str], bool]:
    """The sitemaps to begin with, and whether they are the ``/sitemap.xml`` fallback."""
    if not is_site_root(target):
        return [target], False
    origin = origin_of(target)
    listed = reader.robots_sitemaps(origin)
    if listed:
        return listed, False
    return [origin + "/sitemap.xml"], True


def produce_site(target: str, reader: SitemapReader, producer: Producer, *,
                 since: datetime | None = None, max_urls: int | None = None,
                 force_priority: bool = False,
                 on_progress: Callable[[SiteReport], None] | None = None,
                 on_entries: Callable[[list[Entry]], None] | None = None,
                 job: JobRun | None = None, job_spec: JobTerms | None = None) -> SiteReport:
    """Read every sitemap reachable from ``target`` and submit their URLs to ``producer``.

    Each sitemap's URLs are submitted as soon as that file has parsed (memory stays at one
    file's entries, at most MAX_URLS_PER_SITEMAP).

    Args:
        target: a site root (discovery through robots.txt) or a sitemap URL.
        since: keep entries dated at or after this, and undated ones.
        max_urls: stop once this many URLs of this site were submitted.
        on_entries: called with each sitemap's submitted entries (the scheduler's hook).
        job: the run the URLs enter, ``job_spec`` its JobSpec (:meth:`Producer.submit`).

    Raises:
        ServiceUnavailable: RabbitMQ or Redis failed.
    """
    report = SiteReport(site=target)
    starts, fallback = start_sitemaps(target, reader)
    stack = [(url, 0) for url in reversed(starts)]
    visited: set[str] = set()
    while stack:
        if max_urls is not None and report.summary.read >= max_urls:
            logger.info("site %s: --max-urls %d reached", target, max_urls)
            break
        url, depth = stack.pop()
        try:
            key = canonicalize(url)
        except InvalidURL as exc:
            report.error(url[:200], f"invalid sitemap URL: {exc}")
            continue
        if key in visited:
            logger.warning("sitemap %s: already read for %s (index loop or repeat); skipped",
                           url, target)
            continue
        if len(visited) >= MAX_SITEMAPS_PER_SITE:
            report.error(url, f"more than {MAX_SITEMAPS_PER_SITE} sitemaps for one site; "
                         "the rest is not read")
            break
        visited.add(key)
        try:
            sitemap = reader.read(url)
        except SitemapError as exc:
            message = str(exc)
            if fallback and depth == 0:
                message = f"no sitemap found: robots.txt lists none and {url} failed: {message}"
            report.error(url, message)
            continue
        report.sitemaps += 1
        _follow(report, sitemap, depth, since, stack)
        _submit(report, sitemap, producer, since, max_urls, force_priority, on_entries,
                {"job": job, "job_spec": job_spec} if job is not None else {})
        if on_progress is not None:
            on_progress(report)
    return report


def _follow(report: SiteReport, sitemap: Sitemap, depth: int, since: datetime | None,
            stack: list[tuple[str, int]]) -> None:
    if sitemap.truncated:
        report.error(sitemap.url, f"more than {MAX_URLS_PER_SITEMAP} entries; only the first "
                     f"{MAX_URLS_PER_SITEMAP} were read")
    if sitemap.skipped:
        logger.warning("sitemap %s: %d entries without a usable URL skipped", sitemap.url,
                       sitemap.skipped)
    if not sitemap.children:
        return
    if depth >= MAX_INDEX_DEPTH:
        report.error(sitemap.url, f"sitemap indexes nested deeper than {MAX_INDEX_DEPTH}; "
                     f"its {len(sitemap.children)} children are not read")
        return
    fresh = [c for c in sitemap.children
             if since is None or c.lastmod is None or c.lastmod >= since]
    if len(fresh) < len(sitemap.children):
        logger.info("sitemap %s: %d children unchanged since %s, not fetched", sitemap.url,
                    len(sitemap.children) - len(fresh), since)
    stack.extend((child.url, depth + 1) for child in reversed(fresh))


def _submit(report: SiteReport, sitemap: Sitemap, producer: Producer, since: datetime | None,
            max_urls: int | None, force_priority: bool,
            on_entries: Callable[[list[Entry]], None] | None = None,
            job_args: dict[str, Any] | None = None) -> None:
    entries = []
    for entry in sitemap.pages:
        if since is not None and entry.lastmod is not None and entry.lastmod < since:
            report.filtered += 1
        else:
            entries.append(entry)
    if max_urls is not None:
        entries = entries[:max(0, max_urls - report.summary.read)]
    if entries:
        report.summary.merge(producer.submit([e.url for e in entries],
                                             force_priority=force_priority, **(job_args or {})))
        if on_entries is not None:
            on_entries(entries)
