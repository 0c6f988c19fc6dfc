"""Parsers of setting values: each turns one environment string into a typed value, or raises
``ValueError`` with a message that :func:`common.core.config.load_settings` puts after the
variable's name."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from urllib.parse import urlsplit

from common.core.urls import setting_host

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected true/false, got {raw!r}")


def positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(f"must be >= 1, got {value}")
    return value


def non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


def positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError(f"must be > 0, got {value}")
    return value


def non_negative_float(raw: str) -> float:
    value = float(raw)
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


def port(raw: str) -> int:
    value = int(raw)
    if not 0 < value < 65536:
        raise ValueError(f"not a TCP port: {value}")
    return value


def text(raw: str) -> str:
    return raw


def rules_ref(raw: str) -> str:
    """EXTRACT_RULES: ``@FILE`` or inline JSON (a list or mapping), or empty for none. Only
    the shape is checked here; common/work/rules_file.py reads and validates the rules."""
    value = raw.strip()
    if value and not (value.startswith(("[", "{")) or (value.startswith("@") and value[1:])):
        raise ValueError("expected @FILE (YAML or JSON) or inline JSON")
    return value


def log_level(raw: str) -> str:
    value = raw.strip().upper()
    if value not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError(f"unknown log level {raw!r}")
    return value


def log_format(raw: str) -> str:
    value = raw.strip().lower()
    if value not in {"text", "json"}:
        raise ValueError(f"expected text or json, got {raw!r}")
    return value


def power_of_two(raw: str) -> int:
    value = int(raw)
    if value < 1 or value & (value - 1):
        raise ValueError(f"must be a power of two, got {value}")
    return value


#: The plain form of the `limits` notation, read without importing `limits` (~15 ms and a
#: dozen modules at every start, for RATE_LIMIT's default alone): the window's seconds.
_PLAIN_RATE = re.compile(r"([0-9]+)/(second|minute|hour|day)")
_PLAIN_WINDOW_S = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def rate(raw: str) -> tuple[int, int]:
    """A rate in the `limits` notation ("60/minute", "2/second") as (amount, window_ms)."""
    plain = _PLAIN_RATE.fullmatch(raw)
    if plain is not None:  # what limits.parse makes of it (tests/core/test_values.py)
        return int(plain[1]), _PLAIN_WINDOW_S[plain[2]] * 1000
    import limits  # local: only the other forms ("2 per 10 seconds") need it

    item = limits.parse(raw)
    return item.amount, item.get_expiry() * 1000


def rate_overrides(raw: str) -> tuple[tuple[str, tuple[int, int]], ...]:
    """``host=rate,host=rate`` → ((host, (amount, window_ms)), ...)."""
    pairs = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        host, sep, amount = part.partition("=")
        if not sep or not host.strip():
            raise ValueError(f"expected host=rate, got {part!r}")
        pairs.append((setting_host(host), rate(amount.strip())))
    return tuple(pairs)


def fraction(raw: str) -> float:
    value = float(raw)
    if not 0 <= value < 1:
        raise ValueError(f"must be in [0, 1), got {value}")
    return value


def parse_networks(raw: str) -> tuple[IPNetwork, ...]:
    """``"127.0.0.0/8, ::1/128"`` → networks. Raises ValueError naming the bad entry."""
    networks = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError as exc:
            raise ValueError(f"not a CIDR network: {part!r} ({exc})") from None
    return tuple(networks)


def url_with_scheme(*schemes: str) -> Callable[[str], str]:
    """A URL with one of ``schemes`` and a host, whose port (if any) parses: else the client
    library would fail later, quoting the port text — a password, when the ``@`` is missing."""

    def parse(raw: str) -> str:
        parts = urlsplit(raw)
        if parts.scheme not in schemes or not parts.hostname:
            raise ValueError(f"expected a {'/'.join(schemes)} URL with a host, got {raw!r}")
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise ValueError("its port is not a number from 0 to 65535") from None
        return raw

    return parse


def url_list(*schemes: str) -> Callable[[str], str]:
    """One URL or several separated by commas (a cluster's nodes), each checked as
    :func:`url_with_scheme` does; the text is kept as given. A comma inside a password must be
    percent-encoded (``%2C``)."""
    one = url_with_scheme(*schemes)

    def parse(raw: str) -> str:
        parts = [part.strip() for part in raw.split(",")]
        if not all(parts):
            raise ValueError("an empty entry in the comma-separated list")
        for part in parts:
            one(part)
        return ",".join(parts)

    return parse


def choice(*options: str) -> Callable[[str], str]:
    """One of ``options`` (case-insensitive)."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {raw!r}")
        return value

    return parse


