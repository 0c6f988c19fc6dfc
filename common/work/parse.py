"""HTML parsing on the worker's hot path: bytes in, one immutable :class:`Page` out.

Pipeline, cheapest first (``bench/parse_cost.py`` measures the whole call on a 30 KB page
with 100 links):

1. :mod:`common.work.charset` refuses bodies that look binary and decodes the rest in the HTML
   spec's order of trust (BOM, HTTP ``charset``, ``<meta>``, detection) into UTF-8 bytes.
2. A page nothing else reads (no rule, handler or crawl mode's follow reading: the default)
   with at most :data:`~common.work.parse_lexbor.MAX_START_TAGS` start tags is read by lexbor
   (:mod:`common.work.parse_lexbor`), about a third of the cost of the steps below, into the
   same :class:`Page`. Otherwise lxml's libxml2 HTML parser builds the tree from those bytes
   with the encoding forced, so a ``<meta>`` that disagrees with step 1 cannot make libxml2
   re-decode the page; the hook (``on_tree``) reads that tree.
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

import re
import threading
from collections.abc import Callable
from typing import Any

from lxml import etree

from common.core.errors import FleetError
from common.work import parse_lexbor
from common.work.charset import decode_to_utf8, is_html, looks_binary
from common.work.page import (
    EMPTY_TEXT_HASH,
    Metadata,
    Page,
    assemble,
    collapse,
    empty_page,
    language,
)

__all__ = ["EMPTY_TEXT_HASH", "NotHTML", "Page", "is_html", "parse_html"]  # is_html: charset's

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


def parse_html(body: bytes, base_url: str, content_type: str | None = None,
               max_links: int = 10_000,
               on_tree: Callable[[etree._Element, str], None] | None = None,
               max_tags: int = 100_000,
               on_lexbor: Callable[[Any, str], None] | None = None) -> Page:
    """Parse an HTML body into a :class:`Page`.

    Args:
        body: The raw response body.
        base_url: The final URL of the response (after redirects); relative links resolve
            against it, or against ``<base href>`` when the page has one.
        content_type: The ``Content-Type`` header, used only for its charset.
        max_links: Keep at most this many links; more sets ``links_truncated``.
        on_tree: Called once with the tree (invisible elements already stripped) and the
            document's base URL, so extraction rules (common/work/extract.py) read the same
            tree: the page is parsed once. Not called for an empty page. Without it the
            page is read by lexbor (common/work/parse_lexbor.py), a third of libxml2's cost.
        max_tags: Parse at most this many ``<`` of the body (MAX_PAGE_TAGS); the page's
            ``cut`` says ``tags`` when the body was cut there.
        on_lexbor: ``on_tree``'s equal for lexbor's tree (crawl mode's link marks): with it,
            the page may be read by lexbor, which then calls it instead of ``on_tree``.

    Returns:
        The page; empty (no title, no links, zero text) for an empty or blank body.

    Raises:
        NotHTML: The body looks binary, or libxml2 could not build a tree at all.
        ValueError: ``max_links`` is negative.
    """
    if max_links < 0:
        raise ValueError(f"max_links must be >= 0, got {max_links}")
    utf8_body, encoding, cut = _bounded_utf8(body, base_url, content_type, max_tags)
    if (on_tree is None or on_lexbor is not None) and parse_lexbor.fits(utf8_body):
        return parse_lexbor.read_page(utf8_body, base_url, encoding, cut, max_links, on_lexbor)
    root = _tree(utf8_body, base_url)
    if root is None:
        return empty_page(encoding, cut)
    meta = _read_metadata(root)
    base = meta.base(base_url)
    # A <template>'s content is inert (HTML5 parses it into a fragment of its own): not links.
    etree.strip_elements(root, "template", with_tail=False)
    hrefs = _HREFS(root)
    # Links are read before stripping because links inside <noscript> are real navigation
    # for clients without JavaScript, which is what a crawler is.
    etree.strip_elements(root, *_INVISIBLE_TAGS, with_tail=False)
    text = " ".join(_BODY_TEXT(root))
    if on_tree is not None:
        on_tree(root, base.url)
    return assemble(meta, base, hrefs, text, language(root.get("lang"), root.get("xml:lang")),
                    encoding, cut, max_links)


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


# --- tree reading ---------------------------------------------------------------------
def parse_tree(body: bytes, base_url: str, content_type: str | None = None,
               max_tags: int = 100_000) -> tuple[etree._Element, str] | None:
    """The tree :func:`parse_html` hands to ``on_tree`` and its base URL, without the page's
    own fields (links, text measures): for the user-code child, which reads only the tree.
    None for an empty page; :class:`NotHTML` as parse_html."""
    root = _tree(_bounded_utf8(body, base_url, content_type, max_tags)[0], base_url)
    if root is None:
        return None
    base = _read_metadata(root).base(base_url)
    etree.strip_elements(root, *_INVISIBLE_TAGS, with_tail=False)
    return root, base.url


def _bounded_utf8(body: bytes, base_url: str, content_type: str | None,
                  max_tags: int) -> tuple[bytes, str, str | None]:
    """(the body as UTF-8, cut by :func:`bound_body`; its encoding; the cap that cut it)."""
    if looks_binary(body, content_type):
        raise NotHTML(f"body of {base_url} looks binary, not HTML")
    _, encoding, utf8_body = decode_to_utf8(body, content_type)
    utf8_body, cut = bound_body(utf8_body, max_tags)
    return utf8_body, encoding, cut


def _tree(utf8_body: bytes, base_url: str) -> etree._Element | None:
    """libxml2's tree of a bounded UTF-8 body; None for an empty, blank or comment-only one."""
    try:
        return etree.fromstring(utf8_body, _parser())
    except (etree.LxmlError, ValueError) as exc:
        raise NotHTML(f"libxml2 could not parse {base_url}: {exc}") from exc


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


def _read_metadata(root: etree._Element) -> Metadata:
    """Collect the first title, description, content-language, base and canonical."""
    found = Metadata()
    for element in root.iter(*_METADATA_TAGS):
        tag = element.tag
        if tag == "meta":
            found.read_meta(element.get("name"), element.get("http-equiv"), element.get("content"))
        elif tag == "link":
            found.read_link(element.get("rel"), element.get("href"))
        elif tag == "base":
            if found.base_href is None:
                found.base_href = element.get("href")
        elif found.title is None and next(element.iterancestors("svg"), None) is None:
            # An SVG <title> is a tooltip, not the document title.
            found.title = collapse("".join(element.itertext())) or None
    return found
