"""What the worker keeps from one HTML page, whichever parser read it: :class:`Page`, and the
pieces both parsers share (the head's metadata, the base URL, the text measures).

Two parsers fill it (NOTES #81): lexbor (:mod:`common.work.parse_lexbor`) for a page nothing
else reads, and libxml2 (:mod:`common.work.parse`) for a page whose tree extraction rules,
handlers or crawl mode's follow reading need. Both give the same :class:`Page` for the same
body (tests/work/test_parse.py runs its cases through both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xxhash import xxh3_128_hexdigest

from common.work import links

#: The content hash: XXH3's 128 bits as 32 hex digits (NOTES #25).
EMPTY_TEXT_HASH = xxh3_128_hexdigest(b"")

_ASCII_WS_BYTES = b" \t\n\r\f"
# Maps ASCII whitespace to 0 and every other byte to 1 (see measure_text).
_SHAPE_TABLE = bytes(0 if byte in _ASCII_WS_BYTES else 1 for byte in range(256))


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


def empty_page(encoding: str, cut: str | None) -> Page:
    """The page of an empty, blank or comment-only body."""
    return Page(None, None, None, None, (), 0, EMPTY_TEXT_HASH, encoding, cut=cut)


def measure_text(text: str) -> tuple[int, str]:
    """``(text_length, content_hash)`` of the visible text (its nodes joined with spaces),
    without building the collapsed text: ``" ".join(text.split())`` makes one Python object
    per word, a large share of the parse before (NOTES #25).

    ``text_length`` is the length of the text with runs of ASCII whitespace collapsed to one
    space and trimmed (nodes are joined with a space so '<p>a</p><p>b</p>' counts as two
    words, as a browser shows them). ``content_hash`` is XXH3-128 over the UTF-8 text with all
    ASCII whitespace removed, so whitespace-only edits (re-indenting, minifying) keep it: a
    change detector, not a cryptographic digest (1 us against BLAKE2b's 28 on a farm page).
    """
    length, solid = solid_text(text)
    return length, xxh3_128_hexdigest(solid)


def solid_text_python(text: str) -> tuple[int, bytes]:
    """``(text_length, solid)``: the text's UTF-8 without ASCII whitespace, and the collapsed
    text's length (see measure_text). The C module's pass in Python, for where it is not built
    (common/work/_text_measure.c; the tests hold the two equal)."""
    data = text.encode("utf-8", "surrogatepass")
    # The text without its whitespace is what is hashed, and its length is the count of
    # non-space bytes. Words: the text's shape, one byte per UTF-8 byte (0 for whitespace, 1
    # for anything else), has a b"\x00\x01" where a word starts (and a 1 first when the text
    # starts with one). A multi-byte character's continuation bytes are the bytes the text has
    # more than characters: taken off the count. Three C passes and one search, no Python
    # object a word (NOTES #81).
    solid = data.translate(None, _ASCII_WS_BYTES)
    shape = data.translate(_SHAPE_TABLE)
    words = shape.count(b"\x00\x01") + (shape[:1] == b"\x01")
    return len(solid) - (len(data) - len(text)) + max(words - 1, 0), solid


try:  # built by python -m common.ops.native (bootstrap, the image, pip install .)
    from common.work._text_measure import solid_text
except ImportError:  # the worker names what is not built at start (common.ops.native.unbuilt)
    solid_text = solid_text_python


def collapse(value: str | None) -> str:
    return " ".join(value.split()) if value else ""


@dataclass(slots=True)
class Metadata:
    """The first title, description, content-language, ``<base href>`` and canonical."""

    title: str | None = None
    description: str | None = None
    language: str | None = None  # from <meta http-equiv="content-language">
    base_href: str | None = None
    canonical_href: str | None = None

    def read_meta(self, name: str | None, equiv: str | None, content: str | None) -> None:
        """A ``<meta>``: the description, or the content-language."""
        if content is None:
            return
        if name is not None:
            if self.description is None and name.strip().lower() == "description":
                self.description = collapse(content) or None
            return
        if self.language is None and equiv and equiv.strip().lower() == "content-language":
            # 'de, en' lists audiences; the first is the best guess at the text's language.
            self.language = content.partition(",")[0].strip() or None

    def read_link(self, rel: str | None, href: str | None) -> None:
        """A ``<link>``: the canonical."""
        if self.canonical_href is None and href and rel and "canonical" in rel.lower().split():
            self.canonical_href = href

    def base(self, base_url: str) -> links.Base:
        """The document's base: the response's URL, or its ``<base href>`` resolved."""
        base = links.make_base(base_url)
        if self.base_href is not None:
            # The spec ignores a <base href> that does not resolve to a usable URL.
            resolved = links.resolve(self.base_href, base)
            if resolved is not None:
                base = links.make_base(resolved)
        return base


def language(lang: str | None, xml_lang: str | None) -> str | None:
    """The root's language, ``lang`` then ``xml:lang`` (:func:`assemble` falls back on the
    ``<meta>``'s)."""
    # The spec reads lang="" as "unknown", but CMS templates emit it by accident, so an
    # empty value falls through to the <meta> like a missing one.
    for value in (lang, xml_lang):
        if value and value.strip():
            return value.strip()
    return None


def assemble(meta: Metadata, base: links.Base, hrefs: list[str], text: str,
             root_language: str | None, encoding: str, cut: str | None,
             max_links: int) -> Page:
    """The page from what a parser read: ``text`` is the visible text nodes joined by spaces,
    ``root_language`` the root's language (:func:`language`)."""
    found, links_truncated = links.extract_links(hrefs, base, max_links)
    text_length, content_hash = measure_text(text)
    href = meta.canonical_href
    canonical = links.resolve(href, base) if href else None
    return Page(
        title=meta.title, description=meta.description, canonical=canonical,
        language=root_language or meta.language, links=found,
        links_truncated=links_truncated, text_length=text_length, content_hash=content_hash,
        encoding=encoding, canonical_truncated=canonical is None and href is not None
        and links.too_long(href, base), cut=cut,
    )
