"""libcurl's side of one fetch: the easy handle's options and the callbacks that run inside it.

:class:`common.web.fetch.Fetcher` is the policy: which URL, the deadline, following redirects,
what an error means. This module is what happens within one request (one redirect hop), while
``curl.perform()`` runs and libcurl calls back into Python (GIL re-acquired) in the fetching
thread. :class:`Transfer` holds those callbacks and what they saw:

* open-socket: every address libcurl is about to connect to, after resolving the host, goes
  through the fetcher's address guard; a refused one gets no socket.
* header: counts header bytes (MAX_HEADER_BYTES) and lines (MAX_HEADER_LINES) against the caps
  and, at the end of the headers, decides before a byte of the body is read: a redirect, an
  unwanted content type or an unsupported Content-Encoding ends the transfer.
* write: decodes gzip/deflate/br/zstd here (common/web/decoding.py; libcurl's own decoding
  is off: it refuses multi-member gzip), a bounded piece at a time, so a compression bomb
  stops at the body cap (MAX_BODY_BYTES) rather than after inflating; a longer body is cut at
  the cap.

With ARCHIVE=warc the fetcher uses common/web/capture.py's subclass, which also keeps the bytes
as they went over the wire; :func:`parse_head` and :func:`decode_body` read such a response back
(the re-parse tool) the way these callbacks read it.

A callback ends the transfer by returning fewer bytes than it was given and records why in
:attr:`Transfer.stop`; the fetcher reads that once ``perform()`` returns. :func:`new_easy_handle`
sets the options that hold for every request of a thread's handle: http(s) only, no proxy or
.netrc from the environment, the Accept headers, the stalled-read timeout, the callbacks.
"""

from __future__ import annotations

import math
import socket
import time
from typing import Protocol
from urllib.parse import SplitResult, urljoin, urlsplit

import pycurl

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.redact import redact_url
from common.core.urls import without_credentials
from common.web import multi, trust
from common.web.decoding import DECODED_ENCODINGS, OFFERED_ENCODINGS, DecodeError, Decoder
from common.web.netguard import AddressGuard

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# http.client's limit, which the fleet had before libcurl: more header lines than this is an
# abuse, whatever their size.
MAX_HEADER_LINES = 100
_ABORT = 0  # a callback returning fewer bytes than it was given stops the transfer
_BLANK = (b"\r\n", b"\n")
#: The request headers of every fetch (a fetch may add more for itself: Fetcher.fetch).
BASE_HEADERS = ("Accept: text/html,application/xhtml+xml;q=0.9,*/*;q=0.5",
                f"Accept-Encoding: {', '.join(OFFERED_ENCODINGS)}")
#: The longest header value a site gave that the fleet sends back (a revisit's validators).
MAX_VALIDATOR_CHARS = 256


def sendable(value: object) -> str | None:
    """``value`` if the fleet may send it back as a request header value (short printable
    ASCII: a line break would add a header of the site's choosing), else None."""
    if not isinstance(value, str) or not value or len(value) > MAX_VALIDATOR_CHARS:
        return None
    return value if value.isascii() and value.isprintable() else None


class Owner(Protocol):
    """What the callbacks read from the :class:`~common.web.fetch.Fetcher` they work for."""

    settings: Settings
    guard: AddressGuard

    def wanted(self, content_type: str | None) -> bool: ...


