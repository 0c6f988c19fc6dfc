"""URL canonicalisation, validation and fingerprints.

Canonical form comes from w3lib's ``canonicalize_url`` (sorted query, normalised percent
escapes, fragment dropped), plus a lower-cased host and no default port. The host is
canonicalised as a browser's URL parser does (WHATWG URL standard, "host parsing"), so that one
host is one domain for dedupe, robots.txt, the rate limit and the throttle: a trailing dot is
dropped (``example.com.`` is ``example.com``), a host that ends in a number is an IPv4 address
in any of its forms (``127.1``, ``2130706433``, octal ``0177.0.0.1``, hex ``0x7f.1``) written
as a dotted quad, or an invalid URL when it is none (``1.2.3.4.5``, ``256.0.0.1``); an IPv6
address is written compressed (``[0:0::1]`` is ``[::1]``). The fingerprint is
the first 16 bytes of BLAKE2b over the canonical URL: the producer's dedupe set and the worker's
release of expired URLs both derive it from here, so they always agree.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from w3lib.url import canonicalize_url

from common.core.errors import InvalidURL

ALLOWED_SCHEMES = frozenset({"http", "https"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
#: The commonest shape of a URL already canonical: http(s), a lower-case host of LDH labels,
#: a port without leading zeros, a path of unreserved characters and slashes, no query,
#: no fragment. :func:`canonicalize` returns such a URL as it is once its host is canonical,
#: its port not the default and its path free of dot segments: w3lib would change nothing
#: (tests/core/test_urls.py holds the two paths equal on generated URLs). Every worker
#: canonicalises each message's URL again, and w3lib takes ~10 us of it (NOTES #81).
_CANONICAL_SHAPE = re.compile(
    rf"(https?)://({_LABEL}(?:\.{_LABEL})*)(?::([1-9][0-9]{{0,4}}))?(/[A-Za-z0-9._~/-]*)")


@dataclass(frozen=True)
class Fingerprint:
    """A URL's 128-bit fingerprint, split the way the seen-set stores it."""

    digest: bytes

    def bucket(self, buckets: int) -> int:
        """Which of ``buckets`` (a power of two) small sets holds this fingerprint."""
        return int.from_bytes(self.digest[:4], "big") & (buckets - 1)

    @property
    def member(self) -> int:
        """The signed 64-bit integer stored in the bucket (a Redis intset member)."""
        return int.from_bytes(self.digest[8:16], "big", signed=True)

    @property
    def hex(self) -> str:
        return self.digest.hex()


def canonicalize(raw: str, *, max_length: int = 2048) -> str:
    """Return the canonical form of ``raw`` or raise :class:`InvalidURL`.

    Args:
        raw: the URL as given (surrounding whitespace is ignored).
        max_length: longest accepted URL, before and after canonicalisation.
    """
    shape = _CANONICAL_SHAPE.fullmatch(raw)
    if shape is not None and len(raw) <= max_length and _already_canonical(*shape.groups()):
        return raw
    return _canonicalize(raw, max_length)


def _already_canonical(scheme: str, host: str, port: str | None, path: str) -> bool:
    """Whether a URL of :data:`_CANONICAL_SHAPE` is canonical as it is."""
    if "/." in path:
        return False  # dot segments are removed
    if port is not None and (int(port) == _DEFAULT_PORTS[scheme] or int(port) > 65535):
        return False  # a default port is dropped; one out of range is refused
    try:
        return canonical_host(host) == host  # not '127.1', '0x7f.1', ...
    except InvalidURL:
        return False  # '1.2.3.4.5': the full path says why


def _canonicalize(raw: str, max_length: int) -> str:
    url = raw.strip()
    if not url:
        raise InvalidURL("empty URL")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidURL("URL contains characters that are not valid Unicode") from None
    if len(url) > max_length:
        raise InvalidURL(f"URL longer than {max_length} characters")
    if any(ch in url for ch in "\x00\r\n\t "):
        raise InvalidURL("URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ALLOWED_SCHEMES:
            raise InvalidURL(f"unsupported scheme {parts.scheme!r}" if parts.scheme
                             else "no scheme (expected http:// or https://)")
        host = parts.hostname
        port = parts.port  # raises ValueError on a non-numeric or out-of-range port
    except ValueError as exc:
        raise InvalidURL(f"unparsable URL: {exc}") from None
    if not host:
        raise InvalidURL("URL has no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidURL("URLs with credentials are not accepted")
    if host.startswith(".") or ".." in host:
        raise InvalidURL(f"malformed host {host!r}")
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise InvalidURL(f"host {host!r} is not a valid international domain name") from None
    host = canonical_host(host)
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc = f"{netloc}:{port}"
    rebuilt = urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))
    canonical = canonicalize_url(rebuilt, keep_fragments=False)
    if len(canonical) > max_length:
        raise InvalidURL(f"URL longer than {max_length} characters once canonicalised")
    return canonical


