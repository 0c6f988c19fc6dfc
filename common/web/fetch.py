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
from urllib.parse import urljoin, urlsplit

import pycurl

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.redact import redact_url
from common.core.urls import without_credentials
from common.web import multi
from common.web.capture import ArchivingTransfer, Exchange
from common.web.curl import BASE_HEADERS, MAX_HEADER_LINES, Transfer, new_easy_handle
from common.web.netguard import AddressGuard

__all__ = ["MAX_HEADER_LINES", "FetchResult", "Fetcher"]  # MAX_HEADER_LINES lives in curl

logger = logging.getLogger(__name__)

# libcurl error codes (curl/curl.h) and what they mean for the fleet.
_TIMEOUT_CODES = frozenset({pycurl.E_OPERATION_TIMEDOUT})
#: CURLE_WEIRD_SERVER_REPLY (8; pycurl names it E_FTP_WEIRD_SERVER_REPLY): a response libcurl
#: refuses to read, e.g. a NUL or a bare CR in a header. The server sends it again on a retry:
#: permanent ``fetch_invalid``, not a transient connection error.
_WEIRD_SERVER_REPLY = getattr(pycurl, "E_WEIRD_SERVER_REPLY", 8)
_INVALID_CODES = frozenset({pycurl.E_UNSUPPORTED_PROTOCOL, pycurl.E_URL_MALFORMAT,
                            pycurl.E_BAD_CONTENT_ENCODING, _WEIRD_SERVER_REPLY})
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
    #: ARCHIVE=warc: every hop as it went over the wire, the final response last.
    exchanges: tuple[Exchange, ...] = ()
    #: Where the final response was archived ({"file", "offset", "length"}), once it was.
    archive: dict[str, Any] | None = None
    #: A redirect the caller's ``follow`` refused: the target, credentials removed.
    redirect_to: str | None = None


@dataclass
class _Handle:
    curl: pycurl.Curl
    transfer: Transfer
    generation: int


class Fetcher:
    """Fetches URLs with the fleet's timeouts, User-Agent, address guard and caps.

    Thread-safe, and safe for a fetch loop's tasks: a fetch takes a libcurl handle from the
    pool (or makes one) and gives it back when it ends.
    """

    def __init__(self, settings: Settings, guard: AddressGuard | None = None) -> None:
        self.settings = settings
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
              follow: Callable[[str], bool] | None = None) -> FetchResult:
        """GET ``url``, following redirects ourselves; any final HTTP status is a result.

        Args:
            url: an http(s) URL.
            accept_any_type: read the body whatever its content type (robots.txt, sitemaps).
            headers: more request header lines (``"Name: value"``) for this fetch.
            follow: called with each redirect target; False ends the fetch there, the 3xx
                the result and the target in ``redirect_to``. None follows every hop.

        Raises:
            FetchError: ``kind`` is timeout, connection (transient), or blocked,
                too_many_redirects, bad_redirect, headers_too_large, invalid (permanent).
        """
        handle = self._take()
        started = time.perf_counter()
        deadline = time.monotonic() + self.settings.fetch_total_timeout_s
        sent_at: float | None = None
        current = url
        exchanges: list[Exchange] = []
        if headers:
            given = {line.partition(":")[0].strip().lower() for line in headers}
            handle.curl.setopt(pycurl.HTTPHEADER, [  # a given Accept replaces the fleet's
                *(line for line in BASE_HEADERS
                  if line.partition(":")[0].lower() not in given), *headers])
        try:
            for hop in range(self.settings.max_redirects + 1):
                transfer = handle.transfer
                transfer.reset(accept_any_type)
                hop_sent_at = self._perform(handle.curl, transfer, current, deadline)
                if sent_at is None:
                    sent_at = hop_sent_at
                if self._archiving:
                    exchanges.append(transfer.exchange(current, handle.curl, hop_sent_at))
                if transfer.stop == "redirect":
                    location = transfer.headers().get("location", "")
                    target = self._next_hop(current, location)
                    if follow is None or follow(target):
                        current = target
                        continue  # the 3xx body was never read
                    return FetchResult(url, current, transfer.status, transfer.content_type(),
                                       b"", (time.perf_counter() - started) * 1000,
                                       headers={**transfer.headers(), "location": target},
                                       redirects=hop, sent_at=sent_at,
                                       exchanges=tuple(exchanges), redirect_to=target)
                content_type = transfer.content_type()
                skipped = transfer.stop == "content_type"
                return FetchResult(url, current, transfer.status, content_type,
                                   b"" if skipped else b"".join(transfer.chunks),
                                   (time.perf_counter() - started) * 1000,
                                   truncated=transfer.stop == "truncated",
                                   headers=transfer.headers(), redirects=hop,
                                   skipped="content_type" if skipped else None,
                                   sent_at=sent_at, exchanges=tuple(exchanges))
        except FetchError as exc:
            exc.sent_at = sent_at if sent_at is not None else exc.sent_at
            raise
        finally:
            if headers:
                handle.curl.setopt(pycurl.HTTPHEADER, list(BASE_HEADERS))
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
            multi.perform(curl)  # this thread's, or its fetch loop's (common/web/multi.py)
        except pycurl.error as exc:
            error = exc
        pretransfer_s = curl.getinfo(pycurl.PRETRANSFER_TIME)
        sent_at = started_wall + pretransfer_s if pretransfer_s > 0 else None
        if error is not None and transfer.stop is None:
            raise self._error(error, transfer, sent_at)
        if transfer.stop in ("headers_too_large", "invalid"):
            raise FetchError(transfer.detail, kind=transfer.stop, sent_at=sent_at)
        return sent_at

    def _error(self, error: pycurl.error, transfer: Transfer,
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
            raise FetchError(f"bad redirect location {redact_url(location[:200])!r}: {exc}",
                             kind="bad_redirect") from None
        if scheme not in ("http", "https"):
            raise FetchError(f"redirect to a non-http URL: {without_credentials(target)[:200]}",
                             kind="bad_redirect")
        return without_credentials(target.split("#", 1)[0])