class Transfer:
    """What libcurl's callbacks see of one request (one hop); reset before each."""

    __slots__ = ("fetcher", "accept_any_type", "status", "header_lines", "header_bytes",
                 "chunks", "size", "stop", "detail", "decoder", "refused", "attempted")

    def __init__(self, fetcher: Owner) -> None:
        self.fetcher = fetcher
        self.reset(False)

    def reset(self, accept_any_type: bool) -> None:
        self.accept_any_type = accept_any_type
        self.status = 0
        self.header_lines: list[bytes] = []
        self.header_bytes = 0
        self.chunks: list[bytes] = []
        self.size = 0
        # Why a callback ended the transfer early: redirect, content_type, truncated (normal
        # endings) or headers_too_large, invalid (errors, explained in ``detail``).
        self.stop: str | None = None
        self.detail = ""
        self.decoder: Decoder | None = None
        self.refused: list[str] = []  # addresses the guard refused
        self.attempted: list[str] = []  # addresses the guard allowed

    # -- libcurl callbacks (run in the fetching thread, GIL re-acquired) -----------------------
    def open_socket(self, _purpose: int, address: tuple) -> socket.socket | int:
        family, socktype, protocol, sockaddr = address
        host = sockaddr[0]
        if not self.fetcher.guard.allowed(host):
            self.refused.append(host)
            return pycurl.SOCKET_BAD
        self.attempted.append(host)
        return socket.socket(family, socktype, protocol)

    def header(self, line: bytes) -> int | None:
        self.header_bytes += len(line)
        settings = self.fetcher.settings
        if self.header_bytes > settings.max_header_bytes:
            self.stop = "headers_too_large"
            self.detail = f"response headers over {settings.max_header_bytes} bytes " \
                          "(MAX_HEADER_BYTES)"
            return _ABORT
        if line.startswith(b"HTTP/"):  # a status line; after a 1xx another one follows
            self.status = status_of(line)
            self.header_lines = []
            return None
        if line not in _BLANK:
            self.header_lines.append(line)
            if len(self.header_lines) > MAX_HEADER_LINES:
                self.stop = "headers_too_large"
                self.detail = f"more than {MAX_HEADER_LINES} response header lines"
                return _ABORT
            return None
        if 100 <= self.status < 200:
            return None  # the end of an interim response: the real one follows
        # End of the headers: decide before libcurl reads a byte of the body.
        if self.status in _REDIRECTS and any(h[:9].lower() == b"location:"
                                             for h in self.header_lines):
            self.stop = "redirect"
            return _ABORT
        if not self.accept_any_type and not self.fetcher.wanted(self.content_type()):
            self.stop = "content_type"
            return _ABORT
        encoding = self.header_value(b"content-encoding:")
        if encoding is not None:
            encoding = encoding.strip().lower()
            if encoding in DECODED_ENCODINGS:
                self.decoder = Decoder(encoding)
            elif encoding not in ("", "identity"):
                self.stop = "invalid"  # we only offer DECODED_ENCODINGS
                self.detail = f"unsupported Content-Encoding {encoding[:40]!r}"
                return _ABORT
        return None

    def write(self, data: bytes) -> int | None:
        chunk = data
        if self.decoder is not None:
            try:
                chunk = self.decoder.decode(data, self.fetcher.settings.max_body_bytes
                                            - self.size)
            except DecodeError as exc:
                self.stop = "invalid"
                self.detail = str(exc)
                return _ABORT
        self.size += len(chunk)
        if self.size > self.fetcher.settings.max_body_bytes:
            self.chunks.append(chunk[:len(chunk) - (self.size - self.fetcher.settings
                                                     .max_body_bytes)])
            self.stop = "truncated"
            return _ABORT
        self.chunks.append(chunk)
        return None

    # -- reading the response ------------------------------------------------------------------
    def headers(self) -> dict[str, str]:
        return header_dict(self.header_lines)

    def content_type(self) -> str | None:
        return self.header_value(b"content-type:")

    def header_value(self, prefix: bytes) -> str | None:
        """The first header whose lower-cased line starts with ``prefix`` (``b"name:"``)."""
        return first_header(self.header_lines, prefix)

    def header_values(self, prefix: bytes) -> list[str]:
        """Every header whose lower-cased line starts with ``prefix`` (Set-Cookie repeats)."""
        size = len(prefix)
        return [line[size:].decode("latin-1").strip() for line in self.header_lines
                if line[:size].lower() == prefix]