def fingerprint(canonical_url: str) -> Fingerprint:
    """Fingerprint of an already canonical URL."""
    return Fingerprint(hashlib.blake2b(canonical_url.encode("utf-8"), digest_size=16).digest())


def job_fingerprint(canonical_url: str, scope: str | None) -> Fingerprint:
    """Fingerprint of a URL within a job's run (``scope`` "name/run"): the same URL in two
    jobs, or two runs of one, is two URLs to dedupe and to record once each. ``None``: the
    default job, the plain :func:`fingerprint` (what every command without a job used)."""
    return fingerprint(f"{canonical_url}#job:{scope}" if scope else canonical_url)


#: Appended to an asset's canonical URL before it is fingerprinted: a URL fetched as a page
#: and downloaded as an asset is two URLs to dedupe and to record once each.
MEDIA_MARK = "#media"


def identity_url(canonical_url: str, media: bool) -> str:
    """What a URL is fingerprinted as: itself, or as an asset (a message with ``media``) the
    same with :data:`MEDIA_MARK` (a canonical URL has no fragment, so neither collides)."""
    return canonical_url + MEDIA_MARK if media else canonical_url


def domain_of(url: str) -> str:
    """The host a URL is fetched from (lower-case, no port, canonical as in
    :func:`canonical_host`): the unit of politeness. A host that is not valid is returned
    lower-cased without its trailing dot (such a URL is never fetched)."""
    host = (urlsplit(url).hostname or "").lower()
    try:
        return canonical_host(host)
    except InvalidURL:
        return host[:-1] if host.endswith(".") else host


def setting_host(value: str) -> str:
    """A host written in a setting or rule (RATE_LIMITS, CRAWL_ALLOWED_DOMAINS, ROUTING_RULES,
    rules' ``host``/``domains``) in the form URLs' hosts take, so ``Example.com.`` or
    ``2130706433`` there means what it means in a link. ValueError saying why when it is none.
    """
    host = value.strip().lower()
    if not host.strip("."):
        raise ValueError(f"expected a host name, got {value!r}")
    try:
        return canonical_host(host)
    except InvalidURL as exc:
        raise ValueError(str(exc)) from None


@functools.lru_cache(maxsize=4096)  # per page, domain_of: hosts repeat; a hit is ~0.1 us
def canonical_host(host: str) -> str:
    """``host`` (lower-case ASCII, as urlsplit's ``hostname``) in its one canonical form: no
    trailing dot, an IPv4 address as a dotted quad, an IPv6 address compressed.

    Raises:
        InvalidURL: a host that ends in a number but is not an IPv4 address.
    """
    if ":" in host:  # urlsplit checked the brackets' content is an IPv6 address
        try:
            return ipaddress.IPv6Address(host).compressed
        except ValueError:
            return host  # with a zone id (fe80::1%eth0): left as written
    if host.endswith("."):
        host = host[:-1]
    last = host.rpartition(".")[2]
    if last[:1].isdigit():  # the cheap test first: a name's last label starts with a letter
        ipv4 = _ipv4_of(host)
        if ipv4 is not None:
            return ipv4
    return host


def _ipv4_number(part: str) -> int | None:
    """The WHATWG IPv4 number parser: ``0x``-hex, ``0``-octal or decimal, else None."""
    base = 10
    if part[:2] in ("0x", "0X"):
        part, base = part[2:], 16
        if not part:
            return 0
    elif len(part) > 1 and part[0] == "0":
        part, base = part[1:], 8
    digits = "0123456789abcdef"[:base]
    if not part or any(ch not in digits for ch in part.lower()):
        return None
    return int(part, base)


def _ipv4_of(host: str) -> str | None:
    """The dotted quad of a host that ends in a number (WHATWG "ends in a number" and IPv4
    parser); None when the last label is not a number after all (``1.2.example``).

    Raises:
        InvalidURL: it ends in a number but is no IPv4 address (WHATWG: a failure).
    """
    parts = host.split(".")
    last = _ipv4_number(parts[-1])
    if last is None and not parts[-1].isdigit():
        return None  # e.g. "1a": not a number, so a name (WHATWG: not "ends in a number")
    numbers = [_ipv4_number(part) for part in parts]
    if len(parts) > 4 or any(n is None for n in numbers):
        raise InvalidURL(f"host {host!r} ends in a number but is not an IPv4 address")
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        raise InvalidURL(f"host {host!r} is an IPv4 address out of range")
    address = values[-1]
    for index, number in enumerate(values[:-1]):
        address += number * 256 ** (3 - index)
    return str(ipaddress.IPv4Address(address))


def without_credentials(url: str) -> str:
    """``url`` without a ``user:password@`` part (a redirect target's credentials are never
    sent and never recorded); unchanged when it has none or cannot be parsed."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
