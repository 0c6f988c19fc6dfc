"""URL canonicalisation, validation and fingerprints.

Canonical form comes from w3lib's ``canonicalize_url`` (sorted query, normalised percent
escapes, fragment dropped), plus a lower-cased host and no default port. The fingerprint is
the first 16 bytes of BLAKE2b over the canonical URL: the producer's dedupe set and the worker's
release of expired URLs both derive it from here, so they always agree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from w3lib.url import canonicalize_url

from common.core.errors import InvalidURL

ALLOWED_SCHEMES = frozenset({"http", "https"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


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


def domain_of(url: str) -> str:
    """The host a URL is fetched from (lower-case, no port): the unit of politeness."""
    return (urlsplit(url).hostname or "").lower()


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