# -- reading a response head and body the way the callbacks do (the re-parse tool) -------------
def status_of(line: bytes) -> int:
    """The status code of a status line (0 when it has none)."""
    parts = line.split(None, 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def header_dict(lines: list[bytes]) -> dict[str, str]:
    """Header lines as a dict: lower-cased names, repeated headers joined with ", "."""
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            continue
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def first_header(lines: list[bytes], prefix: bytes) -> str | None:
    """The first header whose lower-cased line starts with ``prefix`` (``b"name:"``)."""
    size = len(prefix)
    for line in lines:
        if line[:size].lower() == prefix:
            return line[size:].decode("latin-1").strip()
    return None


def parse_head(block: bytes) -> tuple[int, list[bytes], bytes]:
    """``(status, header lines, rest)`` of an HTTP response: the last status line's code (an
    interim 1xx head is skipped, as the header callback does), its header lines (each ending
    in its line break, blank line excluded) and what follows the head."""
    status, lines, start = 0, [], 0
    while start < len(block):
        end = block.find(b"\n", start)
        end = len(block) if end < 0 else end + 1
        line, start = block[start:end], end
        if line.startswith(b"HTTP/"):
            status, lines = status_of(line), []
        elif line not in _BLANK:
            lines.append(line)
        elif not 100 <= status < 200:
            break
    return status, lines, block[start:]


def pin(curl: pycurl.Curl, parts: SplitResult, addresses: tuple[str, ...]) -> str:
    """Make ``curl`` use ``addresses`` for the URL's host (CURLOPT_RESOLVE), so a name that
    re-resolves elsewhere between the guard's check and the connection (DNS rebinding) gets
    nowhere the guard did not allow; returns the ``host:port`` to undo with ``-host:port``
    when the fetch ends."""
    entry = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    joined = ",".join(f"[{a}]" if ":" in a else a for a in addresses)
    curl.setopt(pycurl.RESOLVE, [f"{entry}:{joined}"])
    return entry


def new_easy_handle(settings: Settings, transfer: Transfer) -> pycurl.Curl:
    """A libcurl easy handle set up for the fleet, its callbacks bound to ``transfer``."""
    curl = pycurl.Curl()
    curl.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for DNS timeouts
    curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
    curl.setopt(pycurl.FOLLOWLOCATION, 0)
    curl.setopt(pycurl.PROXY, "")  # never a proxy from http_proxy & co
    curl.setopt(pycurl.NETRC, pycurl.NETRC_IGNORED)
    curl.setopt(pycurl.CAINFO, trust.ca_file(settings))
    curl.setopt(pycurl.USERAGENT, settings.user_agent)
    # We decode (common/web/decoding.py): the write callback counts decoded bytes against the cap.
    curl.setopt(pycurl.HTTPHEADER, list(BASE_HEADERS))
    curl.setopt(pycurl.HTTP_CONTENT_DECODING, 0)
    curl.setopt(pycurl.OPENSOCKETFUNCTION, transfer.open_socket)
    curl.setopt(pycurl.HEADERFUNCTION, transfer.header)
    curl.setopt(pycurl.WRITEFUNCTION, transfer.write)
    # A read that stalls: under 1 byte/s for READ_TIMEOUT_S (whole seconds) fails.
    curl.setopt(pycurl.LOW_SPEED_LIMIT, 1)
    curl.setopt(pycurl.LOW_SPEED_TIME, max(1, math.ceil(settings.read_timeout_s)))
    curl.setopt(pycurl.MAXCONNECTS, 32)  # idle keep-alive connections kept per thread
    debug = getattr(transfer, "debug", None)  # ArchivingTransfer: the request as sent
    if debug is not None:
        curl.setopt(pycurl.VERBOSE, 1)
        curl.setopt(pycurl.DEBUGFUNCTION, debug)
    return curl


def perform_once(curl: pycurl.Curl, url: str, remaining_ms: int, connect_timeout_s: float
                 ) -> tuple[pycurl.error | None, float | None]:
    """One request of ``curl`` to ``url`` within ``remaining_ms`` (connecting within
    CONNECT_TIMEOUT_S), run by the caller's fetch loop when it has one: libcurl's error (None
    when it went through) and the wall-clock time the request was sent (None: never sent).

    Raises:
        FetchError: ``invalid``: a URL libcurl refuses.
    """
    try:
        curl.setopt(pycurl.URL, url)
    except (pycurl.error, UnicodeError, TypeError) as exc:
        raise FetchError(f"invalid URL {redact_url(url[:200])!r}: {exc}",
                         kind="invalid") from None
    curl.setopt(pycurl.TIMEOUT_MS, remaining_ms)
    curl.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, min(remaining_ms, int(connect_timeout_s * 1000))))
    started_wall = time.time()
    error: pycurl.error | None = None
    try:
        multi.perform(curl)  # this thread's, or its fetch loop's (common/web/multi.py)
    except pycurl.error as exc:
        error = exc
    pretransfer_s = curl.getinfo(pycurl.PRETRANSFER_TIME)
    if pretransfer_s <= 0:
        return error, None
    # libcurl's clock starts when the loop first drives the transfer, which a busy loop does
    # late: counted back from the end too, the later of the two is never before the real send
    # (an early one let the next requests of a site follow too closely; NOTES #11).
    sent_back = time.time() - (curl.getinfo(pycurl.TOTAL_TIME) - pretransfer_s)
    return error, max(started_wall + pretransfer_s, sent_back)


def next_hop(current: str, location: str) -> str:
    """The absolute URL a redirect's ``Location`` names, credentials and fragment dropped.

    Raises:
        FetchError: ``bad_redirect``: not a URL, or not http(s).
    """
    try:
        target = urljoin(current, location.strip())
        scheme = urlsplit(target).scheme
    except ValueError as exc:
        raise FetchError(f"bad redirect location {redact_url(location[:200])!r}: {exc}",
                         kind="bad_redirect") from None
    if scheme not in ("http", "https"):
        raise FetchError(f"redirect to a non-http URL: {without_credentials(target)[:200]}",
                         kind="bad_redirect")
    return without_credentials(target.split("#", 1)[0])
