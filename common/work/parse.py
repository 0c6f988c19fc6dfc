"""HTML parsing on the worker's hot path: bytes in, one immutable :class:`Page` out.

Pipeline, cheapest first (``bench/parse_cost.py`` measures the whole call on a 30 KB page
with 100 links):

1. :mod:`common.work.charset` refuses bodies that look binary and decodes the rest in the HTML
   spec's order of trust (BOM, HTTP ``charset``, ``<meta>``, detection) into UTF-8 bytes.
2. lxml's libxml2 HTML parser builds the tree from those bytes with the encoding forced, so a
   ``<meta>`` that disagrees with step 1 cannot make libxml2 re-decode the page.
3. One ``Element.iter`` walk reads title, description, content-language, ``<base>`` and
   canonical; a compiled XPath collects ``<a href>``. Links are resolved by hand for the
   common shapes because calling ``urljoin`` for every link is slow.
4. ``<script>``/``<style>``/``<noscript>``/``<template>`` are stripped and the text nodes
   under ``<body>`` give ``text_length`` (joined with spaces, whitespace-collapsed) and
   ``content_hash`` (whitespace removed), both counted in C passes over the bytes. The
   ``<title>`` is not part of it.

Failure contract: empty or whitespace-only bodies give an empty :class:`Page`; bodies that
look binary (a NUL, or more than a few control bytes, up front) raise :class:`NotHTML`, and
so does the rare document libxml2 refuses outright. Nothing else is raised for bad input.

Bounded cost (NOTES #50): what a page *builds* is capped, not only its bytes. A body with more
than ``max_tags`` ``<`` is cut before the one past the cap, so the tree holds at most that
many elements (libxml2 spends ~160 bytes a node: 10 MiB of ``<p>a`` built 5 million nodes and
800 MB); a body over :data:`LONG_TAG_SCAN_BYTES` is also cut before a start tag longer than
:data:`LONG_TAG_BYTES` holding more than :data:`LONG_TAG_MAX_SPACES` spaces (libxml2's check
for duplicate attributes is quadratic: 40,000 attributes in one tag take 4-7 s). The page's
``cut`` names it (``tags``, ``long_tag``; the record's ``parse_cut``); what was before it is parsed as usual.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

from lxml import etree

from common.core.errors import FleetError
from common.work import links
from common.work.charset import decode_to_utf8, is_html, looks_binary

__all__ = ["NotHTML", "Page", "is_html", "parse_html"]  # is_html lives in charset

HASH_DIGEST_BYTES = 16

_ASCII_WS = " \t\n\r\f"
_ASCII_WS_BYTES = b" \t\n\r\f"
_UTF8_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))
# Maps ASCII whitespace to 0 and every other byte to 1 (see _measure_text).
_SHAPE_TABLE = bytes(0 if byte in _ASCII_WS_BYTES else 1 for byte in range(256))

_HREFS = etree.XPath("//a/@href", smart_strings=False)
_BODY_TEXT = etree.XPath("/html/body//text()", smart_strings=False)
# Read with Element.iter(*tags), one C-level walk (~3 us on the bench page) instead of four
# '//' XPaths (~36 us); the whole document is walked because sloppy markup can push these
# out of <head>.
_METADATA_TAGS = ("title", "base", "link", "meta")
_INVISIBLE_TAGS = ("script", "style", "noscript", "template")

_thread_state = threading.local()

#: Pages over this many bytes are scanned for a start tag longer than LONG_TAG_BYTES (a smaller
#: page holds at most ~16,000 attributes, under a second of libxml2's quadratic check).
LONG_TAG_SCAN_BYTES = 32_768
LONG_TAG_BYTES = 8_192
#: A long tag with more spaces than this is an attribute flood; a long ``data:`` URI has none.
LONG_TAG_MAX_SPACES = 1_024
_LONG_TAG = re.compile(rb"<[^<>]{%d}[^<>]*" % LONG_TAG_BYTES)
_SPACES = re.compile(rb"[ \t\n\r\f]")


class NotHTML(FleetError, ValueError):
    """The body is not HTML: it looks binary, or libxml2 cannot build a tree from it."""

    reason = "not_html"


@dataclass(frozen=True, slots=True)
class Page:
    """What the worker keeps from one HTML page.

    ``links`` are absolute http(s) URLs without fragments, in document order, de-duplicated
    and capped at ``max_links`` (``links_truncated`` says the cap was hit). ``text_length``
    is the length of the body's visible text with runs of whitespace collapsed to one space;
    ``content_hash`` hashes that text without its whitespace, so whitespace-only edits keep it.
    ``canonical_truncated``: the page named a canonical longer than links.MAX_URL_CHARS, so
    ``canonical`` is None. Title and description are the page's, uncapped: the result record
    caps them (:mod:`common.work.record`).
    """

    title: str | None
    description: str | None
    canonical: str | None
    language: str | None
    links: tuple[str, ...]
    text_length: int
    content_hash: str
    encoding: str
    links_truncated: bool = False
    canonical_truncated: bool = False
    cut: str | None = None  # the cap that cut the body before parsing: tags, long_tag

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (``links`` as a list)."""
        return {
            "title": self.title,
            "description": self.description,
            "canonical": self.canonical,
            "language": self.language,
            "links": list(self.links),
            "links_truncated": self.links_truncated,
            "text_length": self.text_length,
            "content_hash": self.content_hash,
            "encoding": self.encoding,
            "canonical_truncated": self.canonical_truncated,
            "cut": self.cut,
        }


