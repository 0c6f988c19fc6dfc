"""The result record of one fetched URL: every field capped, the whole record within
MAX_RECORD_BYTES, and what was cut flagged in the record itself.

Field caps, in characters (:data:`FIELD_CAPS`; NOTES.md, "Bounded records", says why):

* ``title`` 1,024, ``description`` 2,048, ``language`` 64, ``content_type`` 256, ``error``
  1,024: a longer value is cut to its first characters and flagged ``<field>_truncated``.
* ``canonical``, ``final_url`` and ``redirected_from`` 2,048: a longer one is dropped (null)
  and flagged ``<field>_truncated``, as a prefix of a URL is another URL (parse already skips
  a longer canonical and says so). ``redirected_from`` comes from the message: anything but a
  string is dropped the same way, and lone surrogates in it are kept as backslash escapes.
* each link 2,048: parse never keeps a longer one (links.MAX_URL_CHARS).
* ``links``: the first RECORD_MAX_LINKS in document order. ``links_count`` is how many the
  page had (at most parse's 10,000; ``links_truncated`` says it had more), ``links_kept`` how
  many the record holds, present only when fewer.

``etag`` and ``last_modified`` (the response's validators, common/work/revisit.py) are at most
256 printable ASCII characters or absent.
``http_version`` ("1.1", "2", "3") and ``remote_ip`` (the address the response came from: the
proxy's through a proxy) are null for a cached response; ``proxy`` (credentials removed) and
``tls_verified: false`` (FETCH_INSECURE_DOMAINS) are present only when they apply.
``url`` is canonical and at most MAX_URL_LENGTH long, ``worker`` is WORKER_ID, ``queue``,
``encoding``, ``skipped`` and ``content_hash`` are short names or digests, ``archive``
(ARCHIVE=warc) a WARC file name and two numbers, the rest are numbers and booleans. A flag
is present only when something was cut: a normal page's record gains only ``links_count``.

The byte cap (:func:`bound`): a record whose JSON is still longer than MAX_RECORD_BYTES loses
links from the end, then its extracted ``data`` (EXTRACT_RULES: dropped whole, with
``data_errors``, and flagged ``data_truncated``), then its longest text fields are shortened
(URL fields dropped), until it fits; it is flagged ``record_truncated``. Only the record's own fields are ever cut, never its
JSON, so the JSON stays valid. The common case costs one extra encode of the small fields:
the links, most of the bytes, are encoded once and handed to the store's encode as an
``orjson.Fragment``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from common.web.fetch import FetchResult
from common.work.links import MAX_URL_CHARS
from common.work.parse import Page
from common.work.revisit import validators_of

logger = logging.getLogger(__name__)

TITLE_MAX_CHARS = 1024
DESCRIPTION_MAX_CHARS = 2048
LANGUAGE_MAX_CHARS = 64
CONTENT_TYPE_MAX_CHARS = 256
ERROR_MAX_CHARS = 1024
URL_MAX_CHARS = MAX_URL_CHARS  # canonical, final_url, each link; MAX_URL_LENGTH's default

#: Field -> (cap in characters, whether a longer value is dropped rather than cut).
FIELD_CAPS: dict[str, tuple[int, bool]] = {
    "title": (TITLE_MAX_CHARS, False),
    "description": (DESCRIPTION_MAX_CHARS, False),
    "language": (LANGUAGE_MAX_CHARS, False),
    "content_type": (CONTENT_TYPE_MAX_CHARS, False),
    "error": (ERROR_MAX_CHARS, False),
    "canonical": (URL_MAX_CHARS, True),
    "final_url": (URL_MAX_CHARS, True),
    "redirected_from": (URL_MAX_CHARS, True),  # copied from the message (steps/record.py)
}

_CAPS = tuple((field, cap, drop) for field, (cap, drop) in FIELD_CAPS.items())
_warned: set[int] = set()  # MAX_RECORD_BYTES values found below the smallest record


def fetch_record(url: str, response: FetchResult, *, worker: str, queue: str, depth: int,
                 attempts: int, cached: bool) -> dict[str, Any]:
    """The fields every result has, from the fetch."""
    record: dict[str, Any] = {
        "url": url, "fetched_at": round(time.time(), 3), "worker": worker,
        "queue": queue, "depth": depth, "attempts": attempts,
        "cached": cached, "error": None, "final_url": response.final_url,
        "status": response.status, "content_type": response.content_type,
        "bytes": len(response.body), "truncated": response.truncated,
        "elapsed_ms": round(response.elapsed_ms, 1), "redirects": response.redirects,
        "http_version": response.http_version, "remote_ip": response.remote_ip,
    }
    if response.proxy is not None:
        record["proxy"] = response.proxy  # credentials removed (Fetcher)
    if getattr(response, "rendered", False):
        record["rendered"] = True  # the DOM after Chromium ran its scripts
    if response.tls_verified is False:
        record["tls_verified"] = False  # FETCH_INSECURE_DOMAINS: said in every such record
    if response.skipped:
        record["skipped"] = response.skipped
    record.update(validators_of(response))  # etag, last_modified: a revisit sends them back
    archive = getattr(response, "archive", None)  # ARCHIVE=warc: where the response was kept
    if archive is not None:
        record["archive"] = archive
    return record


def add_page(record: dict[str, Any], page: Page, max_links: int) -> None:
    """Add a parsed page's fields, its links cut to the first ``max_links``."""
    links = page.links
    record.update(
        title=page.title, description=page.description, canonical=page.canonical,
        language=page.language,
        links=list(links if len(links) <= max_links else links[:max_links]),
        links_truncated=page.links_truncated, links_count=len(links),
        text_length=page.text_length, content_hash=page.content_hash, encoding=page.encoding)
    if len(links) > max_links:
        record["links_kept"] = max_links
    if page.canonical_truncated:
        record["canonical_truncated"] = True


