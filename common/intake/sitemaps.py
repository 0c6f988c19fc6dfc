"""Sitemaps: find them, fetch them under the fleet's rules, parse them safely, feed the Producer.

A *site* (``https://host/``) is read from the ``Sitemap:`` lines of its robots.txt, else from
``/sitemap.xml``; any other URL is taken as a sitemap itself. Sitemap indexes are followed
depth first (MAX_INDEX_DEPTH levels, each sitemap read once per site, so a loop ends). Formats,
told apart by content and never by file name: gzip (magic bytes ``1f 8b``) around any of
them, XML ``<urlset>`` / ``<sitemapindex>``, RSS 2.0 / RSS 1.0 / Atom feeds, and plain text
(one http(s) URL a line).

Hostile input:

* XML goes through lxml's pull parser with entity resolution, DTD loading and network access
  off, and a resolver that refuses every external load; a DOCTYPE that declares any entity is
  refused outright, so neither XXE nor entity expansion (billion laughs) can happen.
* A body is at most MAX_SITEMAP_BYTES (the protocol's 50 MB) as downloaded, after
  Content-Encoding, and after our own gunzip, which inflates in bounded steps and stops at the
  cap: a gzip bomb is refused after at most 50 MB of streaming work, never held in memory.
* At most MAX_URLS_PER_SITEMAP entries are taken from one file (the rest is not read and the
  file is reported), at most MAX_XML_ELEMENTS elements parsed, _MAX_GZIP_MEMBERS gzip members
  inflated. Every element is freed as soon as it ends, so memory stays flat.
* A sitemap that fails (HTTP error, refused, malformed) contributes no URL at all: its entries
  are submitted only once the whole file has parsed. The error names the sitemap and the run
  goes on with the others.

Fetches use :class:`common.web.fetch.Fetcher` (address guard, own redirects, timeouts, caps) with
the body cap raised to MAX_SITEMAP_BYTES, and take a rate-limit permit for their domain first,
sleeping out the booked slot when the domain is busy (a producer may block; it is no worker).
robots.txt comes from the fleet's robots cache (``robots:{origin}``) when a worker already
fetched it, and is stored there when we fetch it.

``--since``: an entry is kept when its lastmod (sitemaps), pubDate/dc:date (RSS) or
updated/published (Atom) is at or after the given time, *or when it has none* (or an
unparsable one): a missing date says nothing about age. A child sitemap listed in an index
with a lastmod before ``since`` is not fetched: nothing in it changed since then.
"""

from __future__ import annotations

import email.utils
import itertools
import logging
import re
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

import redis
from lxml import etree
from protego import Protego

from common.core.config import Settings
from common.core.errors import FetchError, FleetError, InvalidURL, ServiceUnavailable
from common.core.urls import canonicalize, domain_of
from common.intake.producer import Producer, ProduceSummary
from common.web.fetch import Fetcher, FetchResult
from common.web.ratelimit import RateLimiter
from common.web.robots import RULES, RobotsRules, RobotsStore, entry_for_response, origin_of

logger = logging.getLogger(__name__)

MAX_SITEMAP_BYTES = 50 * 1024 * 1024  # sitemaps.org: 52,428,800 bytes uncompressed
MAX_URLS_PER_SITEMAP = 50_000  # sitemaps.org: entries per sitemap or index file
MAX_INDEX_DEPTH = 3  # index → index → index → urlset; the protocol itself allows one level
MAX_SITEMAPS_PER_SITE = 100_000  # sitemap files read for one site in one run
# Each element costs a few microseconds of Python; a real file has ~5-25 per entry (image,
# video, news extensions), so this bounds the CPU a hostile file of tiny elements can take.
MAX_XML_ELEMENTS = 2_000_000
MAX_LOC_CHARS = 16 * 1024  # a longer <loc> is junk, not worth a dead-letter message
MAX_TEXT_LINE_BYTES = 16 * 1024  # text sitemaps: longer lines are skipped unread
_INFLATE_IN_BYTES = 64 * 1024  # compressed bytes handed to zlib per step
_INFLATE_OUT_BYTES = 1024 * 1024  # most bytes one zlib step may produce
_FEED_BYTES = 1024 * 1024  # uncompressed bytes fed to the parser per step
_GZIP_MAGIC = b"\x1f\x8b"
_ATOM_NS = "http://www.w3.org/2005/Atom"
_RDF_ABOUT = "{http://www.w3.org/1999/02/22-rdf-syntax-ns#}about"
_GZIP_WBITS = 31  # zlib: gzip header and trailer, 32 KiB window
_MAX_GZIP_MEMBERS = 10_000  # members in a row are legal; millions of tiny ones are an attack
_ENTITIES_REFUSED = "the DOCTYPE declares entities (XXE / entity expansion); refused"