EMPTY_TEXT_HASH = hashlib.blake2b(b"", digest_size=HASH_DIGEST_BYTES).hexdigest()


def parse_html(body: bytes, base_url: str, content_type: str | None = None,
               max_links: int = 10_000,
               on_tree: Callable[[etree._Element, str], None] | None = None,
               max_tags: int = 100_000) -> Page:
    """Parse an HTML body into a :class:`Page`.

    Args:
        body: The raw response body.
        base_url: The final URL of the response (after redirects); relative links resolve
            against it, or against ``<base href>`` when the page has one.
        content_type: The ``Content-Type`` header, used only for its charset.
        max_links: Keep at most this many links; more sets ``links_truncated``.
        on_tree: Called once with the tree (invisible elements already stripped) and the
            document's base URL, so extraction rules (common/work/extract.py) read the same
            tree: the page is parsed once. Not called for an empty page.
        max_tags: Parse at most this many ``<`` of the body (MAX_PAGE_TAGS); the page's
            ``cut`` says ``tags`` when the body was cut there.

    Returns:
        The page; empty (no title, no links, zero text) for an empty or blank body.

    Raises:
        NotHTML: The body looks binary, or libxml2 could not build a tree at all.
        ValueError: ``max_links`` is negative.
    """
    if max_links < 0:
        raise ValueError(f"max_links must be >= 0, got {max_links}")
    root, encoding, cut = _tree(body, base_url, content_type, max_tags)
    if root is None:
        return Page(None, None, None, None, (), 0, EMPTY_TEXT_HASH, encoding,
                    cut=cut)

    meta = _read_metadata(root)
    base = _base(meta, base_url)
    found, links_truncated = links.extract_links(_HREFS(root), base, max_links)

    # Links are read before stripping because links inside <noscript> are real navigation
    # for clients without JavaScript, which is what a crawler is.
    etree.strip_elements(root, *_INVISIBLE_TAGS, with_tail=False)
    text_length, content_hash = _measure_text(_BODY_TEXT(root))
    if on_tree is not None:
        on_tree(root, base.url)
    href = meta.canonical_href
    canonical = links.resolve(href, base) if href else None
    return Page(
        title=meta.title, description=meta.description, canonical=canonical,
        language=_language(root, meta.language), links=found, links_truncated=links_truncated,
        text_length=text_length, content_hash=content_hash, encoding=encoding,
        canonical_truncated=canonical is None and href is not None
        and _too_long(href, base), cut=cut,
    )


def bound_body(body: bytes, max_tags: int) -> tuple[bytes, str | None]:
    """``body`` cut before what would make libxml2's tree too costly, and the cap that cut it.

    Bodies longer than ``max_tags`` bytes get one C pass counting ``<`` (~1 us per KB); only
    bodies over LONG_TAG_SCAN_BYTES are searched for a long tag.
    """
    truncated = None
    # A body can hold more than max_tags "<" only when it is longer: ordinary pages skip the count.
    if len(body) > max_tags and body.count(b"<") > max_tags:
        at = -1
        for _ in range(max_tags + 1):  # ~15 ms for 100,000; split() would copy the whole body
            at = body.find(b"<", at + 1)
        body = body[:at]  # just before the first "<" past the cap
        truncated = "tags"
    if len(body) > LONG_TAG_SCAN_BYTES:
        for match in _LONG_TAG.finditer(body):
            if len(_SPACES.findall(match.group())) > LONG_TAG_MAX_SPACES:
                body = body[:match.start()]
                truncated = "long_tag"
                break
    return body, truncated


def _too_long(href: str, base: links.Base) -> bool:
    """Whether :func:`links.resolve` dropped ``href`` because its URL is over MAX_URL_CHARS
    (rather than for its scheme or a missing host). Only asked about a dropped canonical."""
    if len(base.url) + len(href) <= links.MAX_URL_CHARS:
        return False  # no shape resolves to more than the base plus the href
    try:
        url = urljoin(base.url, href.strip(_ASCII_WS)).partition("#")[0]
    except ValueError:
        return False
    return url.startswith(("http://", "https://")) and len(url) > links.MAX_URL_CHARS


