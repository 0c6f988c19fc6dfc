"""HTML parsing on the worker's hot path: bytes in, one immutable :class:`Page` out.

Pipeline, cheapest first:

1. :func:`decode_html` picks the encoding in the HTML spec's order of trust (BOM, then the
   HTTP ``charset``, then ``<meta charset>`` / ``http-equiv`` in the first bytes, then
   detection) using bs4's :class:`~bs4.dammit.EncodingDetector` for the BOM, the ``<meta>``
   prescan and the statistical guess. When the header says UTF-8 and the bytes are valid, the
   cost is one ``bytes.decode``.
2. lxml's libxml2 HTML parser builds the tree from UTF-8 bytes with the encoding forced, so a
   ``<meta>`` that disagrees with step 1 cannot make libxml2 re-decode the page.
3. One ``Element.iter`` walk reads title, description, content-language, ``<base>`` and
   canonical; a compiled XPath collects ``<a href>``. Links are resolved by hand for the
   common shapes because ``urljoin`` costs ~3-5 us a call.
4. ``<script>``/``<style>``/``<noscript>``/``<template>`` are stripped and the text nodes
   under ``<body>`` give ``text_length`` (joined with spaces, whitespace-collapsed) and
   ``content_hash`` (whitespace removed), both counted in C passes over the bytes. The
   ``<title>`` is not part of it.

``bench/parse_cost.py`` measures the whole call on a 30 KB page with 100 links.

Failure contract: empty or whitespace-only bodies give an empty :class:`Page`; bodies that
look binary (a NUL, or more than a few control bytes, in the first KiB) raise
:class:`NotHTML`, and so does the rare document libxml2 refuses outright. Nothing else is
raised for bad input.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urljoin, urlsplit

from bs4.dammit import EncodingDetector
from lxml import etree

from common.core.errors import FleetError

__all__ = ["NotHTML", "Page", "decode_html", "is_html", "parse_html"]

MAX_URL_CHARS = 2048
# Bytes scanned for <meta charset>; the spec's prescan is 1024, but real pages often push
# the tag past that with long comments or inline scripts.
META_PRESCAN_BYTES = 4096
# Bytes given to the statistical detector; enough for a stable guess, bounded cost.
DETECT_SAMPLE_BYTES = 65_536
# Below this many non-ASCII bytes detectors guess wildly (charset-normalizer calls the
# two bytes of '“hi”' cp1125), so we take the spec's default, windows-1252, instead.
MIN_NON_ASCII_FOR_DETECTION = 16
SNIFF_BYTES = 1445  # the MIME Sniffing spec's resource-header length
BINARY_CHECK_BYTES = 1024
# Pasted text occasionally carries a stray control byte; binaries have dozens per KiB.
MAX_STRAY_CONTROL_BYTES = 8
HASH_DIGEST_BYTES = 16

_UTF8_BOM = b"\xef\xbb\xbf"
_HTML_MIME_TYPES = frozenset({"text/html", "application/xhtml+xml"})
# MIME Sniffing spec: these "types" mean the server did not know, so the body decides.
_UNKNOWN_MIME_TYPES = frozenset({"", "unknown/unknown", "application/unknown", "*/*"})
_SNIFF_HTML_TAGS = "html head script iframe h1 div font table a style title b body br p"
_SNIFF_HTML_PREFIXES = (
    b"<!doctype html",
    *(f"<{tag}".encode("ascii") for tag in _SNIFF_HTML_TAGS.split()),
    b"<!--",
)
_ASCII_WS = " \t\n\r\f"
_ASCII_WS_BYTES = b" \t\n\r\f"
# The spec's tag-terminating bytes are only space and '>', but '<html\n  lang=...>' is common.
_TAG_TERMINATORS = frozenset(b" \t\n\r\f>")
# C0 controls that never occur in text (the MIME Sniffing spec's "binary data bytes"; ESC is
# absent because ISO-2022-JP uses it).
_BINARY_BYTES = bytes([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])
_HIGH_BYTES = bytes(range(0x80, 0x100))
_UTF8_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))
# Maps ASCII whitespace to 0 and every other byte to 1 (see _measure_text).
_SHAPE_TABLE = bytes(0 if byte in _ASCII_WS_BYTES else 1 for byte in range(256))
_UTF16_32_BOMS = (b"\xfe\xff", b"\xff\xfe", b"\x00\x00\xfe\xff")

_CHARSET_RE = re.compile(r"""charset\s*=\s*["']?\s*([^\s;"',]+)""", re.IGNORECASE)
# Anything outside Latin letters, punctuation, currency and letterlike symbols (and U+FFFD).
_NON_LATIN_RE = re.compile("[^\x00-\u024f\u1e00-\u1eff\u2000-\u214f\ufffd]")
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")

# WHATWG labels Python does not know, mapped to the Python codec that decodes like the spec.
_LABEL_ALIASES = {
    "x-user-defined": "cp1252",
    "unicode-1-1-utf-8": "utf-8",
    "unicode11utf8": "utf-8",
    "unicode20utf8": "utf-8",
    "x-unicode20utf8": "utf-8",
    "x-sjis": "cp932",
    "windows-31j": "cp932",
    "ms932": "cp932",
    "x-gbk": "gb18030",
    "ks_c_5601-1987": "cp949",
    "iso-8859-8-i": "iso8859-8",
    "x-mac-roman": "mac-roman",
}
# The spec decodes these labels with a superset (browsers do, so pages are written for it):
# 'iso-8859-1' is really windows-1252, and Python's latin-1 would turn its smart quotes into
# C1 control characters.
_SUPERSETS = {
    "ascii": "cp1252",
    "iso8859-1": "cp1252",
    "iso8859-9": "cp1254",
    "iso8859-11": "cp874",
    "tis-620": "cp874",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "euc_kr": "cp949",
    "shift_jis": "cp932",
    "big5": "big5hkscs",
    "utf-16": "utf-16-le",  # the spec's 'utf-16' label means little-endian without a BOM
}
# Codecs that "decode" anything into something that is not the page: escapes, DNS names,
# and UTF-7, which the spec bans because it smuggles markup past filters.
_REFUSED_CODECS = frozenset(
    {"idna", "punycode", "unicode-escape", "raw-unicode-escape", "undefined", "utf-7"}
)

_HREFS = etree.XPath("//a/@href", smart_strings=False)
_BODY_TEXT = etree.XPath("/html/body//text()", smart_strings=False)
# Read with Element.iter(*tags), one C-level walk (~3 us on the bench page) instead of four
# '//' XPaths (~36 us); the whole document is walked because sloppy markup can push these
# out of <head>.
_METADATA_TAGS = ("title", "base", "link", "meta")
_INVISIBLE_TAGS = ("script", "style", "noscript", "template")

_thread_state = threading.local()


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
        }