class SitemapError(FleetError):
    """One sitemap could not be used: fetch failed, refused as unsafe or too big, malformed."""


@dataclass(frozen=True)
class Entry:
    """A URL from a sitemap (a page, or a child sitemap of an index) and its date, if any."""

    url: str
    lastmod: datetime | None = None


@dataclass
class Sitemap:
    """One parsed sitemap file.

    Attributes:
        kind: ``urlset``, ``index``, ``rss``, ``atom`` or ``text``.
        pages: URLs to crawl.
        children: sitemaps listed by an index.
        truncated: more than MAX_URLS_PER_SITEMAP entries; only that many were read.
        skipped: entries with no usable URL (empty, too long, not http(s) in a text file).
    """

    url: str
    kind: str
    pages: list[Entry] = field(default_factory=list)
    children: list[Entry] = field(default_factory=list)
    truncated: bool = False
    skipped: int = 0


# -- dates ------------------------------------------------------------------------------------

_W3C_PARTIAL = re.compile(r"(\d{4})(?:-(\d{2}))?")


def parse_date(raw: str | None) -> datetime | None:
    """A sitemap or feed date as an aware datetime (UTC when no zone is given), else None.

    Accepts W3C datetimes (``2024``, ``2024-05``, ``2024-05-01``, ``2024-05-01T10:00Z`` …)
    and RFC 822 dates (RSS ``pubDate``).
    """
    text = (raw or "").strip()
    if not text or len(text) > 64:
        return None
    value: datetime | None = None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        partial = _W3C_PARTIAL.fullmatch(text)
        if partial:
            try:
                value = datetime(int(partial.group(1)), int(partial.group(2) or 1), 1)
            except ValueError:
                return None
        else:
            try:
                value = email.utils.parsedate_to_datetime(text)
            except (TypeError, ValueError, IndexError):
                return None
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


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


# -- bytes: gzip by magic, capped -------------------------------------------------------------


def _too_big() -> SitemapError:
    return SitemapError(f"decompresses to more than {MAX_SITEMAP_BYTES} bytes (the protocol's "
                        "50 MB limit); refused")


def _gunzip(data: bytes) -> Iterator[bytes]:
    """Inflate gzip ``data`` (members in a row allowed) in bounded steps, stopping at the cap."""
    total = 0
    members = 1
    pos = 0
    pending = b""
    inflater = zlib.decompressobj(wbits=_GZIP_WBITS)
    while True:
        if not pending and pos < len(data):
            pending = data[pos:pos + _INFLATE_IN_BYTES]
            pos += len(pending)
        try:
            out = inflater.decompress(pending, _INFLATE_OUT_BYTES)
        except zlib.error as exc:
            raise SitemapError(f"not valid gzip data: {exc}") from None
        pending = inflater.unconsumed_tail
        if out:
            total += len(out)
            if total > MAX_SITEMAP_BYTES:
                raise _too_big()
            yield out
        if inflater.eof:
            pending = inflater.unused_data
            if not pending.strip(b"\0") and not data[pos:].strip(b"\0"):
                return  # done; trailing zero padding (some tools write it) is fine
            members += 1
            if members > _MAX_GZIP_MEMBERS:
                raise SitemapError(f"more than {_MAX_GZIP_MEMBERS} gzip members; refused")
            inflater = zlib.decompressobj(wbits=_GZIP_WBITS)
        elif not out and not pending and pos >= len(data):
            raise SitemapError("gzip data ends early (truncated file)")