def _measure_text(nodes: list[str]) -> tuple[int, str]:
    """``(text_length, content_hash)`` of the visible text nodes in a handful of C passes,
    without building the collapsed text: ``" ".join(text.split())`` makes one Python object
    per word, a large share of the parse before (NOTES #25 has the figures).

    ``text_length`` is the length of the nodes joined with spaces, runs of ASCII whitespace
    collapsed to one space and trimmed (joining with a space makes '<p>a</p><p>b</p>' count as
    two words, as a browser shows them). ``content_hash`` is BLAKE2b over the UTF-8 text with
    all ASCII whitespace removed, so whitespace-only edits (re-indenting, minifying) keep it.
    """
    data = " ".join(nodes).encode("utf-8", "surrogatepass")
    # One byte per character, 0 for whitespace and 1 for anything else (UTF-8 continuation
    # bytes dropped so a multi-byte character counts once), read as one big integer: its set
    # bits are the non-space characters, and a 1-byte whose preceding byte is 0 starts a word.
    shape = int.from_bytes(data.translate(_SHAPE_TABLE, _UTF8_CONTINUATION_BYTES), "big")
    words = (shape & ~(shape >> 8)).bit_count()
    length = shape.bit_count() + max(words - 1, 0)
    digest = hashlib.blake2b(data.translate(None, _ASCII_WS_BYTES), digest_size=HASH_DIGEST_BYTES)
    return length, digest.hexdigest()


# --- tree reading ---------------------------------------------------------------------
def parse_tree(body: bytes, base_url: str, content_type: str | None = None,
               max_tags: int = 100_000) -> tuple[etree._Element, str] | None:
    """The tree :func:`parse_html` hands to ``on_tree`` and its base URL, without the page's
    own fields (links, text measures): for the user-code child, which reads only the tree.
    None for an empty page; :class:`NotHTML` as parse_html."""
    root, _encoding, _cut = _tree(body, base_url, content_type, max_tags)
    if root is None:
        return None
    base = _base(_read_metadata(root), base_url)
    etree.strip_elements(root, *_INVISIBLE_TAGS, with_tail=False)
    return root, base.url


def _tree(body: bytes, base_url: str, content_type: str | None,
          max_tags: int) -> tuple[etree._Element | None, str, str | None]:
    """(root or None for an empty page, the encoding, the cap that cut the body)."""
    if looks_binary(body, content_type):
        raise NotHTML(f"body of {base_url} looks binary, not HTML")
    _, encoding, utf8_body = decode_to_utf8(body, content_type)
    utf8_body, cut = bound_body(utf8_body, max_tags)
    try:
        # None for empty, blank or comment-only input.
        return etree.fromstring(utf8_body, _parser()), encoding, cut
    except (etree.LxmlError, ValueError) as exc:
        raise NotHTML(f"libxml2 could not parse {base_url}: {exc}") from exc


def _base(meta: _Metadata, base_url: str) -> links.Base:
    base = links.make_base(base_url)
    if meta.base_href is not None:
        # The spec ignores a <base href> that does not resolve to a usable URL.
        resolved = links.resolve(meta.base_href, base)
        if resolved is not None:
            base = links.make_base(resolved)
    return base


def _parser() -> etree.HTMLParser:
    # One parser per thread: lxml serialises concurrent use of a shared parser, and a
    # per-thread parser lets libxml2 run with the GIL released.
    parser = getattr(_thread_state, "parser", None)
    if parser is None:
        parser = etree.HTMLParser(
            encoding="utf-8",  # the bytes we feed are always UTF-8; never trust <meta> here
            remove_comments=True, remove_pis=True, no_network=True, collect_ids=False,
            default_doctype=False,
        )
        _thread_state.parser = parser
    return parser


def _collapse(value: str | None) -> str:
    return " ".join(value.split()) if value else ""


@dataclass(slots=True)
class _Metadata:
    title: str | None = None
    description: str | None = None
    language: str | None = None  # from <meta http-equiv="content-language">
    base_href: str | None = None
    canonical_href: str | None = None


def _read_metadata(root: etree._Element) -> _Metadata:
    """Collect the first title, description, content-language, base and canonical."""
    found = _Metadata()
    for element in root.iter(*_METADATA_TAGS):
        tag = element.tag
        if tag == "meta":
            content = element.get("content")
            if content is None:
                continue
            name = element.get("name")
            if name is not None:
                if found.description is None and name.strip().lower() == "description":
                    found.description = _collapse(content) or None
                continue
            equiv = element.get("http-equiv")
            if found.language is None and equiv and equiv.strip().lower() == "content-language":
                # 'de, en' lists audiences; the first is the best guess at the text's language.
                found.language = content.partition(",")[0].strip() or None
        elif tag == "link":
            rel = element.get("rel")
            href = element.get("href")
            if found.canonical_href is None and href and rel and "canonical" in rel.lower().split():
                found.canonical_href = href
        elif tag == "base":
            if found.base_href is None:
                found.base_href = element.get("href")
        elif found.title is None and next(element.iterancestors("svg"), None) is None:
            # An SVG <title> is a tooltip, not the document title.
            found.title = _collapse("".join(element.itertext())) or None
    return found


def _language(root: etree._Element, meta_language: str | None) -> str | None:
    # The spec reads lang="" as "unknown", but CMS templates emit it by accident, so an
    # empty value falls through to the <meta> like a missing one.
    for attribute in ("lang", "xml:lang"):
        value = root.get(attribute)
        if value and value.strip():
            return value.strip()
    return meta_language
