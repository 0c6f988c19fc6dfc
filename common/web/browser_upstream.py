"""The browser's guard proxy going onward through the page's own proxy (``Identity.proxy``).

:class:`~common.web.browser_guard.GuardProxy` checks each target Chromium asks for, then,
when the page has a proxy, opens the tunnel to the checked target through it instead of
connecting itself: an HTTP ``CONNECT`` (``http://``, or ``https://`` inside TLS to the proxy)
or a SOCKS5 ``CONNECT`` (``socks5://`` with the address the guard checked, as libcurl is
pinned in common/web/fetch.py; ``socks5h://`` with the name, the proxy resolving it).
``user:password@`` in the URL is sent as Basic ``Proxy-Authorization`` or SOCKS5's
username/password method; the password never reaches a message (:func:`redact_url`).
"""

from __future__ import annotations

import base64
import ipaddress
import socket
import ssl
import struct
from urllib.parse import unquote, urlsplit

from common.core.redact import redact_url


class UpstreamError(Exception):
    """The page's proxy could not be reached or would not open the tunnel (its URL redacted
    in the message)."""


def connect_via(proxy: str, host: str, address: str, port: int,
                timeout_s: float) -> socket.socket:
    """A socket tunnelled through ``proxy`` to ``host:port`` (``address``: what the guard
    checked ``host`` resolves to, given to a ``socks5://`` proxy).

    Raises:
        UpstreamError: the proxy is unreachable, refused the tunnel, or asked for credentials.
    """
    parts = urlsplit(proxy)
    scheme = parts.scheme.lower()
    shown = redact_url(proxy)
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password or "") if user is not None else None
    try:
        sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
    except OSError as exc:
        raise UpstreamError(f"proxy {shown} unreachable: {exc}") from None
    try:
        if scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        if scheme in ("http", "https"):
            _http_connect(sock, host, port, user, password, shown)
        elif scheme in ("socks5", "socks5h"):
            target = host if scheme == "socks5h" else address
            _socks5_connect(sock, target, port, user, password, shown)
        else:
            raise UpstreamError(f"proxy {shown}: scheme {scheme} not supported")
    except UpstreamError:
        sock.close()
        raise
    except (OSError, ValueError) as exc:
        sock.close()
        raise UpstreamError(f"proxy {shown} failed: {exc}") from None
    return sock


def _http_connect(sock: socket.socket, host: str, port: int, user: str | None,
                  password: str | None, shown: str) -> None:
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        lines.append(f"Proxy-Authorization: Basic {token}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    head = b""
    while b"\r\n\r\n" not in head:  # one byte at a time: nothing of the tunnel is read
        byte = sock.recv(1)
        if not byte:
            raise UpstreamError(f"proxy {shown} closed the connection during CONNECT")
        head += byte
        if len(head) > 65536:
            raise UpstreamError(f"proxy {shown}: an endless answer to CONNECT")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    fields = status_line.split()
    if len(fields) < 2 or not fields[1].isdigit():
        raise UpstreamError(f"proxy {shown}: not an HTTP answer to CONNECT")
    if fields[1] != "200":
        raise UpstreamError(f"proxy {shown} answered CONNECT with {status_line[:100]!r}")


def _socks5_connect(sock: socket.socket, target: str, port: int, user: str | None,
                    password: str | None, shown: str) -> None:
    methods = b"\x00\x02" if user is not None else b"\x00"
    sock.sendall(b"\x05" + bytes([len(methods)]) + methods)
    version, method = read_exactly(sock, 2)
    if version != 5 or method not in methods:
        raise UpstreamError(f"proxy {shown}: no acceptable SOCKS5 method")
    if method == 2:
        name, secret = (user or "").encode(), (password or "").encode()
        sock.sendall(b"\x01" + bytes([len(name)]) + name + bytes([len(secret)]) + secret)
        if read_exactly(sock, 2)[1] != 0:
            raise UpstreamError(f"proxy {shown}: SOCKS5 credentials refused")
    try:
        packed = ipaddress.ip_address(target.strip("[]"))
        address = (b"\x01" if packed.version == 4 else b"\x04") + packed.packed
    except ValueError:  # not an address: a name, which the proxy resolves (socks5h)
        encoded = target.encode("idna")
        address = b"\x03" + bytes([len(encoded)]) + encoded
    sock.sendall(b"\x05\x01\x00" + address + struct.pack("!H", port))
    _, reply, _, address_type = read_exactly(sock, 4)
    if reply != 0:
        raise UpstreamError(f"proxy {shown}: SOCKS5 CONNECT failed (reply {reply})")
    length = {1: 4, 4: 16}.get(address_type)
    read_exactly(sock, (length if length is not None else read_exactly(sock, 1)[0]) + 2)


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes of a SOCKS handshake (ours with Chromium, or an upstream proxy's)."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ValueError("the connection closed during the SOCKS handshake")
        data += chunk
    return data