EMPTY_TEXT_HASH = hashlib.blake2b(b"", digest_size=HASH_DIGEST_BYTES).hexdigest()


def is_html(content_type: str | None, body_head: bytes) -> bool:
    """Say whether a response should be parsed as HTML.

    A declared ``text/html`` or ``application/xhtml+xml`` is trusted; any other declared type
    is not HTML. Without a usable type the first bytes are sniffed like the MIME Sniffing
    spec does (a leading UTF-8 BOM is skipped, which the spec does not do).

    Args:
        content_type: The ``Content-Type`` header, or None when absent.
        body_head: The first bytes of the body (1445 are enough).

    Returns:
        True if the body should go to :func:`parse_html`.
    """
    mime = content_type.partition(";")[0].strip().lower() if content_type else ""
    if mime in _HTML_MIME_TYPES:
        return True
    if mime not in _UNKNOWN_MIME_TYPES and "/" in mime:
        return False
    head = body_head[:SNIFF_BYTES]
    if head.startswith(_UTF8_BOM):
        head = head[len(_UTF8_BOM) :]
    head = head.lstrip(_ASCII_WS_BYTES).lower()
    return any(
        head.startswith(prefix)
        and len(head) > len(prefix)
        and head[len(prefix)] in _TAG_TERMINATORS
        for prefix in _SNIFF_HTML_PREFIXES
    )


