"""The address guard for a browser: every request and every connection Chromium makes.

Two layers, because neither alone sees everything:

* :func:`refusal`, the one check of a request by its URL (scheme, resource type, the
  addresses its host resolves to), called from the page's request interception before the
  request leaves. It names the reason in the render's request log. Playwright's interception
  does not see a redirect's later hops (they are continued inside the driver), nor the
  connections Chromium opens without a request (``<link rel=preconnect>``).
* :class:`GuardProxy`, a SOCKS5 proxy on loopback that Chromium is told to use for every
  connection (``--proxy-server=socks5://...`` with ``--proxy-bypass-list=<-loopback>``, which
  removes Chromium's implicit loopback bypass). It resolves the target itself, refuses it unless
  every address passes the :class:`~common.web.netguard.AddressGuard`, and connects to the
  address it checked, so a redirect hop, a preconnect, a WebSocket or a name that re-resolves
  between check and use cannot reach a refused address.

The proxy also holds what is per page (:meth:`GuardProxy.begin_page`, a browser rendering one
page at a time): the page's own proxy, which the checked target is then reached through
(common/web/browser_upstream.py), and the bytes the page received, counted against
RENDER_MAX_BYTES: past the cap every connection of the page is cut and no other opened.
"""

from __future__ import annotations

import ipaddress
import logging
import select
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from common.core.redact import redact_url
from common.web.browser_upstream import UpstreamError, connect_via
from common.web.browser_upstream import read_exactly as _read
from common.web.netguard import AddressGuard, resolve

logger = logging.getLogger(__name__)

#: Schemes a page may load without a connection (its own data, blobs, blank frames).
LOCAL_SCHEMES = frozenset({"data", "blob", "about"})
NETWORK_SCHEMES = frozenset({"http", "https", "ws", "wss"})
#: Chromium's own services, which it calls at start even with every background flag off (the
#: component updater, account checks; Chromium 156 here): never a page's content.
CHROMIUM_SERVICE_HOSTS = frozenset({
    "update.googleapis.com", "accounts.google.com", "clients1.google.com",
    "clients2.google.com", "clients2.googleusercontent.com", "safebrowsing.googleapis.com",
    "optimizationguide-pa.googleapis.com", "content-autofill.googleapis.com",
    "redirector.gvt1.com", "android.clients.google.com"})
_CONNECT_TIMEOUT_S = 10.0
_RELAY_CHUNK = 65536


def host_refusal(host: str, guard: AddressGuard) -> str | None:
    """Why a connection to ``host`` is refused (None: every address it resolves to passes)."""
    addresses = resolve(host)
    if not addresses:
        return f"{host} does not resolve"
    for address in addresses:
        if not guard.allowed(address):
            return guard.reason(address)
    return None