def failure_record(url: str, headers: dict[str, Any], *, worker: str, queue: str | None,
                   depth: int | None) -> dict[str, Any]:
    """What the ``failures`` stream gets for a dead-lettered URL (common/store/results.py).
    ``last_error`` is already cut to 500 characters by the dead-letter headers; a message's
    URL may be anything, so it is cut to URL_MAX_CHARS (``url_truncated``), and text that is
    not valid Unicode (a lone surrogate from a poison message) is kept as backslash escapes."""
    record = {"url": url[:URL_MAX_CHARS], "outcome": "dead_letter", **headers,
              "worker": worker, "queue": queue, "depth": depth,
              "failed_at": round(time.time(), 3)}
    if len(url) > URL_MAX_CHARS:
        record["url_truncated"] = True
    return {key: _valid_text(value) for key, value in record.items()}


def _valid_text(value: Any) -> Any:
    """``value`` as JSON can carry it: a str with lone surrogates gets them as ``\\udXXX``."""
    if not isinstance(value, str):
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def bound(record: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """Cap every field (:data:`FIELD_CAPS`), then fit the record's JSON in ``max_bytes``.

    Changes ``record`` in place and returns it. When it fits (nearly always), ``links``
    becomes an ``orjson.Fragment`` holding the links' JSON, so that the store's one
    ``orjson.dumps`` of the record copies those bytes instead of encoding them again; read
    ``links`` before calling this. Otherwise links are dropped from the end, then ``data``,
    then the longest text fields shortened, with the flags the module docstring lists. If even the record
    without links and text (URL, worker, numbers) is longer, it is stored as it is and a
    warning logged (once per process): MAX_RECORD_BYTES is below the smallest record.
    """
    for field, cap, drop in _CAPS:
        value = record.get(field)
        if value and (type(value) is not str or len(value) > cap):
            record[field] = None if drop or type(value) is not str else value[:cap]
            record[field + "_truncated"] = True
    links = record.get("links")
    if links:
        record["links"] = orjson.Fragment(orjson.dumps(links))
    try:
        size = len(orjson.dumps(record))
    except TypeError:  # orjson refuses lone surrogates (a message's redirected_from)
        for field in FIELD_CAPS.keys() & record.keys():
            record[field] = _valid_text(record[field])
        size = len(orjson.dumps(record))
    if size <= max_bytes:
        return record
    if links:
        record["links"] = links
    record["record_truncated"] = True
    if links:
        _drop_links(record, links, max_bytes)
    for field in ("items", "data"):  # a handler's items first, then the rules' data
        if record.get(field) is not None and len(orjson.dumps(record)) > max_bytes:
            # Extracted values are dropped whole, never cut: half a list reads as the page.
            record[field] = None
            record[field + "_truncated"] = True
            if field == "data":
                record.pop("data_errors", None)
    _shorten_texts(record, max_bytes)
    return record


def _drop_links(record: dict[str, Any], links: list[str], max_bytes: int) -> None:
    """Keep the first links that fit, dropping the rest from the end (O(links kept))."""
    record["links"] = []
    record.setdefault("links_kept", len(links))  # the final count has no more digits
    room = max_bytes - len(orjson.dumps(record))
    keep = 0
    for link in links:
        room -= len(orjson.dumps(link)) + (1 if keep else 0)  # the link and its comma
        if room < 0:
            break
        keep += 1
    record["links"] = links[:keep]
    record["links_kept"] = keep


def _shorten_texts(record: dict[str, Any], max_bytes: int) -> None:
    """Shorten the longest text field (drop a URL field) until the record fits."""
    size = len(orjson.dumps(record))
    while size > max_bytes:
        candidates = [f for f in FIELD_CAPS if record.get(f)]
        if not candidates:
            if max_bytes not in _warned:  # a setting too small: say it once, not per page
                _warned.add(max_bytes)
                logger.warning("result record of %s is %d bytes with no links or text left; "
                               "MAX_RECORD_BYTES=%d is below the smallest record",
                               record.get("url"), size, max_bytes)
            return
        field = max(candidates, key=lambda f: len(record[f]))
        record[field + "_truncated"] = True
        excess = len(orjson.dumps(record)) - max_bytes
        value = record[field]
        # Every character takes at least one byte, so cutting `excess` characters is enough.
        record[field] = None if FIELD_CAPS[field][1] or excess >= len(value) else \
            value[: len(value) - excess]
        size = len(orjson.dumps(record))