def decode_html(body: bytes, content_type: str | None) -> tuple[str, str]:
    """Decode an HTML body the way a browser would, biased towards readable text.

    Order of trust: BOM, HTTP ``charset``, ``<meta>`` charset (or an XML declaration), valid
    UTF-8, mostly-valid UTF-8 (decoded with replacement), a statistical guess, windows-1252,
    and finally UTF-8 with replacement. Unlike the spec, a header or ``<meta>`` charset that
    fails to decode the bytes is skipped rather than forced, since a wrong label is more
    likely than a page that really is broken.

    Args:
        body: The raw response body.
        content_type: The ``Content-Type`` header, or None when absent.

    Returns:
        ``(text, encoding)`` where ``encoding`` is a Python codec name such as ``utf-8``
        or ``cp1252``.
    """
    text, encoding, _ = _decode(body, content_type)
    return text, encoding


def parse_html(
    body: bytes,
    base_url: str,
    content_type: str | None = None,
    max_links: int = 10_000,
) -> Page:
    """Parse an HTML body into a :class:`Page`.

    Args:
        body: The raw response body.
        base_url: The final URL of the response (after redirects); relative links resolve
            against it, or against ``<base href>`` when the page has one.
        content_type: The ``Content-Type`` header, used only for its charset.
        max_links: Keep at most this many links; more sets ``links_truncated``.

    Returns:
        The page; empty (no title, no links, zero text) for an empty or blank body.

    Raises:
        NotHTML: The body looks binary, or libxml2 could not build a tree at all.
        ValueError: ``max_links`` is negative.
    """
    if max_links < 0:
        raise ValueError(f"max_links must be >= 0, got {max_links}")
    if _looks_binary(body, content_type):
        raise NotHTML(f"body of {base_url} looks binary, not HTML")
    _, encoding, utf8_body = _decode(body, content_type)
    try:
        # None for empty, blank or comment-only input.
        root = etree.fromstring(utf8_body, _parser())
    except (etree.LxmlError, ValueError) as exc:
        raise NotHTML(f"libxml2 could not parse {base_url}: {exc}") from exc
    if root is None:
        return Page(None, None, None, None, (), 0, EMPTY_TEXT_HASH, encoding)

    meta = _read_metadata(root)
    base = _make_base(base_url)
    if meta.base_href is not None:
        # The spec ignores a <base href> that does not resolve to a usable URL.
        resolved = _resolve(meta.base_href, base)
        if resolved is not None:
            base = _make_base(resolved)
    links, links_truncated = _extract_links(_HREFS(root), base, max_links)

    # Links are read before stripping because links inside <noscript> are real navigation
    # for clients without JavaScript, which is what a crawler is.
    etree.strip_elements(root, *_INVISIBLE_TAGS, with_tail=False)
    text_length, content_hash = _measure_text(_BODY_TEXT(root))
    return Page(
        title=meta.title,
        description=meta.description,
        canonical=_resolve(meta.canonical_href, base) if meta.canonical_href else None,
        language=_language(root, meta.language),
        links=links,
        text_length=text_length,
        content_hash=content_hash,
        encoding=encoding,
        links_truncated=links_truncated,
    )