def refusal(url: str, resource_type: str, guard: AddressGuard,
            block_types: frozenset[str] = frozenset()) -> str | None:
    """Why the browser may not make this request (None: it may).

    Args:
        url: the request's URL.
        resource_type: Chromium's type of it (document, xhr, image, websocket, ...).
        guard: the addresses a connection may go to.
        block_types: resource types refused whatever their address (RENDER_BLOCK_TYPES).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in LOCAL_SCHEMES:
        return None
    if scheme not in NETWORK_SCHEMES:
        return f"scheme {scheme or '(none)'} not allowed"
    if resource_type in block_types:
        return f"resource type {resource_type} blocked (RENDER_BLOCK_TYPES)"
    if not parts.hostname:
        return "no host"
    return host_refusal(parts.hostname, guard)


class GuardProxy:
    """A SOCKS5 proxy (no authentication, CONNECT only) that lets through allowed addresses.

    Serves on 127.0.0.1 from a daemon thread, a thread per connection. ``refused`` keeps the
    ``host:port`` targets it turned down (the last 1,000), for the render's log and the tests.
    Per page (:meth:`begin_page`): ``upstream`` (the page's proxy, None: direct),
    ``received`` (bytes from the targets), ``over_cap`` and ``proxy_errors``.
    """

    def __init__(self, guard: AddressGuard) -> None:
        self.guard = guard
        self.refused: list[str] = []
        self.refused_count = 0
        self.upstream: str | None = None
        self.max_bytes = 0
        self.received = 0
        self.over_cap = False
        self.proxy_errors: list[str] = []
        self._page = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="browser-guard-proxy",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"socks5://127.0.0.1:{self.port}"

    def refused_since(self, count: int) -> list[str]:
        """The targets refused after ``refused_count`` was ``count`` (as many as are kept)."""
        with self._lock:
            new = self.refused_count - count
            return self.refused[-new:] if new > 0 else []

    def begin_page(self, upstream: str | None = None, max_bytes: int = 0) -> None:
        """A new page: its proxy (None: direct) and byte cap (0: none); counts start at 0.
        Connections of an earlier page count no more."""
        with self._lock:
            self._page += 1
            self.upstream, self.max_bytes = upstream, max_bytes
            self.received, self.over_cap, self.proxy_errors = 0, False, []

    def _count(self, page: int, n: int) -> bool:
        """Add ``n`` received bytes to ``page``; False once the page is over its cap."""
        with self._lock:
            if page != self._page:
                return True
            self.received += n
            if self.max_bytes and self.received > self.max_bytes:
                self.over_cap = True
            return not self.over_cap

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected: a listener on Linux still wakes accept() by close alone
        self._listener.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True,
                             name="browser-guard-conn").start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            client.settimeout(_CONNECT_TIMEOUT_S)
            try:
                target = self._handshake(client)
            except (OSError, ValueError) as exc:
                logger.debug("browser guard proxy: bad handshake: %s", exc)
                return
            if target is None:
                return
            target, page = target
            with target:
                client.settimeout(None)
                target.settimeout(None)
                _relay(client, target, lambda n: self._count(page, n))

    def _handshake(self, client: socket.socket) -> tuple[socket.socket, int] | None:
        version, n_methods = _read(client, 2)
        if version != 5:
            raise ValueError(f"SOCKS version {version}")
        _read(client, n_methods)
        client.sendall(b"\x05\x00")  # no authentication
        version, command, _, address_type = _read(client, 4)
        if address_type == 1:
            host = str(ipaddress.IPv4Address(_read(client, 4)))
        elif address_type == 4:
            host = str(ipaddress.IPv6Address(_read(client, 16)))
        elif address_type == 3:
            host = _read(client, _read(client, 1)[0]).decode("ascii")
        else:
            raise ValueError(f"SOCKS address type {address_type}")
        port = struct.unpack("!H", _read(client, 2))[0]
        if command != 1:
            client.sendall(b"\x05\x07\x00\x01" + bytes(6))  # command not supported
            return None
        why = ("Chromium's own service traffic" if host.lower() in CHROMIUM_SERVICE_HOSTS
               else host_refusal(host, self.guard))
        if why is not None:
            with self._lock:
                self.refused = [*self.refused[-999:], f"{host}:{port}"]
                self.refused_count += 1
            logger.info("browser guard proxy: %s:%d refused: %s", host, port, why)
            client.sendall(b"\x05\x02\x00\x01" + bytes(6))  # not allowed by ruleset
            return None
        with self._lock:
            page, upstream, over = self._page, self.upstream, self.over_cap
        if over:  # the page is past RENDER_MAX_BYTES: nothing more for it
            client.sendall(b"\x05\x02\x00\x01" + bytes(6))
            return None
        target = None
        for address in resolve(host):  # each one checked above; the first that answers
            if upstream is not None:
                target = self._through(upstream, host, address, port)
                break
            try:
                target = socket.create_connection((address, port), timeout=_CONNECT_TIMEOUT_S)
                break
            except OSError as exc:  # this address does not answer: the next one may
                logger.debug("browser guard proxy: %s:%d at %s: %s", host, port, address, exc)
        if target is None:
            client.sendall(b"\x05\x05\x00\x01" + bytes(6))  # connection refused
            return None
        peer = target.getpeername()[0]
        if upstream is None and not self.guard.allowed(peer):  # what was connected, too
            target.close()
            client.sendall(b"\x05\x02\x00\x01" + bytes(6))
            return None
        client.sendall(b"\x05\x00\x00\x01" + bytes(6))
        return target, page

    def _through(self, upstream: str, host: str, address: str,
                 port: int) -> socket.socket | None:
        """A tunnel to the checked target through the page's proxy (None: it failed, and
        ``proxy_errors`` says why)."""
        try:
            return connect_via(upstream, host, address, port, _CONNECT_TIMEOUT_S)
        except UpstreamError as exc:
            logger.info("browser guard proxy: %s:%d through %s: %s", host, port,
                        redact_url(upstream), exc)
            with self._lock:
                self.proxy_errors = [*self.proxy_errors[-99:], str(exc)]
            return None


def _relay(a: socket.socket, b: socket.socket, received: Callable[[int], bool]) -> None:
    """Copy bytes both ways until both sides have finished sending (half-closes kept).
    ``received(n)`` is told what came from ``b`` (the target); False cuts both."""
    peers = {a.fileno(): (a, b), b.fileno(): (b, a)}
    poller = select.poll()
    for fd in peers:
        poller.register(fd, select.POLLIN)
    open_reads = set(peers)
    while open_reads:
        for fd, _ in poller.poll():
            source, sink = peers[fd]
            try:
                data = source.recv(_RELAY_CHUNK)
                while data and isinstance(source, ssl.SSLSocket) and source.pending():
                    data += source.recv(_RELAY_CHUNK)  # decrypted already: poll won't say
                if data:
                    if source is b and not received(len(data)):
                        return  # over the page's byte cap: both closed by the caller
                    sink.sendall(data)
                    continue
            except OSError:
                data = b""
            open_reads.discard(fd)
            poller.unregister(fd)
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                open_reads.clear()  # the other side is gone too
