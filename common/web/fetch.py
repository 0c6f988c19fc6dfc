"""HTTP fetching with the fleet's rules: guarded addresses, own redirects, caps, timeouts.

* libcurl through pycurl, one easy handle per fetch thread, kept between fetches so its
  keep-alive connections are re-used per host. libcurl does the HTTP work in C with the GIL
  released: a 30 KB page costs ~75 us of the worker's CPU against ~470 us through urllib3
  (whose response headers go through Python's ``email`` parser), NOTES #25. Only http and
  https are enabled; no proxy, .netrc or cookie is ever taken from the environment.
* The address guard (common/web/netguard.py) runs in libcurl's open-socket callback, which sees
  every address libcurl is about to connect to after resolving the host: only an allowed one
  gets a socket. That is the address actually used, on every redirect hop; a name that resolves
  to 127.0.0.1 or 169.254.169.254 gets nowhere unless FETCH_ALLOW_NETWORKS says so.
* Redirects are followed here, not by libcurl: at most MAX_REDIRECTS hops, http/https only,
  each hop guarded; a 3xx body is never read (the transfer stops at the end of its headers).
* Caps: decoded body (MAX_BODY_BYTES; we decode gzip/deflate ourselves in the write callback,
  never more than the cap, so bombs stop early), header bytes (MAX_HEADER_BYTES) and header count, total time per
  fetch (FETCH_TOTAL_TIMEOUT_S, libcurl's own timer, against slow-drip servers), a stalled read
  (READ_TIMEOUT_S without a byte), content types (ALLOWED_CONTENT_TYPES; others are recorded,
  not read).
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

import certifi
import pycurl

from common.core.config import Settings
from common.core.errors import FetchError
from common.web.netguard import AddressGuard

logger = logging.getLogger(__name__)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# http.client's limit, which the fleet had before libcurl: more header lines than this is an
# abuse, whatever their size.
MAX_HEADER_LINES = 100
_ABORT = 0  # a callback returning fewer bytes than it was given stops the transfer

# libcurl error codes (curl/curl.h) and what they mean for the fleet.
_TIMEOUT_CODES = frozenset({pycurl.E_OPERATION_TIMEDOUT})
_INVALID_CODES = frozenset({pycurl.E_UNSUPPORTED_PROTOCOL, pycurl.E_URL_MALFORMAT,
                            pycurl.E_BAD_CONTENT_ENCODING})
_HEADER_TOO_LARGE_CODES = frozenset({getattr(pycurl, "E_TOO_LARGE", 100)})


@dataclass(frozen=True)
class FetchResult:
    url: str
    final_url: str
    status: int
    content_type: str | None
    body: bytes
    elapsed_ms: float
    truncated: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    redirects: int = 0
    skipped: str | None = None  # why the body was not read (content type)
    sent_at: float | None = None  # wall clock when the first request was sent


class _Decoder:
    """Content-Encoding gzip (members in a row are one stream, as RFC 1952 says) or deflate
    (zlib-wrapped or raw, as servers send both), producing at most ``limit`` bytes a call so a
    bomb never inflates past the body cap. libcurl's own decoding refuses multi-member gzip."""

    def __init__(self, encoding: str) -> None:
        self.gzip = encoding in ("gzip", "x-gzip")
        self._wbits = zlib.MAX_WBITS | 16 if self.gzip else zlib.MAX_WBITS
        self._obj = zlib.decompressobj(self._wbits)
        self._started = False

    def decode(self, data: bytes, limit: int) -> bytes:
        """Decode ``data``; stops once more than ``limit`` bytes came out. Raises zlib.error."""
        out: list[bytes] = []
        produced = 0
        while data and produced <= limit:
            try:
                piece = self._obj.decompress(data, limit - produced + 1)
            except zlib.error:
                if self.gzip or self._started:
                    raise
                # 'deflate' without the zlib wrapper: start again as a raw stream.
                self._wbits = -zlib.MAX_WBITS
                self._obj = zlib.decompressobj(self._wbits)
                piece = self._obj.decompress(data, limit - produced + 1)
            self._started = True
            out.append(piece)
            produced += len(piece)
            if self._obj.unconsumed_tail:
                data = self._obj.unconsumed_tail  # only left when the limit was reached
                continue
            data = self._obj.unused_data if self._obj.eof else b""
            if data:
                if not self.gzip:
                    break  # bytes after the end of a deflate stream: ignored, as zlib does
                self._obj = zlib.decompressobj(self._wbits)  # the next gzip member
        return b"".join(out)