def decoded_chunks(body: bytes) -> Iterator[bytes]:
    """The sitemap's bytes in steps: gunzipped when they start with the gzip magic."""
    if body[:2] == _GZIP_MAGIC:
        yield from _gunzip(body)
        return
    if len(body) > MAX_SITEMAP_BYTES:
        raise _too_big()
    for start in range(0, len(body), _FEED_BYTES):
        yield body[start:start + _FEED_BYTES]


# -- parsing ----------------------------------------------------------------------------------


def parse_sitemap(body: bytes, base_url: str) -> Sitemap:
    """Parse one sitemap file of any supported format.

    Args:
        body: the bytes as fetched (gzip or not).
        base_url: the sitemap's final URL, to resolve relative links against.

    Raises:
        SitemapError: refused (unsafe, too big), malformed, or not a sitemap at all.
    """
    chunks = decoded_chunks(body)
    leading: list[bytes] = []  # blank chunks before the first byte that tells the format
    sniff = b""
    for chunk in chunks:
        leading.append(chunk)
        sniff = chunk.lstrip(b" \t\r\n\xef\xbb\xbf")
        if sniff:
            break
    if not sniff:
        raise SitemapError("empty sitemap")
    rest = itertools.chain(leading, chunks)
    if sniff[:1] == b"<" or sniff[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return _parse_xml(rest, base_url)
    return _parse_text(rest, base_url)


class _RefuseResolver(etree.Resolver):
    """Belt and braces: should libxml2 ever try to load a DTD or entity, it gets nothing."""

    def resolve(self, system_url: str | None, public_id: str | None, context: Any) -> Any:
        raise SitemapError(f"refused to load external resource {system_url or public_id!r}")


def _new_parser() -> etree.XMLPullParser:
    parser = etree.XMLPullParser(
        events=("start", "end"), resolve_entities=False, no_network=True, load_dtd=False,
        dtd_validation=False, huge_tree=False, remove_comments=True, remove_pis=True,
        recover=False)
    parser.resolvers.add(_RefuseResolver())
    return parser


def _local(tag: Any) -> str:
    return etree.QName(tag).localname if isinstance(tag, str) else ""


@dataclass(frozen=True)
class _Format:
    kind: str
    record: str  # the element that holds one entry
    depth: int  # its depth (root = 1)
    dates: tuple[str, ...]  # child elements holding its date, first found wins


_FORMATS = {
    "urlset": _Format("urlset", "url", 2, ("lastmod",)),
    "sitemapindex": _Format("index", "sitemap", 2, ("lastmod",)),
    "rss": _Format("rss", "item", 3, ("pubDate", "date", "updated")),
    "RDF": _Format("rss", "item", 2, ("date",)),
    "feed": _Format("atom", "entry", 2, ("updated", "published")),
}


class _XmlReader:
    """Turns pull-parser events into entries. Every element is freed as soon as it ends (and
    the fields of a record read from its children as they end), so memory stays flat however
    many elements a file holds, at any depth."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.format: _Format | None = None
        self.depth = 0
        self.elements = 0
        self.result: Sitemap | None = None
        self.fields: dict[str, str] | None = None  # of the record being read

    def consume(self, events: Iterable[tuple[str, Any]]) -> bool:
        """Handle parser events; True once the entry cap is reached (stop reading)."""
        for event, elem in events:
            fmt = self.format
            if event == "start":
                self.depth += 1
                self.elements += 1
                if self.elements > MAX_XML_ELEMENTS:
                    raise SitemapError(f"more than {MAX_XML_ELEMENTS} XML elements; refused")
                if self.depth == 1:
                    self._start_root(elem)
                elif fmt and self.depth == fmt.depth and _local(elem.tag) == fmt.record:
                    self.fields = {}
                continue
            if fmt is not None and self.fields is not None:
                if self.depth == fmt.depth + 1:
                    _read_field(self.fields, elem, fmt)
                elif self.depth == fmt.depth:
                    capped = self._take(elem, fmt, self.fields)
                    self.fields = None
                    if capped:
                        return True
            if self.depth > 1:
                # lxml's iterparse advice: clear the element, delete the siblings before it,
                # never the element itself (the parser may still be working on it).
                elem.clear()
                parent = elem.getparent()
                while elem.getprevious() is not None:
                    del parent[0]
            self.depth -= 1
        return False

    def _start_root(self, root: Any) -> None:
        dtd = root.getroottree().docinfo.internalDTD
        if dtd is not None and any(True for _ in dtd.iterentities()):
            raise SitemapError(_ENTITIES_REFUSED)
        name = _local(root.tag)
        fmt = _FORMATS.get(name)
        if fmt is None:
            raise SitemapError(f"not a sitemap or feed (root element <{name[:40]}>)")
        self.format = fmt
        self.result = Sitemap(self.url, fmt.kind)

    def _take(self, record: Any, fmt: _Format, fields: dict[str, str]) -> bool:
        result = self.result
        assert result is not None
        entries = result.children if fmt.kind == "index" else result.pages
        if len(entries) >= MAX_URLS_PER_SITEMAP:
            result.truncated = True
            return True
        raw = fields.get("url", "")
        if not raw and fmt.kind == "rss":
            guid = fields.get("guid", "")
            raw = guid if guid.lower().startswith(("http://", "https://")) else ""
            raw = raw or (record.get(_RDF_ABOUT) or "").strip()
        if not raw or len(raw) > MAX_LOC_CHARS:
            result.skipped += 1
            return False
        lastmod = next((parse_date(fields[name]) for name in fmt.dates if name in fields), None)
        if not raw[:8].lower().startswith(("http://", "https://")):
            raw = urljoin(self.url, raw)  # relative (not allowed by the protocol, but seen)
        entries.append(Entry(raw, lastmod))
        return False


def _read_field(fields: dict[str, str], elem: Any, fmt: _Format) -> None:
    """Note what one child of a record says: its URL (<loc>, RSS <link>/<guid>, Atom
    <link href>) or a date. The first of each kind wins."""
    if not isinstance(elem.tag, str):
        return
    qname = etree.QName(elem.tag)
    name = qname.localname
    if name in fmt.dates:
        fields.setdefault(name, elem.text or "")
    elif fmt.kind == "atom":
        if name == "link" and elem.get("rel", "alternate") == "alternate":
            fields.setdefault("url", (elem.get("href") or "").strip())
    elif fmt.kind == "rss":
        if name == "link" and qname.namespace != _ATOM_NS:  # RSS 0.9x-2.0 and 1.0, not Atom
            fields.setdefault("url", (elem.text or "").strip())
        elif name == "guid" and elem.get("isPermaLink", "true") != "false":
            fields.setdefault("guid", (elem.text or "").strip())
    elif name == "loc":
        fields.setdefault("url", (elem.text or "").strip())


def _refuse_entity_declarations(chunk: bytes) -> None:
    """Refuse before parsing when the first chunk shows a DOCTYPE declaring entities.

    libxml2 would stop a billion-laughs document itself, with a less telling message; the
    check on the parsed DTD in :class:`_XmlReader` covers what this byte scan cannot see (a
    DOCTYPE past the first chunk, UTF-16 documents).
    """
    doctype = chunk.find(b"<!DOCTYPE")
    if doctype >= 0 and chunk.find(b"<!ENTITY", doctype) >= 0:
        raise SitemapError(_ENTITIES_REFUSED)


def _parse_xml(chunks: Iterator[bytes], url: str) -> Sitemap:
    parser = _new_parser()
    reader = _XmlReader(url)
    try:
        capped = False
        for i, chunk in enumerate(chunks):
            if i == 0:
                _refuse_entity_declarations(chunk)
            parser.feed(chunk)
            if reader.consume(parser.read_events()):
                capped = True
                break
        if not capped:
            parser.close()
            reader.consume(parser.read_events())
    except etree.XMLSyntaxError as exc:
        raise SitemapError(f"malformed XML: {exc}") from None
    if reader.result is None:
        raise SitemapError("malformed XML: no root element")
    return reader.result


def _parse_text(chunks: Iterator[bytes], url: str) -> Sitemap:
    result = Sitemap(url, "text")
    partial = b""
    overlong = False  # inside a line already known to be too long: skip to its end
    for chunk in chunks:
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        for line in lines:
            if overlong:
                overlong = False
                result.skipped += 1
                continue
            if _take_text_line(result, line):
                return result
        if len(partial) > MAX_TEXT_LINE_BYTES:
            partial, overlong = b"", True
    if overlong:
        result.skipped += 1
    elif partial:
        _take_text_line(result, partial)
    if not result.pages and result.skipped:
        raise SitemapError("not a sitemap: neither XML nor lines of http(s) URLs")
    return result


def _take_text_line(result: Sitemap, line: bytes) -> bool:
    """Add one text-sitemap line; True once the entry cap is reached."""
    if line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark on the first line
        line = line[3:]
    text = line.strip().decode("utf-8", errors="replace")
    if not text:
        return False
    if len(result.pages) >= MAX_URLS_PER_SITEMAP:
        result.truncated = True
        return True
    if len(text) > MAX_LOC_CHARS or not text.lower().startswith(("http://", "https://")):
        result.skipped += 1
        return False
    result.pages.append(Entry(text))
    return False


# -- fetching ---------------------------------------------------------------------------------


class SitemapReader:
    """Fetches sitemaps and robots.txt with the fleet's rules, and parses them."""

    def __init__(self, settings: Settings, client: redis.Redis,
                 fetcher: Fetcher | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.fetcher = fetcher or Fetcher(settings.with_overrides(
            max_body_bytes=MAX_SITEMAP_BYTES))
        self.limiter = RateLimiter(client, settings)
        self.robots = RobotsStore(client, settings.robots_user_agent, settings.robots_ttl_s)
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
        """GET ``url`` after taking a rate-limit permit for its domain (waiting if need be)."""
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
        try:
            return self.fetcher.fetch(url, accept_any_type=True)
        except FetchError as exc:
            raise SitemapError(f"fetch failed ({exc.kind}): {exc}") from None

    def robots_sitemaps(self, origin: str) -> list[str]:
        """The ``Sitemap:`` URLs of ``origin``'s robots.txt (cached fleet-wide), absolute."""
        try:
            rules = self.robots.get(origin)
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"Redis failed (robots cache): {exc}") from None
        if rules is None:
            rules = self._fetch_robots(origin)
        if rules.entry.status != RULES:
            return []
        robots_url = origin + "/robots.txt"
        return [urljoin(robots_url, u.strip()) for u in Protego.parse(rules.entry.body).sitemaps]

    def _fetch_robots(self, origin: str) -> RobotsRules:
        try:
            response = self.fetch(origin + "/robots.txt")
            entry = entry_for_response(response.status, response.body)
        except SitemapError as exc:
            entry = entry_for_response(None, b"", str(exc))
        logger.info("robots.txt for %s: %s %s", origin, entry.status, entry.detail)
        try:
            return self.robots.put(origin, entry)
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"Redis failed (robots cache): {exc}") from None


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
                 on_progress: Callable[[SiteReport], None] | None = None) -> SiteReport:
    """Read every sitemap reachable from ``target`` and submit their URLs to ``producer``.

    Each sitemap's URLs are submitted as soon as that file has parsed (memory stays at one
    file's entries, at most MAX_URLS_PER_SITEMAP).

    Args:
        target: a site root (discovery through robots.txt) or a sitemap URL.
        since: keep entries dated at or after this, and undated ones.
        max_urls: stop once this many URLs of this site were submitted.

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
        _submit(report, sitemap, producer, since, max_urls, force_priority)
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
            max_urls: int | None, force_priority: bool) -> None:
    urls = []
    for entry in sitemap.pages:
        if since is not None and entry.lastmod is not None and entry.lastmod < since:
            report.filtered += 1
        else:
            urls.append(entry.url)
    if max_urls is not None:
        urls = urls[:max(0, max_urls - report.summary.read)]
    if urls:
        report.summary.merge(producer.submit(urls, force_priority=force_priority))
