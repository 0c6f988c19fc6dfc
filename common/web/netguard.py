"""The address guard: which IP addresses a fetch may connect to (SSRF protection).

Checked on the socket's *peer address* right after connect, for every connection of every
redirect hop, so DNS tricks (a name that resolves to 127.0.0.1 or the cloud metadata address,
or re-resolves between check and use) cannot get around it. Allowed: globally routable unicast
addresses, plus whatever FETCH_ALLOW_NETWORKS lists (comma-separated CIDRs, empty by default;
the tests and the local demo allow 127.0.0.0/8 for their loopback sites). Everything else is
refused: loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16 —
cloud metadata — and fe80::/10), CGNAT (100.64/10), multicast, reserved, unspecified, and
therefore the compose services' own addresses.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterable

from common.core.errors import ConfigError, FetchError
from common.core.values import IPNetwork, parse_networks

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
#: How long :func:`resolve` keeps a name's addresses (a proxied fetch checks its target's).
RESOLVE_TTL_S = 60.0
_RESOLVE_MAX = 10_000
_resolved: dict[str, tuple[float, tuple[str, ...]]] = {}
_resolved_lock = threading.Lock()


class AddressGuard:
    def __init__(self, allow: Iterable[IPNetwork] = ()) -> None:
        self.allow = tuple(allow)

    def allowed(self, address: str | IPAddress) -> bool:
        """True when a connection to ``address`` is permitted."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0] if isinstance(address, str)
                                      else address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if any(ip in network for network in self.allow):
            return True
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.is_site_local or ip not in _GLOBAL_UNICAST_V6:
                return False  # Python still calls deprecated fec0::/10 "global"
            embedded = ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
            if embedded is not None and not self.allowed(embedded):
                return False  # 6to4/Teredo wrapping a private or metadata IPv4 address
        return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)

    def reason(self, address: str) -> str:
        return f"connection to {address} refused by the address guard (FETCH_ALLOW_NETWORKS)"

    def check_target(self, host: str | None) -> tuple[str, ...]:
        """A target asked of a proxy, whose own connection the open-socket callback sees
        instead: every address ``host`` resolves to must be allowed. Returns them (empty for
        an address literal, or a name that does not resolve here: the proxy may know it).

        Raises:
            FetchError: kind ``blocked``, one of them is refused.
        """
        if not host:
            return ()
        addresses = resolve(host)
        refused = [address for address in addresses if not self.allowed(address)]
        if refused:
            raise FetchError(self.reason(", ".join(sorted(set(refused)))) + " (asked of a proxy)",
                             kind="blocked")
        return () if addresses == (host.strip("[]"),) else addresses


def guard_from_setting(raw: str) -> AddressGuard:
    try:
        return AddressGuard(parse_networks(raw))
    except ValueError as exc:
        raise ConfigError(f"FETCH_ALLOW_NETWORKS: {exc}") from None


def resolve(host: str) -> tuple[str, ...]:
    """The addresses ``host`` resolves to (itself when it is an address), kept RESOLVE_TTL_S.

    For a fetch through a proxy, whose own connection the open-socket callback sees instead of
    the target's: the fetcher checks these against the guard before asking the proxy. A name
    that does not resolve here gives ``()`` (the proxy may know it: socks5h, an intranet
    proxy); nothing is then refused on its account.
    """
    host = host.strip("[]")
    try:
        return (str(ipaddress.ip_address(host.split("%", 1)[0])),)
    except ValueError:
        pass
    now = time.monotonic()
    with _resolved_lock:
        hit = _resolved.get(host)
    if hit is not None and hit[0] > now:
        return hit[1]
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        addresses = tuple(sorted({info[4][0] for info in infos}))
    except (OSError, UnicodeError):
        addresses = ()
    with _resolved_lock:
        if len(_resolved) >= _RESOLVE_MAX:
            _resolved.clear()
        _resolved[host] = (now + RESOLVE_TTL_S, addresses)
    return addresses
