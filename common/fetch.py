"""HTTP fetching with the fleet's rules: guarded addresses, own redirects, caps, timeouts.

* urllib3's PoolManager (the pool under requests), shared by the fetch threads: keep-alive
  connections per host; no proxy or .netrc is ever taken from the environment.
* The address guard (common/netguard.py) runs inside urllib3's connection set-up: the host is
  resolved once, each address is checked, and only an allowed one is connected to. That is the
  address actually used, on every redirect hop; a name that resolves to 127.0.0.1 or
  169.254.169.254 gets nowhere unless FETCH_ALLOW_NETWORKS says so.
* Redirects are followed here (requests would read every 3xx body unbounded): at most
  MAX_REDIRECTS hops, http/https only, 3xx bodies never read.
* Caps: decoded body (MAX_BODY_BYTES, counted after decompression, so gzip bombs stop early),
  header bytes (MAX_HEADER_BYTES), total time per fetch (FETCH_TOTAL_TIMEOUT_S, against
  slow-drip servers), content types (ALLOWED_CONTENT_TYPES; others are recorded, not read).
"""

from __future__ import annotations

import heapq
import http.client
import logging
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NewConnectionError

from common.config import Settings
from common.errors import FetchError
from common.netguard import AddressGuard

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class _Watchdog:
    """Enforces FETCH_TOTAL_TIMEOUT_S: one shared thread cuts the socket of any fetch that
    outlives its deadline. A read timeout restarts with every byte, so without this a server
    dripping one byte a second (headers or a Content-Length body) could hold a thread for
    hours. One thread for all fetches, not a timer per fetch: fetches are the hot path."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float) -> _Watch:
        watch = _Watch()
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fetch-watchdog",
                                                daemon=True)
                self._thread.start()
            self._seq += 1
            heapq.heappush(self._heap, (deadline, self._seq, watch))
            self._cond.notify()
        return watch

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _seq, watch = self._heap[0]
                delay = deadline - time.monotonic()
                if delay > 0 and not watch.done:
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._heap)
            if not watch.done:
                watch.fire()


class _Watch:
    def __init__(self) -> None:
        self.done = False
        self.fired = False
        self.connection: HTTPConnection | None = None
        self.sent_at: float | None = None

    def fire(self) -> None:
        self.fired = True
        sock = getattr(self.connection, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError as exc:  # already closed: the fetch is ending anyway
                logger.debug("watchdog: socket already closed: %s", exc)


_WATCHDOG = _Watchdog()
_current_watch = threading.local()


class BlockedAddress(NewConnectionError):
    """The guard refused every address the host resolved to."""


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


def _guarded_connection_class(base: type[HTTPConnection], guard: AddressGuard) -> type:
    class GuardedConnection(base):  # type: ignore[misc, valid-type]
        def request(self, *args: Any, **kwargs: Any) -> Any:
            watch = getattr(_current_watch, "watch", None)
            if watch is not None:
                watch.connection = self  # the socket the watchdog cuts at the deadline
                if watch.sent_at is None:
                    watch.sent_at = time.time()  # as close to the wire as we can see
            return super().request(*args, **kwargs)

        def _new_conn(self) -> socket.socket:
            try:
                infos = socket.getaddrinfo(self._dns_host, self.port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise NewConnectionError(self, f"name resolution failed: {exc}") from exc
            refused = []
            for family, socktype, proto, _name, sockaddr in infos:
                address = sockaddr[0]
                if not guard.allowed(address):
                    refused.append(address)
                    continue
                sock = socket.socket(family, socktype, proto)
                try:
                    for option in self.socket_options or ():
                        sock.setsockopt(*option)
                    if isinstance(self.timeout, int | float):
                        sock.settimeout(self.timeout)
                    sock.connect(sockaddr)
                except OSError as exc:
                    sock.close()
                    if isinstance(exc, TimeoutError | socket.timeout):
                        raise urllib3.exceptions.ConnectTimeoutError(
                            self, f"connect to {address} timed out") from exc
                    raise NewConnectionError(self, f"connect to {address}: {exc}") from exc
                return sock
            raise BlockedAddress(self, guard.reason(", ".join(refused) or self._dns_host))

    return GuardedConnection


def _guarded_pool_manager(guard: AddressGuard, maxsize: int) -> urllib3.PoolManager:
    http_conn = _guarded_connection_class(HTTPConnection, guard)
    https_conn = _guarded_connection_class(HTTPSConnection, guard)
    manager = urllib3.PoolManager(num_pools=64, maxsize=maxsize, retries=False)
    manager.pool_classes_by_scheme = {
        "http": type("GuardedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": http_conn}),
        "https": type("GuardedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": https_conn}),
    }
    return manager


class Fetcher:
    """Fetches URLs with the fleet's timeouts, User-Agent, address guard and caps.

    The HTTP client is urllib3's PoolManager — the pool under ``requests.Session`` — used
    directly: ``requests`` added 0.4 ms of CPU a page on the hot path (cookie jars, hooks,
    environment merging, response building) for features a crawler's GET does not use,
    and it reads 3xx bodies itself (NOTES.md #24). One manager serves all fetch threads
    (urllib3 pools are thread-safe); keep-alive connections are re-used per host.
    """

    def __init__(self, settings: Settings, guard: AddressGuard | None = None) -> None:
        self.settings = settings
        self.guard = guard or AddressGuard(settings.fetch_allow_networks)
        self.timeout = urllib3.Timeout(connect=settings.connect_timeout_s,
                                       read=settings.read_timeout_s)
        self.allowed_types = tuple(t.strip().lower() for t in
                                   settings.allowed_content_types.split(",") if t.strip())
        self.headers = {
            "User-Agent": settings.user_agent,
            "Accept": "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5",
            "Accept-Encoding": "gzip, deflate",
        }
        self.pool = _guarded_pool_manager(self.guard, maxsize=max(4, settings.concurrency))

    def close(self) -> None:
        """Close every pooled connection."""
        self.pool.clear()

    def fetch(self, url: str, *, accept_any_type: bool = False) -> FetchResult:
        """GET ``url``, following redirects ourselves; any final HTTP status is a result.

        Args:
            url: an http(s) URL.
            accept_any_type: read the body whatever its content type (robots.txt, sitemaps).

        Raises:
            FetchError: ``kind`` is timeout, connection (transient), or blocked,
                too_many_redirects, bad_redirect, headers_too_large, invalid (permanent).
        """
        started = time.perf_counter()
        deadline = time.monotonic() + self.settings.fetch_total_timeout_s
        watch = _WATCHDOG.watch(deadline)
        _current_watch.watch = watch
        try:
            result = self._follow(url, started, deadline, accept_any_type)
            if watch.fired:  # a cut connection can look like a short, complete body
                raise FetchError("fetch exceeded FETCH_TOTAL_TIMEOUT_S", kind="timeout")
            return replace(result, sent_at=watch.sent_at)
        except FetchError as exc:
            if watch.fired and exc.kind != "timeout":
                exc = FetchError(f"fetch took longer than "
                                 f"{self.settings.fetch_total_timeout_s:g}s ({exc.kind}: {exc})",
                                 kind="timeout")
            exc.sent_at = watch.sent_at
            raise exc from None
        finally:
            watch.done = True
            _current_watch.watch = None

    def _follow(self, url: str, started: float, deadline: float,
                accept_any_type: bool) -> FetchResult:
        current = url
        for hop in range(self.settings.max_redirects + 1):
            response = self._get(current)
            fully_read = False
            try:
                self._check_headers(response)
                location = response.headers.get("Location")
                if response.status in _REDIRECTS and location:
                    current = self._next_hop(current, location)
                    continue  # the 3xx body is never read; the connection is dropped
                content_type = response.headers.get("Content-Type")
                headers = {k.lower(): v for k, v in response.headers.items()}
                if not accept_any_type and not self._wanted(content_type):
                    return FetchResult(url, current, response.status, content_type, b"",
                                       _ms_since(started), headers=headers, redirects=hop,
                                       skipped="content_type")
                body, truncated = self._read_capped(response, deadline)
                fully_read = not truncated
                return FetchResult(url, current, response.status, content_type, body,
                                   _ms_since(started), truncated, headers, redirects=hop)
            finally:
                if not fully_read:
                    response.close()  # an unread body: drop the connection, never drain it
                response.release_conn()
        raise FetchError(f"more than {self.settings.max_redirects} redirects",
                         kind="too_many_redirects")

    def _get(self, url: str) -> urllib3.BaseHTTPResponse:
        try:
            return self.pool.urlopen("GET", url, headers=self.headers, timeout=self.timeout,
                                     redirect=False, retries=False, preload_content=False,
                                     decode_content=True)
        except BlockedAddress as exc:
            raise FetchError(str(exc), kind="blocked") from None
        except urllib3.exceptions.ProtocolError as exc:
            if (_caused_by(exc, http.client.LineTooLong)
                    or "got more than 100 headers" in str(exc)):
                raise FetchError(f"{type(exc).__name__}: {exc}",
                                 kind="headers_too_large") from None
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="connection") from None
        except urllib3.exceptions.NewConnectionError as exc:
            # Before the timeouts: urllib3 makes NewConnectionError a ConnectTimeoutError.
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="connection") from None
        except (urllib3.exceptions.ConnectTimeoutError,
                urllib3.exceptions.ReadTimeoutError, TimeoutError) as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="timeout") from None
        except (urllib3.exceptions.LocationValueError, urllib3.exceptions.LocationParseError,
                urllib3.exceptions.URLSchemeUnknown, UnicodeError, ValueError) as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="invalid") from None
        except (urllib3.exceptions.HTTPError, OSError, http.client.HTTPException) as exc:
            if (_caused_by(exc, http.client.LineTooLong)
                    or "got more than 100 headers" in str(exc)):
                raise FetchError(f"{type(exc).__name__}: {exc}",
                                 kind="headers_too_large") from None
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="connection") from None

    def _next_hop(self, current: str, location: str) -> str:
        target = urljoin(current, location.strip())
        if urlsplit(target).scheme not in ("http", "https"):
            raise FetchError(f"redirect to a non-http URL: {target[:200]}", kind="bad_redirect")
        return target.split("#", 1)[0]

    def _check_headers(self, response: urllib3.BaseHTTPResponse) -> None:
        size = sum(len(k) + len(v) + 4 for k, v in response.headers.items())
        if size > self.settings.max_header_bytes:
            raise FetchError(f"response headers of {size} bytes exceed "
                             f"{self.settings.max_header_bytes}", kind="headers_too_large")

    def _wanted(self, content_type: str | None) -> bool:
        if content_type is None:
            return True  # unknown: read it (capped) and let the parser sniff
        mime = content_type.split(";", 1)[0].strip().lower()
        return mime in self.allowed_types

    def _read_capped(self, response: urllib3.BaseHTTPResponse,
                     deadline: float) -> tuple[bytes, bool]:
        cap = self.settings.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.stream(_CHUNK_BYTES, decode_content=True):
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    chunks[-1] = chunk[:len(chunk) - (size - cap)]  # trim, then one join
                    return b"".join(chunks), True
                if time.monotonic() > deadline:
                    raise FetchError(f"fetch took longer than "
                                     f"{self.settings.fetch_total_timeout_s:g}s (slow body)",
                                     kind="timeout")
        except urllib3.exceptions.DecodeError as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="invalid") from None
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError) as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="timeout") from None
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.HTTPError,
                OSError) as exc:
            kind = "timeout" if "timed out" in str(exc).lower() else "connection"
            raise FetchError(f"{type(exc).__name__}: {exc}", kind=kind) from None
        return b"".join(chunks), False


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _caused_by(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of type ``kind`` in ``exc``'s chain or args (urllib3 wraps)."""
    seen = set()
    stack: list[object] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, kind):
            return item
        stack.extend([item.__cause__, item.__context__, *item.args,
                      getattr(item, "reason", None)])
    return None
