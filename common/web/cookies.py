"""A session's cookie jar: the fetcher's :class:`~common.web.fetch.CookieJar`, kept in Redis.

RFC 6265's rules are the standard library's (:mod:`http.cookiejar`, a parser kept with Python
rather than one of ours): a cookie is sent only to hosts its domain matches and paths under its
path, ``Secure`` only over https, not after its ``Expires``/``Max-Age``; ``Max-Age=0`` or a past
``Expires`` deletes it; a response cannot set a cookie for a domain it is not in. ``HttpOnly``
and ``SameSite`` are kept as the site sent them. ``SameSite`` decides whether a browser sends a
cookie on a request another site started; every request of the fleet is a top-level visit of
the site itself (a link followed on the site, a redirect it gave), so every cookie is sent, Lax
and Strict ones too. ``HttpOnly`` concerns scripts, which the fleet does not run.

One jar per (job, site, session) (common/web/sessions.py): ``site`` is the URL's rate-limit
domain, so a jar only ever holds what one site set, and a redirect to another site (the
fetcher follows none itself; a login may) sends none of them: the domain rules refuse it.

In Redis a jar is a hash (``cookie_jar_key``): field ``domain;path;name`` -> JSON of the cookie.
:meth:`Jar.changes` is what a page changed (the fields to write, the fields to delete): a page
that set nothing writes nothing. Bounds: a cookie whose name and value exceed 4096 bytes is
never kept; past COOKIE_JAR_MAX_COOKIES or COOKIE_JAR_MAX_BYTES the oldest go. Cookie values
are never logged: no ``repr`` of a jar or a cookie shows one.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Mapping
from email.message import Message
from http.cookiejar import Cookie, CookieJar, DefaultCookiePolicy

__all__ = ["MAX_COOKIE_BYTES", "META_PREFIX", "Jar"]

logger = logging.getLogger(__name__)

#: RFC 6265 §6.1: a user agent keeps cookies of at least 4096 bytes (name and value): larger
#: ones are dropped, never cut.
MAX_COOKIE_BYTES = 4096
#: Jar hash fields that are not cookies (a session's login state, common/web/sessions.py):
#: no cookie's domain starts with it.
META_PREFIX = "!"
_DAY_S = 86_400
_PARSED: dict[str, tuple[Cookie, float]] = {}  # stored JSON -> the cookie (see _parsed)
_PARSED_MAX = 4096


class _Response:
    """What :meth:`CookieJar.extract_cookies` reads of a response: its Set-Cookie lines."""

    __slots__ = ("_headers",)

    def __init__(self, set_cookies: list[str]) -> None:
        self._headers = Message()
        for line in set_cookies:
            self._headers["Set-Cookie"] = line

    def info(self) -> Message:
        return self._headers


class Jar:
    """One session's cookies for one fetch (or a login): loaded from its Redis hash, changed by
    what the responses set, written back as :meth:`changes`.

    Args:
        fields: the jar's hash as read from Redis (``bytes`` or ``str``), cookies and meta fields.
        max_cookies: COOKIE_JAR_MAX_COOKIES.
        max_bytes: COOKIE_JAR_MAX_BYTES.
    """

    __slots__ = ("_jar", "_created", "_loaded", "_dirty", "meta", "max_cookies", "max_bytes")

    def __init__(self, fields: Mapping[bytes | str, bytes | str] | None = None, *,
                 max_cookies: int = 100, max_bytes: int = 65536) -> None:
        self._jar = CookieJar(DefaultCookiePolicy())
        self._created: dict[str, float] = {}  # field -> when first set (the oldest go first)
        self._loaded: dict[str, str] = {}  # field -> its JSON as read
        self._dirty = False
        self.meta: dict[str, str] = {}  # META_PREFIX fields, as read
        self.max_cookies = max_cookies
        self.max_bytes = max_bytes
        if fields:
            self._load(fields)

    def __repr__(self) -> str:  # never the values
        return f"<Jar {len(self._created)} cookie(s)>"

    def __len__(self) -> int:
        return len(self._created)

    # -- the fetcher's CookieJar protocol ------------------------------------------------------
    def header_for(self, url: str) -> str | None:
        """The Cookie header value for a request to ``url`` (None: no cookie applies)."""
        if not self._created:
            return None  # the common case, a site that sets none: nothing to work out
        request = urllib.request.Request(url)
        self._jar.add_cookie_header(request)
        return request.get_header("Cookie") or None

    def receive(self, url: str, set_cookies: list[str]) -> None:
        """Keep what the response of ``url`` set (its Set-Cookie header values)."""
        if not set_cookies:
            return
        self._jar.extract_cookies(_Response(set_cookies), urllib.request.Request(url))
        self._dirty = True
        now = time.time()
        present = {}
        for cookie in list(self._jar):
            if len(cookie.name) + len(cookie.value or "") > MAX_COOKIE_BYTES:
                self._jar.clear(cookie.domain, cookie.path, cookie.name)
                logger.info("cookie %r of %s not kept: over %d bytes", cookie.name[:100],
                            cookie.domain, MAX_COOKIE_BYTES)
                continue
            key = _field(cookie)
            present[key] = self._created.get(key, now)
        self._created = present
        self._bound()

    # -- Redis ----------------------------------------------------------------------------------
    def changes(self) -> tuple[dict[str, str], list[str]]:
        """What differs from the jar as loaded: fields to set (JSON) and fields to delete."""
        if not self._dirty:
            return {}, []
        now = time.time()
        current = {_field(c): _dump(c, self._created[_field(c)]) for c in self._jar
                   if not c.is_expired(now)}
        changed = {k: v for k, v in current.items() if self._loaded.get(k) != v}
        gone = [k for k in self._loaded if k not in current]
        return changed, gone

    def saved(self) -> None:
        """The changes were written: they are the jar as loaded now."""
        now = time.time()
        self._loaded = {_field(c): _dump(c, self._created[_field(c)]) for c in self._jar
                        if not c.is_expired(now)}
        self._dirty = False

    def ttl_ms(self) -> int:
        """How long the Redis hash should live: to the latest expiry, a day at least (a
        session cookie has none; a login's state lives with the jar)."""
        latest = max((c.expires for c in self._jar if c.expires is not None), default=0)
        return int(max(latest - time.time(), _DAY_S) * 1000)

    def _load(self, fields: Mapping[bytes | str, bytes | str]) -> None:
        now = time.time()
        for raw_key, raw_value in fields.items():
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            value = raw_value.decode() if isinstance(raw_value, bytes) else raw_value
            if key.startswith(META_PREFIX):
                self.meta[key] = value
                continue
            try:
                cookie, created = _parsed(value)
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("cookie jar field %r unreadable, dropped: %s", key[:200],
                               type(exc).__name__)
                self._loaded[key] = value  # deleted at the next save
                self._dirty = True
                continue
            self._loaded[key] = value
            if cookie.is_expired(now):
                self._dirty = True  # gone at the next save, if there is one
                continue
            self._jar.set_cookie(cookie)
            self._created[_field(cookie)] = created
        if len(self._created) > self.max_cookies:
            self._dirty = True
            self._bound()

    def _bound(self) -> None:
        """Drop the oldest cookies past COOKIE_JAR_MAX_COOKIES / COOKIE_JAR_MAX_BYTES."""
        sizes = {_field(c): len(c.name) + len(c.value or "") for c in self._jar}
        total = sum(sizes.values())
        if len(sizes) <= self.max_cookies and total <= self.max_bytes:
            return
        cookies = {_field(c): c for c in self._jar}
        for key in sorted(sizes, key=lambda k: self._created.get(k, 0.0)):
            if len(sizes) <= self.max_cookies and total <= self.max_bytes:
                break
            cookie = cookies[key]
            self._jar.clear(cookie.domain, cookie.path, cookie.name)
            total -= sizes.pop(key)
            self._created.pop(key, None)


def _field(cookie: Cookie) -> str:
    return f"{cookie.domain};{cookie.path};{cookie.name}"


def _dump(cookie: Cookie, created: float) -> str:
    data = {"n": cookie.name, "v": cookie.value, "d": cookie.domain, "p": cookie.path,
            "e": cookie.expires, "s": cookie.secure, "ds": cookie.domain_specified,
            "dd": cookie.domain_initial_dot, "ps": cookie.path_specified,
            "ver": cookie.version, "c": round(created, 3)}
    if cookie.port is not None:
        data["port"] = cookie.port
    rest = {k: v for k, v in cookie._rest.items()}  # HttpOnly, SameSite: as the site sent them
    if rest:
        data["r"] = rest
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def _parsed(text: str) -> tuple[Cookie, float]:
    """A stored cookie, parsed once per worker: the pages of a site that sets cookies read the
    same fields again and again (a jar only replaces its cookies, never changes one in place,
    so one :class:`Cookie` may sit in many jars)."""
    known = _PARSED.get(text)
    if known is None:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        known = _PARSED[text] = _load(text)
    return known


def _load(text: str) -> tuple[Cookie, float]:
    data = json.loads(text)
    expires = data["e"]
    cookie = Cookie(
        version=data.get("ver", 0), name=str(data["n"]), value=data["v"],
        port=data.get("port"), port_specified=data.get("port") is not None,
        domain=str(data["d"]), domain_specified=bool(data["ds"]),
        domain_initial_dot=bool(data["dd"]), path=str(data["p"]),
        path_specified=bool(data["ps"]), secure=bool(data["s"]),
        expires=int(expires) if expires is not None else None, discard=expires is None,
        comment=None, comment_url=None, rest=dict(data.get("r") or {}))
    return cookie, float(data.get("c", 0.0))
