"""What a response body is before it is parsed: HTML or not, binary or text, which charset.

Everything here works on the raw bytes and the ``Content-Type`` header, ahead of lxml:

* :func:`is_html` trusts a declared HTML type and otherwise sniffs the first bytes as the
  MIME Sniffing spec does; :func:`looks_binary` refuses bodies with a NUL or many control
  bytes up front, except UTF-16/32, whose ASCII is full of NULs.
* :func:`decode_html` (and :func:`decode_to_utf8`, what :func:`common.work.parse.parse_html`
  uses) picks the encoding in the HTML spec's order of trust: BOM, then the HTTP ``charset``,
  then ``<meta charset>`` / ``http-equiv`` (or an XML declaration) in the first bytes, then
  detection. bs4's :class:`~bs4.dammit.EncodingDetector` finds the BOM, does the ``<meta>``
  prescan and makes the statistical guess; this module decides which answer to believe. When
  the header says UTF-8 and the bytes are valid, the cost is one ``bytes.decode`` and lxml
  gets the body itself.

Labels are read the way browsers read them (WHATWG aliases, ``iso-8859-1`` as its superset
windows-1252, ``utf-16`` in a ``<meta>`` as UTF-8), and codecs that are not text encodings
(UTF-7, escapes, IDNA) are refused. Decoding never raises: the last fallback is UTF-8 with
replacement characters.
"""

from __future__ import annotations

import codecs
import re
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bs4.dammit import EncodingDetector

__all__ = ["decode_html", "decode_to_utf8", "is_html", "looks_binary"]

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
_ASCII_WS_BYTES = b" \t\n\r\f"
# The spec's tag-terminating bytes are only space and '>', but '<html\n  lang=...>' is common.
_TAG_TERMINATORS = frozenset(b" \t\n\r\f>")
# C0 controls that never occur in text (the MIME Sniffing spec's "binary data bytes"; ESC is
# absent because ISO-2022-JP uses it).
_BINARY_BYTES = bytes([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])
_HIGH_BYTES = bytes(range(0x80, 0x100))
#: How every byte-order mark bs4 recognises starts (UTF-8, UTF-16 and UTF-32, both orders):
#: a body starting otherwise has none, and bs4 is not needed to say so.
_BOM_FIRST_BYTES = frozenset({b"\xef", b"\xfe", b"\xff", b"\x00"})
_UTF16_32_BOMS = (b"\xfe\xff", b"\xff\xfe", b"\x00\x00\xfe\xff")

_CHARSET_RE = re.compile(r"""charset\s*=\s*["']?\s*([^\s;"',]+)""", re.IGNORECASE)
# Anything outside Latin letters, punctuation, currency and letterlike symbols (and U+FFFD).
_NON_LATIN_RE = re.compile("[^\x00-\u024f\u1e00-\u1eff\u2000-\u214f\ufffd]")

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


def is_html(content_type: str | None, body_head: bytes) -> bool:
    """Say whether a response should be parsed as HTML.

    A declared ``text/html`` or ``application/xhtml+xml`` is trusted; any other declared type
    is not HTML. Without a usable type the first bytes are sniffed like the MIME Sniffing
    spec does (a leading UTF-8 BOM is skipped, which the spec does not do).

    Args:
        content_type: The ``Content-Type`` header, or None when absent.
        body_head: The first bytes of the body (1445 are enough).

    Returns:
        True if the body should go to :func:`common.work.parse.parse_html`.
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


def looks_binary(body: bytes, content_type: str | None) -> bool:
    """Say whether ``body`` is binary, not text: a NUL, or more than a few control bytes, in
    its first KiB (a UTF-16/32 BOM or header charset excuses them)."""
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
    text, encoding, _ = decode_to_utf8(body, content_type)
    return text, encoding


def decode_to_utf8(body: bytes, content_type: str | None) -> tuple[str, str, bytes]:
    """Return ``(text, codec, utf8_bytes)``; ``utf8_bytes`` is ``body`` itself when possible."""
    header_codec = _header_codec(content_type) if content_type else None
    data, bom_encoding = (_detector().strip_byte_order_mark(body)
                          if body[:1] in _BOM_FIRST_BYTES else (body, None))
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

    declared = _detector().find_declared_encoding(
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


def _detector() -> type[EncodingDetector]:
    """bs4's detector, imported when a body first needs it (a BOM, no usable header charset):
    bs4 and its charset-normalizer and soupsieve are ~30 ms and several MB a worker whose
    pages say ``charset=utf-8`` never uses."""
    from bs4.dammit import EncodingDetector

    return EncodingDetector


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
    for label in _detector()(sample, is_html=True).encodings:
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
