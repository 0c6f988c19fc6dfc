"""HTTP fetching with the fleet's rules: guarded addresses, own redirects, caps, timeouts.

:class:`Fetcher` is the policy around each request; what happens inside one request (the
libcurl handle's options and the callbacks that guard, cap and decode) is common/web/curl.py.

* libcurl through pycurl: easy handles kept between fetches in a pool (one per fetch running
  at once), their keep-alive connections re-used per host. In a worker the transfer runs in
  a fetch loop's multi handle (common/web/multi.py), elsewhere in the calling thread. libcurl
  does the HTTP work in C with the GIL released, at a fraction of the CPU per page that
  urllib3 cost (its response headers go through Python's ``email`` parser), NOTES #25. Only
  http and https are enabled; no proxy, .netrc or cookie is ever taken from the environment.
* The address guard (common/web/netguard.py) runs in libcurl's open-socket callback, which sees
  every address libcurl is about to connect to after resolving the host: only an allowed one
  gets a socket. That is the address actually used, on every redirect hop; a name that resolves
  to 127.0.0.1 or 169.254.169.254 gets nowhere unless FETCH_ALLOW_NETWORKS says so.
* Redirects are followed here, not by libcurl: at most MAX_REDIRECTS hops, http/https only,
  each hop guarded; a 3xx body is never read (the transfer stops at the end of its headers).
  A target's ``user:password@`` is dropped before anything else (never sent, never recorded:
  the archived Location line loses it too). The caller's ``follow`` says which hops are
  followed here; a hop it refuses ends the fetch with the 3xx as the result and the target in
  :attr:`FetchResult.redirect_to` (the worker hands it to the producer path, so another
  host's robots.txt and rate limit apply to it: common/work/redirects.py).
* ``headers``: extra request headers for this fetch only (a recrawl's If-None-Match and
  If-Modified-Since, common/work/revisit.py).
* Caps: decoded body (MAX_BODY_BYTES; we decode gzip/deflate ourselves in the write callback,
  never more than the cap, so bombs stop early), header bytes (MAX_HEADER_BYTES) and header
  count, total time per fetch (FETCH_TOTAL_TIMEOUT_S, libcurl's own timer, against slow-drip
  servers), a stalled read (READ_TIMEOUT_S without a byte), content types
  (ALLOWED_CONTENT_TYPES; others are recorded, not read).
* ARCHIVE=warc: each hop's request and response as they went over the wire
  (common/web/capture.py) come with the result as :attr:`FetchResult.exchanges`, for the WARC
  writer (common/work/archive.py); with ARCHIVE=none the plain callbacks run and nothing is kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pycurl

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.redact import redact_url
from common.web import trust
from common.web.capture import ArchivingTransfer, Exchange
from common.web.curl import (
    BASE_HEADERS,
    MAX_HEADER_LINES,
    Transfer,
    new_easy_handle,
    next_hop,
    perform_once,
    pin,
)
from common.web.curl_errors import classify
from common.web.identity import CookieJar, Identity
from common.web.netguard import AddressGuard

__all__ = ["MAX_HEADER_LINES", "CookieJar", "FetchResult", "Fetcher", "Identity"]

logger = logging.getLogger(__name__)

#: libcurl's CURLINFO_HTTP_VERSION -> the version a record shows.
_HTTP_VERSIONS = {1: "1.0", 2: "1.1", 3: "2", 30: "3"}


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
    #: ARCHIVE=warc: every hop as it went over the wire, the final response last.
    exchanges: tuple[Exchange, ...] = ()
    #: Where the final response was archived ({"file", "offset", "length"}), once it was.
    archive: dict[str, Any] | None = None
    #: A redirect the caller's ``follow`` refused: the target, credentials removed.
    redirect_to: str | None = None
    #: The final response's HTTP version ("1.1", "2", "3") and the address it came from (the
    #: proxy's, through a proxy).
    http_version: str | None = None
    remote_ip: str | None = None
    #: The proxy that served it, credentials removed (None: direct).
    proxy: str | None = None
    #: False when its certificate was not checked (FETCH_INSECURE_DOMAINS); None for http.
    tls_verified: bool | None = None
    #: A Cookie header went with a hop: the answer may be personal (never cached).
    cookies_sent: bool = False
    #: Rendered in a browser (common/web/renderer.py): ``body`` is the DOM after its scripts.
    rendered: bool = False
    #: A rendered page's other requests to its own site (scripts, XHR...): the rate limit
    #: counts them (common/web/ratelimit.py, ``RateLimiter.charge``).
    subrequests: int = 0


@dataclass
class _Handle:
    curl: pycurl.Curl
    transfer: Transfer
    generation: int
    verifies: bool = True  # SSL_VERIFYPEER/HOST on (off for FETCH_INSECURE_DOMAINS' hosts)
    pinned: list[str] = field(default_factory=list)  # "host:port" given CURLOPT_RESOLVE


class Fetcher:
    """Fetches URLs with the fleet's timeouts, User-Agent, address guard and caps.

    Thread-safe, and safe for a fetch loop's tasks: a fetch takes a libcurl handle from the
    pool (or makes one) and gives it back when it ends.
    """

    def __init__(self, settings: Settings, guard: AddressGuard | None = None) -> None:
        self.settings = settings
        trust.ca_file(settings)  # a bad FETCH_CA_BUNDLE stops the process now (ConfigError)
        self.guard = guard or AddressGuard(settings.fetch_allow_networks)
        self.allowed_types = tuple(t.strip().lower() for t in
                                   settings.allowed_content_types.split(",") if t.strip())
        self._lock = threading.Lock()
        self._idle: list[_Handle] = []  # handles no fetch is using
        self._generation = 0
        self._archiving = settings.archive == "warc"

    def close(self) -> None:
        """Close the handles and their connections; one in use is closed when its fetch ends
        (a later fetch opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for handle in idle:
            handle.curl.close()

    def fetch(self, url: str, *, accept_any_type: bool = False, headers: Sequence[str] = (),
              follow: Callable[[str], bool] | None = None, identity: Identity | None = None,
              form: bytes | None = None) -> FetchResult:
        """GET ``url`` (POST ``form`` when given), following redirects ourselves; any final
        HTTP status is a result.

        Args:
            url: an http(s) URL.
            accept_any_type: read the body whatever its content type (robots.txt, sitemaps).
            headers: more request header lines (``"Name: value"``) for this fetch.
            follow: called with each redirect target; False ends the fetch there, the 3xx
                the result and the target in ``redirect_to``. None follows every hop.
            identity: the cookies to send and keep, and the proxy to go through.
            form: an ``application/x-www-form-urlencoded`` body to POST (a login); a 301,
                302 or 303 after it is followed with a GET, as browsers do.

        Raises:
            FetchError: ``kind`` is timeout, connection, proxy (transient), or blocked,
                tls_certificate, too_many_redirects, bad_redirect, headers_too_large,
                invalid (permanent).
        """
        handle = self._take()
        started = time.perf_counter()
        deadline = time.monotonic() + self.settings.fetch_total_timeout_s
        sent_at: float | None = None
        current = url
        exchanges: list[Exchange] = []
        cookies = identity.cookies if identity is not None else None
        cookies_sent = False
        proxy = identity.proxy if identity is not None else None
        lines = list(BASE_HEADERS)
        if headers:
            given = {line.partition(":")[0].strip().lower() for line in headers}
            lines = [*(line for line in BASE_HEADERS  # a given Accept replaces the fleet's
                       if line.partition(":")[0].lower() not in given), *headers]
        curl = handle.curl
        if proxy:
            curl.setopt(pycurl.PROXY, proxy)
        if form is not None:
            curl.setopt(pycurl.POSTFIELDS, form)
        try:
            for hop in range(self.settings.max_redirects + 1):
                transfer = handle.transfer
                transfer.reset(accept_any_type)
                verified, sent_cookie = self._prepare_hop(handle, current, lines, cookies,
                                                          proxy, bool(headers) or hop > 0)
                cookies_sent = cookies_sent or sent_cookie
                hop_sent_at = self._perform(curl, transfer, current, deadline, proxy)
                if sent_at is None:
                    sent_at = hop_sent_at
                if self._archiving:
                    exchanges.append(transfer.exchange(current, curl, hop_sent_at))
                if cookies is not None:
                    set_cookies = transfer.header_values(b"set-cookie:")
                    if set_cookies:
                        cookies.receive(current, set_cookies)
                if transfer.stop == "redirect":
                    location = transfer.headers().get("location", "")
                    target = next_hop(current, location)
                    if follow is None or follow(target):
                        current = target
                        if form is not None and transfer.status in (301, 302, 303):
                            curl.setopt(pycurl.HTTPGET, 1)
                            form = None
                        continue  # the 3xx body was never read
                    return FetchResult(url, current, transfer.status, transfer.content_type(),
                                       b"", (time.perf_counter() - started) * 1000,
                                       headers={**transfer.headers(), "location": target},
                                       redirects=hop, sent_at=sent_at,
                                       exchanges=tuple(exchanges), redirect_to=target,
                                       **self._connection(curl, proxy, verified, cookies_sent))
                content_type = transfer.content_type()
                skipped = transfer.stop == "content_type"
                return FetchResult(url, current, transfer.status, content_type,
                                   b"" if skipped else b"".join(transfer.chunks),
                                   (time.perf_counter() - started) * 1000,
                                   truncated=transfer.stop == "truncated",
                                   headers=transfer.headers(), redirects=hop,
                                   skipped="content_type" if skipped else None,
                                   sent_at=sent_at, exchanges=tuple(exchanges),
                                   **self._connection(curl, proxy, verified, cookies_sent))
        except FetchError as exc:
            exc.sent_at = sent_at if sent_at is not None else exc.sent_at
            raise
        finally:
            if headers or cookies is not None:
                curl.setopt(pycurl.HTTPHEADER, list(BASE_HEADERS))
            if proxy:
                curl.setopt(pycurl.PROXY, "")
            if handle.pinned:
                curl.setopt(pycurl.RESOLVE, [f"-{entry}" for entry in handle.pinned])
                handle.pinned.clear()
            if form is not None:
                curl.setopt(pycurl.HTTPGET, 1)
            self._give_back(handle)
        raise FetchError(f"more than {self.settings.max_redirects} redirects",
                         kind="too_many_redirects", sent_at=sent_at)

    def wanted(self, content_type: str | None) -> bool:
        """Whether the body of a response of ``content_type`` is read."""
        if content_type is None:
            return True  # unknown: read it (capped) and let the parser sniff
        mime = content_type.split(";", 1)[0].strip().lower()
        return mime in self.allowed_types

    # -- internals ---------------------------------------------------------------------------
    def _prepare_hop(self, handle: _Handle, url: str, lines: list[str],
                     cookies: CookieJar | None, proxy: str | None,
                     set_lines: bool) -> tuple[bool | None, bool]:
        """Set what differs per hop: the Cookie line, the certificate check, and through a
        proxy the target's own address check. Returns whether the certificate is checked
        (None: not https) and whether a Cookie header goes."""
        curl = handle.curl
        cookie = cookies.header_for(url) if cookies is not None else None
        if cookie:
            curl.setopt(pycurl.HTTPHEADER, [*lines, f"Cookie: {cookie}"])
        elif set_lines or cookies is not None:
            curl.setopt(pycurl.HTTPHEADER, lines)
        parts = urlsplit(url)
        if proxy:
            addresses = self.guard.check_target(parts.hostname)  # FetchError: blocked
            if addresses and proxy.startswith("socks5:"):  # libcurl resolves for the proxy:
                handle.pinned.append(pin(curl, parts, addresses))  # to what was checked
        if parts.scheme != "https":
            return None, bool(cookie)
        checked = not trust.insecure(self.settings, parts.hostname)
        if checked != handle.verifies:
            curl.setopt(pycurl.SSL_VERIFYPEER, 1 if checked else 0)
            curl.setopt(pycurl.SSL_VERIFYHOST, 2 if checked else 0)
            handle.verifies = checked
        return checked, bool(cookie)

    def _connection(self, curl: pycurl.Curl, proxy: str | None, verified: bool | None,
                    cookies_sent: bool) -> dict[str, Any]:
        """The final response's HTTP version, remote address, proxy and certificate check."""
        return {"http_version": _HTTP_VERSIONS.get(curl.getinfo(pycurl.INFO_HTTP_VERSION)),
                "remote_ip": curl.getinfo(pycurl.PRIMARY_IP) or None,
                "proxy": redact_url(proxy) if proxy else None, "tls_verified": verified,
                "cookies_sent": cookies_sent}

    def _take(self) -> _Handle:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        transfer = ArchivingTransfer(self) if self._archiving else Transfer(self)
        return _Handle(new_easy_handle(self.settings, transfer), transfer, self._generation)

    def _give_back(self, handle: _Handle) -> None:
        with self._lock:
            if handle.generation == self._generation:
                self._idle.append(handle)
                return
        handle.curl.close()  # closed meanwhile (close()): not kept

    def _perform(self, curl: pycurl.Curl, transfer: Transfer, url: str,
                 deadline: float, proxy: str | None = None) -> float | None:
        """One request; returns the wall-clock time it was sent (None if it never was)."""
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise FetchError(f"fetch took longer than "
                             f"{self.settings.fetch_total_timeout_s:g}s", kind="timeout")
        error, sent_at = perform_once(curl, url, remaining_ms, self.settings.connect_timeout_s)
        if error is not None and transfer.stop is None:
            tunnel = curl.getinfo(pycurl.HTTP_CONNECTCODE) \
                if proxy and url.startswith("https:") else None
            raise classify(error, transfer, sent_at, self.settings, proxy, tunnel)
        if proxy and transfer.status == 407 and not url.startswith("https:"):
            # A plain-http request goes to the proxy as is: its 407 is the proxy's, not the
            # site's (through a tunnel, https, libcurl reports it as an error).
            raise FetchError(f"the proxy {redact_url(proxy)} asked for credentials (407)",
                             kind="proxy", sent_at=sent_at)
        if transfer.stop in ("headers_too_large", "invalid"):
            raise FetchError(transfer.detail, kind=transfer.stop, sent_at=sent_at)
        return sent_at