def identifier(raw: str) -> str:
    """A plain SQL identifier (letters, digits, underscores; not starting with a digit)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", raw):
        raise ValueError(f"expected a plain identifier (letters, digits, _), got {raw!r}")
    return raw


def host_ports(raw: str) -> tuple[tuple[str, int], ...]:
    """``"host:port,host:port"`` (``[::1]:26379`` for IPv6) → ((host, port), ...); empty: ()."""
    pairs = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        parts = urlsplit(f"//{part}")
        try:
            number = parts.port
        except ValueError:
            number = None
        if not parts.hostname or not number or parts.path or parts.username:
            raise ValueError(f"expected host:port, got {part!r}")
        pairs.append((parts.hostname, number))
    return tuple(pairs)


#: URL schemes of a Redis Cluster's nodes: ``redis+cluster://[user:password@]host:port,...``
#: (common/store/connection.py, docs/design-redis-cluster.md).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
CLUSTER_NODE = ("is a Redis Cluster node: name the cluster's nodes in a redis+cluster:// "
                "REDIS_URL (redis+cluster://host:port,host:port), or run one primary with "
                "replicas and Sentinel (REDIS_SENTINELS); a plain client would fail at the first "
                "script of keys in several hash slots")


def redis_url(raw: str) -> str:
    """REDIS_URL: a redis, rediss or unix URL, or a cluster's nodes (``redis+cluster://``
    ``host:port,host:port``, each address checked)."""
    parts = urlsplit(raw)
    if parts.scheme.lower() not in CLUSTER_SCHEMES:
        return url_with_scheme("redis", "rediss", "unix")(raw)
    for address in parts.netloc.rpartition("@")[2].split(","):
        host, _colon, port = address.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port for each node of a redis+cluster:// URL, "
                             f"got {address!r}")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has database 0 only")
    return raw


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, minimum: int = 1) -> int:
    """``90``, ``90s``, ``15m``, ``6h``, ``1d``, ``2w`` → whole seconds (>= ``minimum``).

    Raises:
        ValueError: anything else.
    """
    match = _DURATION.fullmatch(text.strip().lower())
    if not match or (seconds := math.ceil(float(match[1]) * _UNIT_S[match[2]])) < minimum:
        raise ValueError(f"expected a duration like 90s, 15m, 6h, 1d or 2w (at least "
                         f"{minimum} s), got {text!r}")
    return seconds


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)")
_SIZE_UNIT = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9,
              "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 1024, "mib": 1024**2,
              "gib": 1024**3, "tib": 1024**4, "ki": 1024, "mi": 1024**2, "gi": 1024**3,
              "ti": 1024**4}


def parse_size(text: str) -> int:
    """``5000``, ``64KiB``, ``10MB``, ``2GiB`` → whole bytes (>= 1).

    Raises:
        ValueError: anything else.
    """
    match = _SIZE.fullmatch(text.strip().lower())
    unit = _SIZE_UNIT.get(match[2]) if match else None
    if unit is None or (size := math.ceil(float(match[1]) * unit)) < 1:
        raise ValueError(f"expected a size like 5000, 64KiB, 10MB or 2GiB, got {text!r}")
    return size


def non_negative_size(text: str) -> int:
    """:func:`parse_size`, or ``0`` (none)."""
    return 0 if text.strip() == "0" else parse_size(text)
