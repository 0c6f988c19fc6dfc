"""Links on a page: resolving ``<a href>``, ``<base href>`` and canonical URLs against the
document's base, without ``urljoin`` for the common shapes.

Resolution agrees with ``urljoin`` plus defragmenting (tests/work/test_parse.py checks it on
a corpus of odd shapes); the fast branches cover the shapes that make up nearly all real
links (root-relative, relative, absolute http(s), fragments), and only odd ones (dot
segments, query-only, scheme-relative to a non-http base) pay for ``urljoin``. Anything that
is not http(s), has no host or is longer than MAX_URL_CHARS resolves to None: skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

MAX_URL_CHARS = 2048

_ASCII_WS = " \t\n\r\f"
_HTTP_PREFIXES = ("http://", "https://")
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


@dataclass(frozen=True, slots=True)
class Base:
    """A document base URL pre-split for the link fast paths."""

    url: str  # without fragment
    scheme: str  # '' when the base is not http(s): relative links then resolve to nothing
    origin: str  # 'https://host:port'; '' when there is no host to resolve against
    directory: str  # origin plus the path up to and including its last '/'


def make_base(url: str) -> Base:
    url = url.partition("#")[0]
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. 'http://[::1' (unbalanced IPv6 brackets)
        return Base(url, "", "", "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return Base(url, "", "", "")
    if parts.netloc[:1] == "\\":  # no host: only scheme-relative links resolve
        return Base(url, parts.scheme, "", "")
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path or "/"
    return Base(url, parts.scheme, origin, origin + path[: path.rfind("/") + 1])


def resolve(href: str, base: Base) -> str | None:
    """Resolve ``href`` to an absolute http(s) URL without fragment, or None to skip it.

    Agrees with ``urljoin`` + defragmenting (tests check this); the branches that skip
    ``urljoin`` cover the shapes that make up nearly all real links. A URL built on the
    base's origin or directory has the base's host, so only the other shapes are checked for
    one (:func:`_absolute`).
    """
    href = href.strip(_ASCII_WS)
    if not href.isprintable() and ("\n" in href or "\t" in href or "\r" in href):
        # Browsers drop these anywhere in a URL; templates leave them inside long hrefs.
        href = href.replace("\n", "").replace("\t", "").replace("\r", "")
    first = href[:1]
    # Branches ordered by how common the shape is; only odd shapes pay for urljoin.
    if first == "/":
        if href[1:2] == "/":
            return _absolute(f"{base.scheme}:{href}") if base.scheme else None
        if not base.origin:
            return None
        if "/." in href:
            return _absolute(_join(base.url, href))  # dot segments need removing
        url = base.origin + href
    elif href.startswith(_HTTP_PREFIXES):  # absolute, lower-case scheme: the commonest shape
        return _absolute(href)
    elif first == "#" or not href:
        if not base.origin:
            return None
        # A link to this page itself (the base has no fragment).
        return base.url if len(base.url) <= MAX_URL_CHARS else None
    elif _SCHEME_RE.match(href):
        scheme, _, rest = href.partition(":")
        scheme = scheme.lower()
        if scheme != "https" and scheme != "http":
            return None  # mailto:, javascript:, tel:, data:, ftp: ...
        if rest[:2] == "//":
            return _absolute(f"{scheme}:{rest}")
        if base.scheme:
            return _absolute(_join(base.url, href))  # 'http:foo' is relative to an http base
        return None
    elif not base.origin:
        return None
    elif first == "?" or first == "." or "/." in href:
        return _absolute(_join(base.url, href))
    else:
        url = base.directory + href
    fragment_at = url.find("#")
    if fragment_at >= 0:
        url = url[:fragment_at]
    return url if len(url) <= MAX_URL_CHARS else None


def _absolute(url: str) -> str | None:
    """``url`` without its fragment, or None when it is too long or has no host."""
    fragment_at = url.find("#")
    if fragment_at >= 0:
        url = url[:fragment_at]
    if len(url) > MAX_URL_CHARS:
        return None
    host_start = url.find("//") + 2
    if host_start == 1 or url[host_start : host_start + 1] in ("", "/", "?", "\\"):
        return None  # 'http:///path', 'https://' and the like have no host
    return url


def too_long(href: str, base: Base) -> bool:
    """Whether :func:`resolve` dropped ``href`` because its URL is over MAX_URL_CHARS (rather
    than for its scheme or a missing host). Only asked about a dropped canonical."""
    if len(base.url) + len(href) <= MAX_URL_CHARS:
        return False  # no shape resolves to more than the base plus the href
    try:
        url = urljoin(base.url, href.strip(_ASCII_WS)).partition("#")[0]
    except ValueError:
        return False
    return url.startswith(("http://", "https://")) and len(url) > MAX_URL_CHARS


def _join(base_url: str, href: str) -> str:
    try:
        return urljoin(base_url, href)
    except ValueError:  # unbalanced IPv6 brackets; the host check below then rejects it
        return ""


def extract_links(hrefs: list[str], base: Base, max_links: int) -> tuple[tuple[str, ...], bool]:
    """Return ``(links, truncated)``: unique resolved links in order, capped at ``max_links``.

    The plain shapes (absolute, root-relative, relative, a fragment) are resolved in C when
    the module is built (common/work/_links.c, NOTES #83); it hands every other href to
    :func:`resolve`, and :func:`extract_links_python` is the same loop where it is not built."""
    if resolve_all is not None and base.origin:
        return resolve_all(hrefs, base, max_links, MAX_URL_CHARS, resolve)
    return extract_links_python(hrefs, base, max_links)


def extract_links_python(hrefs: list[str], base: Base,
                         max_links: int) -> tuple[tuple[str, ...], bool]:
    """:func:`extract_links` in Python: the C module's loop, for where it is not built."""
    found: dict[str, None] = {}  # insertion-ordered: the page's order
    # Menus and footers repeat hrefs; a repeat resolves the same way, so it is dropped first.
    for href in dict.fromkeys(hrefs):
        url = resolve(href, base)
        if url is not None and url not in found:
            if len(found) >= max_links:
                return tuple(found), True
            found[url] = None
    return tuple(found), False


try:  # built by python -m common.ops.native (bootstrap, the image, pip install .)
    from common.work._links import resolve_all
except ImportError:  # the worker names what is not built at start (common.ops.native.unbuilt)
    resolve_all = None
