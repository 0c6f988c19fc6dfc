"""Sitemap files: XML urlsets and indexes, RSS/Atom feeds and text sitemaps, gzipped or not,
parsed safely into a :class:`Sitemap` (bytes in; no network, no Redis).

Formats are told apart by content, never by file name: gzip around any of them, XML
``<urlset>`` / ``<sitemapindex>``, RSS 2.0 / RSS 1.0 / Atom feeds, plain text (one http(s)
URL a line). Hostile input:

* XML goes through lxml's pull parser with entity resolution, DTD loading and network access
  off, and a resolver that refuses every external load; a DOCTYPE that declares any entity is
  refused outright, so neither XXE nor entity expansion (billion laughs) can happen.
* A body is at most MAX_SITEMAP_BYTES (the protocol's 50 MB) as given and once gunzipped
  (:mod:`common.intake.inflate`: bounded steps, stops at the cap; a bomb is never held).
* At most MAX_URLS_PER_SITEMAP entries are taken from one file (the rest is not read; the
  result says ``truncated``), at most MAX_XML_ELEMENTS elements parsed. Every element is
  freed as soon as it ends, so memory stays flat.
"""

from __future__ import annotations

import email.utils
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin

from lxml import etree

from common.core.errors import FleetError
from common.intake.inflate import InflateError, InflateTooLarge, decoded_chunks

MAX_SITEMAP_BYTES = 50 * 1024 * 1024  # sitemaps.org: 52,428,800 bytes uncompressed
MAX_URLS_PER_SITEMAP = 50_000  # sitemaps.org: entries per sitemap or index file
# Each element costs a few microseconds of Python; a real file has ~5-25 per entry (image,
# video, news extensions), so this bounds the CPU a hostile file of tiny elements can take.
MAX_XML_ELEMENTS = 2_000_000
MAX_LOC_CHARS = 16 * 1024  # a longer <loc> is junk, not worth a dead-letter message
MAX_TEXT_LINE_BYTES = 16 * 1024  # text sitemaps: longer lines are skipped unread
_ATOM_NS = "http://www.w3.org/2005/Atom"
_RDF_ABOUT = "{http://www.w3.org/1999/02/22-rdf-syntax-ns#}about"
_ENTITIES_REFUSED = "the DOCTYPE declares entities (XXE / entity expansion); refused"
_TOO_BIG = (f"decompresses to more than {MAX_SITEMAP_BYTES} bytes (the protocol's 50 MB "
            "limit); refused")


class SitemapError(FleetError):
    """One sitemap could not be used: fetch failed, refused as unsafe or too big, malformed."""


@dataclass(frozen=True)
class Entry:
    """A URL from a sitemap (a page, or a child sitemap of an index) and its date, if any."""

    url: str
    lastmod: datetime | None = None
    changefreq: str | None = None  # a urlset's <changefreq> (always, hourly ... never)


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
    partial = _W3C_PARTIAL.fullmatch(text)
    try:
        if partial:
            value = datetime(int(partial.group(1)), int(partial.group(2) or 1), 1)
        else:
            try:
                value = datetime.fromisoformat(text)
            except ValueError:
                value = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


# -- parsing ----------------------------------------------------------------------------------


def parse_sitemap(body: bytes, base_url: str) -> Sitemap:
    """Parse one sitemap file of any supported format.

    Args:
        body: the bytes as fetched (gzip or not).
        base_url: the sitemap's final URL, to resolve relative links against.

    Raises:
        SitemapError: refused (unsafe, too big), malformed, or not a sitemap at all.
    """
    try:
        chunks = decoded_chunks(body, MAX_SITEMAP_BYTES)
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
    except InflateTooLarge:
        raise SitemapError(_TOO_BIG) from None
    except InflateError as exc:
        raise SitemapError(str(exc)) from None


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
        entries.append(Entry(raw, lastmod, fields.get("changefreq", "").strip().lower() or None))
        return False


def _read_field(fields: dict[str, str], elem: Any, fmt: _Format) -> None:
    """Note what one child of a record says: its URL (<loc>, RSS <link>/<guid>, Atom
    <link href>) or a date. The first of each kind wins."""
    if not isinstance(elem.tag, str):
        return
    qname = etree.QName(elem.tag)
    name = qname.localname
    if name in fmt.dates or name == "changefreq":
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
        for i, chunk in enumerate(chunks):
            if i == 0:
                _refuse_entity_declarations(chunk)
            parser.feed(chunk)
            if reader.consume(parser.read_events()):
                break  # the entry cap: the rest is not read
        else:
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
    text = line.removeprefix(b"\xef\xbb\xbf").strip().decode("utf-8", errors="replace")  # BOM
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