class _Transfer:
    """What libcurl's callbacks see of one request (one hop); reset before each."""

    __slots__ = ("fetcher", "accept_any_type", "status", "header_lines", "header_bytes",
                 "chunks", "size", "stop", "detail", "decoder", "refused", "attempted")

    def __init__(self, fetcher: Fetcher) -> None:
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
        self.decoder: _Decoder | None = None
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
            parts = line.split(None, 2)
            self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            self.header_lines = []
            return None
        if line not in (b"\r\n", b"\n"):
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
            if encoding in ("gzip", "x-gzip", "deflate"):
                self.decoder = _Decoder(encoding)
            elif encoding not in ("", "identity"):
                self.stop = "invalid"  # we only offer gzip and deflate
                self.detail = f"unsupported Content-Encoding {encoding[:40]!r}"
                return _ABORT
        return None

    def write(self, data: bytes) -> int | None:
        chunk = data
        if self.decoder is not None:
            try:
                chunk = self.decoder.decode(data, self.fetcher.settings.max_body_bytes
                                            - self.size)
            except zlib.error as exc:
                self.stop = "invalid"
                self.detail = f"bad {'gzip' if self.decoder.gzip else 'deflate'} body: {exc}"
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
        headers: dict[str, str] = {}
        for line in self.header_lines:
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                continue
            name = name.strip().lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return headers

    def content_type(self) -> str | None:
        return self.header_value(b"content-type:")

    def header_value(self, prefix: bytes) -> str | None:
        """The first header whose lower-cased line starts with ``prefix`` (``b"name:"``)."""
        size = len(prefix)
        for line in self.header_lines:
            if line[:size].lower() == prefix:
                return line[size:].decode("latin-1").strip()
        return None


@dataclass
class _Handle:
    curl: pycurl.Curl
    transfer: _Transfer
    generation: int