def _measure_text(nodes: list[str]) -> tuple[int, str]:
    """``(text_length, content_hash)`` of the visible text nodes, without building the
    collapsed text: ``" ".join(text.split())`` makes one Python object per word and cost
    ~200 us of a ~450 us parse on the bench page; this is a handful of C passes (~90 us with
    the hash).

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


# --- decoding -------------------------------------------------------------------------


def _decode(body: bytes, content_type: str | None) -> tuple[str, str, bytes]:
    """Return ``(text, codec, utf8_bytes)``; ``utf8_bytes`` is ``body`` itself when possible."""
    header_codec = _header_codec(content_type) if content_type else None
    data, bom_encoding = EncodingDetector.strip_byte_order_mark(body)
    if bom_encoding is not None:
        codec = codecs.lookup(bom_encoding).name
        text = _try_decode(data, codec)
        if text is not None:
            return _result(data, text, codec)
        text = data.decode(codec, "replace")
        return text, codec, text.encode("utf-8")

    tried: set[str] = set()
    if header_codec is not None:
        # With 'charset=utf-8' and clean bytes this is the only work done: no <meta> scan,
        # no detection, and lxml gets ``body`` itself.
        tried.add(header_codec)
        text = _try_decode(body, header_codec)
        if text is not None:
            return _result(body, text, header_codec)

    declared = EncodingDetector.find_declared_encoding(
        body[:META_PRESCAN_BYTES], is_html=True, search_entire_document=True
    )
    meta_codec = _codec_for_label(declared, from_meta=True) if declared else None
    if meta_codec is not None and meta_codec not in tried:
        tried.add(meta_codec)
        text = _try_decode(body, meta_codec)
        if text is not None:
            return _result(body, text, meta_codec)

    if "utf-8" not in tried:
        text = _try_decode(body, "utf-8")
        if text is not None:
            return text, "utf-8", body

    # One bad byte in a UTF-8 page (truncated sequence, a pasted latin-1 character) should
    # cost one U+FFFD, not turn every accented letter into mojibake via windows-1252.
    text = body.decode("utf-8", "replace")
    replaced = text.count("\ufffd")
    non_ascii = len(text) - len(text.encode("ascii", "ignore"))
    if non_ascii - replaced > replaced:
        return text, "utf-8", text.encode("utf-8")

    guess = _detect(body, tried)
    if guess is not None:
        text = _try_decode(body, guess)
        if text is not None:
            return _result(body, text, guess)
    text = _try_decode(body, "cp1252")
    if text is not None:
        return _result(body, text, "cp1252")
    text = body.decode("utf-8", "replace")
    return text, "utf-8", text.encode("utf-8")


def _result(body: bytes, text: str, codec: str) -> tuple[str, str, bytes]:
    return text, codec, body if codec == "utf-8" else text.encode("utf-8")


def _try_decode(body: bytes, codec: str) -> str | None:
    try:
        return body.decode(codec)
    except (UnicodeDecodeError, LookupError):
        # LookupError: a codec such as 'base64' exists but is not a text encoding.
        return None


@lru_cache(maxsize=256)
def _header_codec(content_type: str) -> str | None:
    match = _CHARSET_RE.search(content_type)
    return _codec_for_label(match.group(1), from_meta=False) if match else None


@lru_cache(maxsize=256)
def _codec_for_label(label: str, *, from_meta: bool) -> str | None:
    """Map a charset label to the Python codec that decodes it like a browser, or None."""
    label = label.strip().strip("\"'").lower()
    try:
        name = codecs.lookup(_LABEL_ALIASES.get(label, label)).name
    except (LookupError, ValueError):
        return None
    if name in _REFUSED_CODECS:
        return None
    name = _SUPERSETS.get(name, name)
    if from_meta and name.startswith(("utf-16", "utf-32")):
        # A <meta> readable as ASCII cannot be UTF-16; the spec says to read it as UTF-8.
        return "utf-8"
    return name


def _detect(body: bytes, tried: set[str]) -> str | None:
    """Guess the encoding of a non-UTF-8 body, or None to fall back to windows-1252."""
    sample = body[:DETECT_SAMPLE_BYTES]
    if len(sample) - len(sample.translate(None, _HIGH_BYTES)) < MIN_NON_ASCII_FOR_DETECTION:
        return None
    # Without BOM or <meta> left to find, bs4 yields the installed detector's guess
    # (cchardet, chardet or charset-normalizer) before its own utf-8/windows-1252 fallbacks.
    for label in EncodingDetector(sample, is_html=True).encodings:
        codec = _codec_for_label(label, from_meta=False)
        if codec is None or codec in tried or codec == "utf-8":
            continue
        if codec == "cp1252":
            return None
        try:
            guessed = sample.decode(codec, "replace")
        except LookupError:
            continue
        if _NON_LATIN_RE.search(guessed) is None:
            # Detectors cannot tell Latin code pages apart (charset-normalizer calls English
            # with smart quotes windows-1250 and turns 'naïve' into 'naďve'); for Latin text
            # windows-1252 is both the likeliest and what browsers assume.
            return None
        return codec
    return None


def _looks_binary(body: bytes, content_type: str | None) -> bool:
    if body.startswith(_UTF16_32_BOMS):
        return False
    header_codec = _header_codec(content_type) if content_type else None
    if header_codec is not None and header_codec.startswith(("utf-16", "utf-32")):
        return False
    head = body[:BINARY_CHECK_BYTES]
    if b"\x00" in head:
        return True
    control_bytes = len(head) - len(head.translate(None, _BINARY_BYTES))
    return control_bytes > MAX_STRAY_CONTROL_BYTES


# --- tree reading ---------------------------------------------------------------------


def _parser() -> etree.HTMLParser:
    # One parser per thread: lxml serialises concurrent use of a shared parser, and a
    # per-thread parser lets libxml2 run with the GIL released.
    parser = getattr(_thread_state, "parser", None)
    if parser is None:
        parser = etree.HTMLParser(
            encoding="utf-8",  # the bytes we feed are always UTF-8; never trust <meta> here
            remove_comments=True,
            remove_pis=True,
            no_network=True,
            collect_ids=False,
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


# --- links ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Base:
    """A document base URL pre-split for the link fast paths."""

    url: str  # without fragment
    scheme: str  # '' when the base is not http(s): relative links then resolve to nothing
    origin: str  # 'https://host:port'
    directory: str  # origin plus the path up to and including its last '/'


def _make_base(url: str) -> _Base:
    url = url.partition("#")[0]
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. 'http://[::1' (unbalanced IPv6 brackets)
        return _Base(url, "", "", "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return _Base(url, "", "", "")
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path or "/"
    return _Base(url, parts.scheme, origin, origin + path[: path.rfind("/") + 1])


def _resolve(href: str, base: _Base) -> str | None:
    """Resolve ``href`` to an absolute http(s) URL without fragment, or None to skip it.

    Agrees with ``urljoin`` + defragmenting (tests check this); the branches that skip
    ``urljoin`` cover the shapes that make up nearly all real links.
    """
    href = href.strip(_ASCII_WS)
    if "\n" in href or "\t" in href or "\r" in href:
        # Browsers drop these anywhere in a URL; templates leave them inside long hrefs.
        href = href.replace("\n", "").replace("\t", "").replace("\r", "")
    first = href[:1]
    # Branches ordered by how common the shape is; only odd shapes pay for urljoin.
    if first == "/":
        if not base.scheme:
            return None
        if href[1:2] == "/":
            url = f"{base.scheme}:{href}"
        elif "/." in href:
            url = _join(base.url, href)  # dot segments need removing
        else:
            url = base.origin + href
    elif first == "#" or not href:
        if not base.scheme:
            return None
        url = base.url  # a link to this page itself
    elif _SCHEME_RE.match(href):
        scheme, _, rest = href.partition(":")
        scheme = scheme.lower()
        if scheme != "https" and scheme != "http":
            return None  # mailto:, javascript:, tel:, data:, ftp: ...
        if rest[:2] == "//":
            url = f"{scheme}:{rest}"
        elif base.scheme:
            url = _join(base.url, href)  # 'http:foo' is relative to an http base
        else:
            return None
    elif not base.scheme:
        return None
    elif first == "?" or first == "." or "/." in href:
        url = _join(base.url, href)
    else:
        url = base.directory + href
    fragment_at = url.find("#")
    if fragment_at >= 0:
        url = url[:fragment_at]
    if len(url) > MAX_URL_CHARS:
        return None
    host_start = url.find("//") + 2
    if host_start == 1 or url[host_start : host_start + 1] in ("", "/", "?", "\\"):
        return None  # 'http:///path', 'https://' and the like have no host
    return url


def _join(base_url: str, href: str) -> str:
    try:
        return urljoin(base_url, href)
    except ValueError:  # unbalanced IPv6 brackets; the host check below then rejects it
        return ""


def _extract_links(hrefs: list[str], base: _Base, max_links: int) -> tuple[tuple[str, ...], bool]:
    """Return ``(links, truncated)``: unique resolved links in order, capped at ``max_links``."""
    seen_hrefs: set[str] = set()
    seen: set[str] = set()
    links: list[str] = []
    for href in hrefs:
        # Menus and footers repeat hrefs; a repeat resolves the same way, so skip the work.
        if href in seen_hrefs:
            continue
        seen_hrefs.add(href)
        url = _resolve(href, base)
        if url is None or url in seen:
            continue
        if len(links) >= max_links:
            return tuple(links), True
        seen.add(url)
        links.append(url)
    return tuple(links), False
