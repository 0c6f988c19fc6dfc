"""Credentials hidden wherever a setting is shown: a service URL with its password masked, and
the passwords a URL carries, for scrubbing them out of messages.

:func:`redact_url` is the one way a URL of RabbitMQ, Redis or the management API is shown
(``repr(Settings)``, configuration errors, logs): ``user:password@`` and ``:password@`` become
``user:***@`` and ``:***@``, query parameters that look like credentials (``password=``,
``token=``, ...) become ``name=***``, and a URL whose host and port do not parse is not shown
at all (``amqp://<unparsable>``): a missing ``@`` would put the password there. Nor is text
without ``scheme://``.
:func:`url_secrets` and :func:`scrub` catch the same passwords inside any other text (an
exception message, a log line).
:func:`clip` caps a value from outside (a message's URL, an error) where a log line shows it:
a 5 MB URL in a poison message is 4 KiB of log and a ``…[+N chars]`` marker, not 5 MB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, unquote_plus, urlsplit

MASK = "***"
UNPARSABLE = "<unparsable>"
#: Longest value from outside a log line shows whole: twice MAX_URL_LENGTH's default, so a
#: canonical URL is never cut.
LOG_VALUE_MAX_CHARS = 4096

_HEAD = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
#: A host (name, IPv4 or [IPv6]) and an optional numeric port: what may be shown as it is.
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]*\]|[^\s:/?#@\[\]]*)(:[0-9]*)?")
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|auth|credential|key", re.I)
_SECRET_VALUE = re.compile(r"pass|pwd|secret|token", re.I)


def _split(url: str) -> tuple[str, str | None, str | None, str]:
    """``url`` as (``scheme://`` or "", user, password, the rest after ``@``).

    The userinfo ends at the *last* ``@`` of the authority, or of the whole URL when a
    password with an unescaped ``/``, ``?`` or ``#`` spilled past the authority.
    """
    match = _HEAD.match(url)
    head = match.group() if match else ""
    body = url[len(head):]
    authority = re.split(r"[/?#]", body, maxsplit=1)[0]
    if "@" in authority:
        cut = authority.rindex("@")
    elif "@" in body:
        cut = body.rindex("@")
    else:
        return head, None, None, body
    user, colon, password = body[:cut].partition(":")
    return head, user, password if colon else None, body[cut + 1:]


def _query_items(rest: str) -> list[tuple[str, str, str, bool]]:
    """(item, name, value, secret?) for each ``name=value`` of the query in ``rest``."""
    query = rest.partition("#")[0].partition("?")[2]
    items = []
    for item in filter(None, query.split("&")):
        name, _, value = item.partition("=")
        secret = bool(_SECRET_NAME.search(unquote_plus(name))
                      or _SECRET_VALUE.search(unquote_plus(value)))
        items.append((item, name, value, secret))
    return items


def redact_url(url: str) -> str:
    """``url`` with its password (and credential-like query values) replaced by ``***``.

    Never returns a password: a URL whose host or port does not parse gives
    ``scheme://<unparsable>``, and text that does not start with ``scheme://`` (a bare
    password pasted in the wrong place?) gives ``<unparsable>``.
    """
    head, user, password, rest = _split(url)
    if not head:  # not scheme://...: a bare password or a typo, nothing safe to show
        return UNPARSABLE
    hosts = re.split(r"[/?#]", rest, maxsplit=1)[0]
    try:
        if "," not in hosts:
            urlsplit(url).port  # noqa: B018 - raises ValueError on a host or port that is not one
        elif urlsplit(url).netloc.rpartition("@")[2] != hosts:
            return head + UNPARSABLE  # a Redis Cluster's hosts, moved by a '#' or '/' before them
        for host in hosts.split(","):
            urlsplit(f"//{host}").port  # noqa: B018 - as above, each of a cluster's hosts
            if not _HOST_PORT.fullmatch(host):
                return head + UNPARSABLE
    except ValueError:
        return head + UNPARSABLE
    userinfo = "" if user is None else (f"{user}:{MASK}@" if password is not None else f"{user}@")
    before, hash_sign, fragment = rest.partition("#")
    path, sep, _query = before.partition("?")
    if sep:
        shown = [f"{name}={MASK}" if secret else item
                 for item, name, _value, secret in _query_items(rest)]
        rest = f"{path}?{'&'.join(shown)}{hash_sign}{fragment}"
    return head + userinfo + rest


def url_secrets(url: str) -> set[str]:
    """The passwords ``url`` carries, as written and percent-decoded (empty ones left out)."""
    _head, _user, password, rest = _split(url)
    found = {password} if password else set()
    found.update(value for _item, _name, value, secret in _query_items(rest) if secret and value)
    return {form for secret in found for form in (secret, unquote(secret), unquote_plus(secret))
            if form}


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***`` (longest first, so
    a secret that contains another is masked whole)."""
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def clip(text: str, max_chars: int = LOG_VALUE_MAX_CHARS) -> str:
    """``text`` cut to its first ``max_chars`` characters plus a ``…[+N chars]`` marker saying
    how many were left out; unchanged when it is not longer."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}…[+{len(text) - max_chars} chars]"