class Fetcher:
    """Fetches URLs with the fleet's timeouts, User-Agent, address guard and caps.

    Thread-safe: each thread gets its own libcurl handle (and with it its own keep-alive
    connections), created on its first fetch.
    """

    def __init__(self, settings: Settings, guard: AddressGuard | None = None) -> None:
        self.settings = settings
        self.guard = guard or AddressGuard(settings.fetch_allow_networks)
        self.allowed_types = tuple(t.strip().lower() for t in
                                   settings.allowed_content_types.split(",") if t.strip())
        self._local = threading.local()
        self._lock = threading.Lock()
        self._handles: list[pycurl.Curl] = []
        self._generation = 0

    def close(self) -> None:
        """Close every thread's handle and its connections (a later fetch opens new ones)."""
        with self._lock:
            handles, self._handles = self._handles, []
            self._generation += 1
        for curl in handles:
            curl.close()

    def fetch(self, url: str, *, accept_any_type: bool = False) -> FetchResult:
        """GET ``url``, following redirects ourselves; any final HTTP status is a result.

        Args:
            url: an http(s) URL.
            accept_any_type: read the body whatever its content type (robots.txt, sitemaps).

        Raises:
            FetchError: ``kind`` is timeout, connection (transient), or blocked,
                too_many_redirects, bad_redirect, headers_too_large, invalid (permanent).
        """
        handle = self._handle()
        started = time.perf_counter()
        deadline = time.monotonic() + self.settings.fetch_total_timeout_s
        sent_at: float | None = None
        current = url
        try:
            for hop in range(self.settings.max_redirects + 1):
                transfer = handle.transfer
                transfer.reset(accept_any_type)
                hop_sent_at = self._perform(handle.curl, transfer, current, deadline)
                if sent_at is None:
                    sent_at = hop_sent_at
                if transfer.stop == "redirect":
                    location = transfer.headers().get("location", "")
                    current = self._next_hop(current, location)
                    continue  # the 3xx body was never read
                content_type = transfer.content_type()
                skipped = transfer.stop == "content_type"
                return FetchResult(url, current, transfer.status, content_type,
                                   b"" if skipped else b"".join(transfer.chunks),
                                   (time.perf_counter() - started) * 1000,
                                   truncated=transfer.stop == "truncated",
                                   headers=transfer.headers(), redirects=hop,
                                   skipped="content_type" if skipped else None,
                                   sent_at=sent_at)
        except FetchError as exc:
            exc.sent_at = sent_at if sent_at is not None else exc.sent_at
            raise
        raise FetchError(f"more than {self.settings.max_redirects} redirects",
                         kind="too_many_redirects", sent_at=sent_at)

    def wanted(self, content_type: str | None) -> bool:
        """Whether the body of a response of ``content_type`` is read."""
        if content_type is None:
            return True  # unknown: read it (capped) and let the parser sniff
        mime = content_type.split(";", 1)[0].strip().lower()
        return mime in self.allowed_types

    # -- internals ---------------------------------------------------------------------------
    def _handle(self) -> _Handle:
        handle: _Handle | None = getattr(self._local, "handle", None)
        if handle is not None and handle.generation == self._generation:
            return handle
        curl = pycurl.Curl()
        transfer = _Transfer(self)
        settings = self.settings
        curl.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for DNS timeouts
        curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        curl.setopt(pycurl.FOLLOWLOCATION, 0)
        curl.setopt(pycurl.PROXY, "")  # never a proxy from http_proxy & co
        curl.setopt(pycurl.NETRC, pycurl.NETRC_IGNORED)
        curl.setopt(pycurl.CAINFO, certifi.where())
        curl.setopt(pycurl.USERAGENT, settings.user_agent)
        # We decode (see _Decoder): the write callback counts decoded bytes against the cap.
        curl.setopt(pycurl.HTTPHEADER,
                    ["Accept: text/html,application/xhtml+xml;q=0.9,*/*;q=0.5",
                     "Accept-Encoding: gzip, deflate"])
        curl.setopt(pycurl.HTTP_CONTENT_DECODING, 0)
        curl.setopt(pycurl.OPENSOCKETFUNCTION, transfer.open_socket)
        curl.setopt(pycurl.HEADERFUNCTION, transfer.header)
        curl.setopt(pycurl.WRITEFUNCTION, transfer.write)
        # A read that stalls: under 1 byte/s for READ_TIMEOUT_S (whole seconds) fails.
        curl.setopt(pycurl.LOW_SPEED_LIMIT, 1)
        curl.setopt(pycurl.LOW_SPEED_TIME, max(1, math.ceil(settings.read_timeout_s)))
        curl.setopt(pycurl.MAXCONNECTS, 32)  # idle keep-alive connections kept per thread
        with self._lock:
            generation = self._generation
            self._handles.append(curl)
        handle = _Handle(curl, transfer, generation)
        self._local.handle = handle
        return handle

    def _perform(self, curl: pycurl.Curl, transfer: _Transfer, url: str,
                 deadline: float) -> float | None:
        """One request; returns the wall-clock time it was sent (None if it never was)."""
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise FetchError(f"fetch took longer than "
                             f"{self.settings.fetch_total_timeout_s:g}s", kind="timeout")
        try:
            curl.setopt(pycurl.URL, url)
        except (pycurl.error, UnicodeError, TypeError) as exc:
            raise FetchError(f"invalid URL {url[:200]!r}: {exc}", kind="invalid") from None
        curl.setopt(pycurl.TIMEOUT_MS, remaining_ms)
        curl.setopt(pycurl.CONNECTTIMEOUT_MS,
                    max(1, min(remaining_ms, int(self.settings.connect_timeout_s * 1000))))
        started_wall = time.time()
        error: pycurl.error | None = None
        try:
            curl.perform()
        except pycurl.error as exc:
            error = exc
        pretransfer_s = curl.getinfo(pycurl.PRETRANSFER_TIME)
        sent_at = started_wall + pretransfer_s if pretransfer_s > 0 else None
        if error is not None and transfer.stop is None:
            raise self._error(error, transfer, sent_at)
        if transfer.stop in ("headers_too_large", "invalid"):
            raise FetchError(transfer.detail, kind=transfer.stop, sent_at=sent_at)
        return sent_at

    def _error(self, error: pycurl.error, transfer: _Transfer,
               sent_at: float | None) -> FetchError:
        code, message = error.args[0], error.args[1] if len(error.args) > 1 else ""
        text = f"curl error {code}: {message}"
        if transfer.refused and (not transfer.attempted or code == pycurl.E_COULDNT_CONNECT):
            # Only a refused address could have answered (libcurl resolves 'localhost' to
            # ::1 and 127.0.0.1 itself, for one): the guard's refusal is the reason.
            reason = self.guard.reason(", ".join(sorted(set(transfer.refused))))
            if transfer.attempted:
                reason += f"; allowed {', '.join(transfer.attempted)} failed: {text}"
            return FetchError(reason, kind="blocked", sent_at=sent_at)
        if code in _TIMEOUT_CODES:
            return FetchError(f"{text} (FETCH_TOTAL_TIMEOUT_S "
                              f"{self.settings.fetch_total_timeout_s:g}s or a stalled read)",
                              kind="timeout", sent_at=sent_at)
        if code in _INVALID_CODES:
            return FetchError(text, kind="invalid", sent_at=sent_at)
        if code in _HEADER_TOO_LARGE_CODES:
            return FetchError(text, kind="headers_too_large", sent_at=sent_at)
        return FetchError(text, kind="connection", sent_at=sent_at)

    def _next_hop(self, current: str, location: str) -> str:
        try:
            target = urljoin(current, location.strip())
            scheme = urlsplit(target).scheme
        except ValueError as exc:
            raise FetchError(f"bad redirect location {location[:200]!r}: {exc}",
                             kind="bad_redirect") from None
        if scheme not in ("http", "https"):
            raise FetchError(f"redirect to a non-http URL: {target[:200]}", kind="bad_redirect")
        return target.split("#", 1)[0]
