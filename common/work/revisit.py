"""Conditional requests: a revisit asks "changed since?" and a 304 is recorded as unchanged.

A page's result record keeps its validators, ``etag`` and ``last_modified`` (the response's
``ETag`` and ``Last-Modified``, :func:`validators_of`). The scheduler keeps the last ones of
each scheduled URL and puts them into the recrawl's message as ``extra["validators"]``
(common/intake/recrawler.py); :func:`conditional_headers` turns them into ``If-None-Match`` and
``If-Modified-Since`` for that one fetch. A ``304 Not Modified`` is then recorded by the
processor as ``status: 304, unchanged: true`` with the validators it carried: no parse, no
content hash, not a failure — the scheduler reads it as "unchanged" and lets the interval grow.

A message may also carry request headers of its own (``extra["headers"]``: a handler's
``page.follow(url, headers=...)``), checked when the message is decoded
(:func:`common.core.headers.check_headers`); :func:`request_headers` sends them under the
conditional ones, which win a name both give.

Validators come from sites, so they are taken only as short printable ASCII (at most
:data:`MAX_VALIDATOR_CHARS`): a value with a line break could otherwise add request headers
of its own.
"""

from __future__ import annotations

from common.broker.messages import WorkMessage
from common.web.curl import MAX_VALIDATOR_CHARS, sendable
from common.web.fetch import FetchResult

__all__ = ["MAX_VALIDATOR_CHARS", "conditional_headers", "request_headers", "validators_of"]

#: Record field -> (response header, request header that sends it back).
_FIELDS = (("etag", "etag", "If-None-Match"),
           ("last_modified", "last-modified", "If-Modified-Since"))


def validators_of(response: FetchResult) -> dict[str, str]:
    """The response's validators as record fields (only those present and clean)."""
    found: dict[str, str] = {}
    for field, header, _request in _FIELDS:
        value = sendable(response.headers.get(header))
        if value is not None:
            found[field] = value
    return found


def conditional_headers(message: WorkMessage) -> tuple[str, ...]:
    """``If-None-Match`` / ``If-Modified-Since`` lines from the message's previous validators
    (``extra["validators"]``); empty for a first visit or validators that are not clean."""
    given = message.extra.get("validators")
    if not isinstance(given, dict):
        return ()
    lines = []
    for field, _header, request in _FIELDS:
        value = sendable(given.get(field))
        if value is not None:
            lines.append(f"{request}: {value}")
    return tuple(lines)


def request_headers(message: WorkMessage, asked: dict[str, str] | None) -> tuple[str, ...]:
    """The header lines of ``message``'s fetch: ``asked`` (its own headers, already checked),
    then the conditional ones (:func:`conditional_headers`), which replace any of ``asked``
    with the same name."""
    conditional = conditional_headers(message)
    if not asked:
        return conditional
    taken = {line.split(":", 1)[0].lower() for line in conditional}
    return (*(f"{name}: {value}" for name, value in asked.items()
              if name.lower() not in taken), *conditional)
