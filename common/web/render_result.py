"""What a render gives back besides the DOM: the page's requests to its own site (the rate
limit counts them) and, with ARCHIVE=warc, the exchange the archive keeps."""

from __future__ import annotations

from http import HTTPStatus
from urllib.parse import urlsplit

from common.core.urls import domain_of
from common.web.capture import Exchange

#: A rendered page's body is the DOM serialised by Chromium, in UTF-8.
CONTENT_TYPE = "text/html; charset=utf-8"


def rendered_exchange(url: str, status: int, html: bytes, sent_at: float) -> Exchange:
    """What ARCHIVE=warc keeps of a rendered page: its final URL asked for, and the DOM after
    its scripts as the response, said so in a header (these are not the bytes received)."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = (f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
               "X-Scrape-Fleet-Rendered: chromium\r\n\r\n").encode("utf-8", "surrogateescape")
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {len(html)}\r\nX-Scrape-Fleet-Rendered: chromium; the DOM "
            "after its scripts, not the bytes received\r\n\r\n").encode()
    return Exchange(url, request, head, html, None, sent_at, None)


def subrequests(url: str, requests: list[tuple[str, str, str]]) -> int:
    """The requests a page made to its own site (rate-limit domain) past its document, that
    the guard let through: what its site served it besides the page."""
    site = domain_of(url)
    allowed = [u for u, _kind, verdict in requests if verdict == "allowed"]
    return sum(1 for u in allowed[1:] if domain_of(u) == site)
