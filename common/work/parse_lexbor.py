"""The default page's parser: lexbor (through selectolax), for a page whose tree nothing else
reads — no extraction rule, handler, EXTRACTOR or crawl mode's follow reading (NOTES #81).

lexbor is an HTML5 parser in C: on the bench's 30 KB page with 100 links it builds the tree,
finds the head's fields, the ``<a href>`` and the visible text in about a third of libxml2's
time (``python -m bench.parse_cost``). It reads what :mod:`common.work.parse` reads, in the
same order of trust, into the same :class:`~common.work.page.Page`:

* the body arrives as UTF-8, already checked for binary, decoded by the HTML spec's order and
  cut by the same caps (``parse._bounded_utf8``);
* the first ``<title>`` outside ``<svg>``, the first description, content-language,
  ``<base href>`` and canonical, from one selector walk in document order;
* every ``<a href>`` in document order, ``<noscript>``'s included (lexbor parses with
  scripting off, as a crawler is); ``<template>`` content is a separate fragment in HTML5 and
  its links are not the page's;
* the text nodes under ``<body>`` without ``<script>``, ``<style>``, ``<noscript>`` and
  ``<template>``, joined by spaces, for the text measures.

Where the two parsers build different trees from broken markup (HTML5's rules against
libxml2's), a page's fields can differ; tests/work/test_parse.py holds both to the same cases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from selectolax.lexbor import LexborHTMLParser

from common.work.page import Metadata, Page, assemble, collapse, language

#: Stripped inner first: a <script> or <style> (raw text) or a <template> can sit inside a
#: <noscript>, and a node must not be freed after its ancestor was.
_INVISIBLE_TAGS = ["script", "style", "template", "noscript"]
_MISSING = object()

#: Pages with more start tags go to libxml2. HTML5's tree building walks the stack of open
#: elements for each tag, so lexbor's time grows with tags x depth: 5,000 nested <div> take
#: 30 ms, 99,000 take 26 s (libxml2 stops at depth 256). No count bounds the depth (stray end
#: tags hide it), so the start tags bound both: at most ~60 ms a page (NOTES #81).
MAX_START_TAGS = 4_000
_LT = ord("<")


def fits(utf8_body: bytes) -> bool:
    """Whether lexbor reads this body in bounded time: at most MAX_START_TAGS start tags."""
    # Start and end tags: on most pages already few enough (counted in C, ~1 us a farm page).
    tags = count_byte(utf8_body, _LT)
    return tags <= MAX_START_TAGS or tags - utf8_body.count(b"</") <= MAX_START_TAGS


def count_byte_python(data: bytes, byte: int) -> int:
    """How many times ``byte`` occurs in ``data``: the C module's count in Python, for where it
    is not built (common/work/_scan.c). What deleting them removes: bytes.replace finds a byte
    with memchr, 4x faster than bytes.count's loop."""
    return len(data) - len(data.replace(bytes((byte,)), b""))


try:  # built by python -m common.ops.native (bootstrap, the image, pip install .)
    from common.work._scan import count_byte
except ImportError:  # the worker names what is not built at start (common.ops.native.unbuilt)
    count_byte = count_byte_python


def read_page(utf8_body: bytes, base_url: str, encoding: str, cut: str | None,
              max_links: int, on_tree: Callable[[Any, str], None] | None = None) -> Page:
    """The :class:`Page` of ``utf8_body`` (a UTF-8 HTML document, already bounded);
    ``on_tree`` is called with the tree, invisible elements removed, and the document's base
    URL (crawl mode's link marks: common/work/follow.py).

    Elements are found with lexbor's tag index (``tags``), not CSS selectors: the first
    selector on a tree costs ~110 us of setup, more than the parse itself.
    """
    tree = LexborHTMLParser(utf8_body)
    meta = _read_metadata(tree)
    hrefs = []
    for node in tree.tags("a"):
        href = node.attrs.get("href", _MISSING)
        if href is not _MISSING:
            hrefs.append(href if href is not None else "")  # <a href>: this page
    tree.strip_tags(_INVISIBLE_TAGS, recursive=True)  # in C, each tag's nodes in turn
    body = tree.body
    # Whitespace-only nodes left out: joined by spaces, they change neither text measure.
    text = body.text(deep=True, separator=" ", strip=False, skip_empty=True) \
        if body is not None else ""
    root = tree.root
    attrs = root.attrs if root is not None else {}
    base = meta.base(base_url)
    if on_tree is not None:
        on_tree(tree, base.url)
    return assemble(meta, base, hrefs, text,
                    language(attrs.get("lang"), attrs.get("xml:lang")),
                    encoding, cut, max_links)


def _read_metadata(tree: LexborHTMLParser) -> Metadata:
    """The first title (not an SVG one), description, content-language, base and canonical."""
    found = Metadata()
    for node in tree.tags("meta"):
        attrs = node.attrs
        found.read_meta(attrs.get("name"), attrs.get("http-equiv"), attrs.get("content"))
    for node in tree.tags("link"):
        attrs = node.attrs
        found.read_link(attrs.get("rel"), attrs.get("href"))
    for node in tree.tags("base"):
        found.base_href = node.attrs.get("href")
        if found.base_href is not None:
            break
    for node in tree.tags("title"):
        if not _in_svg(node):  # an SVG <title> is a tooltip, not the document title
            found.title = collapse(node.text(deep=True)) or None
            if found.title is not None:
                break
    return found


def _in_svg(node: Any) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.tag == "svg":
            return True
        parent = parent.parent
    return False
