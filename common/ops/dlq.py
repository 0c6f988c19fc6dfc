"""Dead-letter queue tools: list, replay, purge ``failed_urls``.

Listing is non-destructive: messages are fetched with ``basic_get`` (manual ack) and never
acked, so closing the channel puts every one back where it was. Replay takes the matching
messages, resets each URL's retry counter (``failures:{url}``), releases its fingerprint, and
sends it through the producer path again (canonicalise → dedupe → route → confirmed
publish); only once that publish is confirmed is the dead letter acked.

A dead letter's body may hold anything (a poison message): what is listed is escaped where
standard output cannot encode it (a lone surrogate from a ``\\ud800`` in the JSON, any
non-ASCII character on an ASCII terminal) as backslash escapes, so ``dlq list`` prints every
letter; replay uses the URL as the body holds it.
"""

from __future__ import annotations

import codecs
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pika
import redis

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.errors import BadMessage, InvalidURL
from common.core.urls import canonicalize, fingerprint
from common.intake.producer import Producer, ProduceSummary
from common.store.dedupe import DoneSet, SeenSet
from common.store.keys import failures_key


@dataclass(frozen=True)
class DeadLetter:
    """``url`` is for showing (:func:`_shown`), ``raw_url`` as the body holds it (replay)."""

    url: str
    reason: str
    headers: dict[str, Any]
    body: bytes
    raw_url: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "reason": self.reason,
                **{k: _shown(_plain(v)) for k, v in self.headers.items() if k != "reason"}}


@dataclass
class ReplaySummary:
    matched: int = 0
    skipped_unreplayable: int = 0
    produced: ProduceSummary = field(default_factory=ProduceSummary)


def _plain(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _shown(value: Any) -> Any:
    """A str as standard output can print it: what its encoding cannot hold (a lone surrogate
    anywhere, non-ASCII on an ASCII terminal) as backslash escapes; other values unchanged."""
    if not isinstance(value, str):
        return value
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        codecs.lookup(encoding)
    except LookupError:  # an encoding Python does not know: UTF-8 is what is written then
        encoding = "utf-8"
    try:
        value.encode(encoding)
    except UnicodeEncodeError:  # what the terminal cannot print becomes backslash escapes
        return value.encode(encoding, "backslashreplace").decode(encoding)
    return value


def _decode(body: bytes, headers: dict[str, Any] | None) -> DeadLetter:
    headers = dict(headers or {})
    try:
        url = WorkMessage.from_json(body).url
    except BadMessage:
        url = "<unparsable>"
    return DeadLetter(url=_shown(url), reason=_shown(str(_plain(headers.get("reason", "unknown")))),
                      headers=headers, body=body, raw_url=url)


def browse(connection: pika.BlockingConnection, limit: int | None = None) -> list[DeadLetter]:
    """Up to ``limit`` dead letters, oldest first, leaving the queue as it was."""
    channel = connection.channel()
    try:
        out = []
        while limit is None or len(out) < limit:
            method, props, body = channel.basic_get(topology.FAILED_QUEUE, auto_ack=False)
            if method is None:
                break
            out.append(_decode(body, props.headers))
        return out
    finally:
        channel.close()  # unacked messages go back to the queue in their order


def count_by_reason(letters: list[DeadLetter]) -> dict[str, int]:
    return dict(Counter(letter.reason for letter in letters).most_common())


def replay(settings: Settings, connection: pika.BlockingConnection, client: redis.Redis,
           *, reason: str | None = None, limit: int | None = None) -> ReplaySummary:
    """Send matching dead letters back through routing; ack each once it is re-published."""
    summary = ReplaySummary()
    channel = connection.channel()
    matched: list[tuple[int, str]] = []
    try:
        while limit is None or len(matched) < limit:
            method, props, body = channel.basic_get(topology.FAILED_QUEUE, auto_ack=False)
            if method is None:
                break
            letter = _decode(body, props.headers)
            if reason is not None and letter.reason != reason:
                continue  # stays unacked: back in the queue when the channel closes
            if letter.raw_url == "<unparsable>":
                summary.skipped_unreplayable += 1
                continue
            matched.append((method.delivery_tag, letter.raw_url))
        summary.matched = len(matched)
        if not matched:
            return summary
        _forget([url for _tag, url in matched], settings, client)
        with Producer(settings, client) as producer:
            summary.produced = producer.submit(url for _tag, url in matched)
        if summary.produced.failed == 0:
            for tag, _url in matched:
                channel.basic_ack(tag)
        return summary
    finally:
        channel.close()


def _forget(urls: list[str], settings: Settings, client: redis.Redis) -> None:
    """Reset retry counters and release fingerprints, so replayed URLs count as new."""
    canonical = []
    for url in urls:
        try:
            canonical.append(canonicalize(url, max_length=settings.max_url_length))
        except InvalidURL:
            continue  # goes back to the DLQ as invalid_url through the producer
    if canonical:
        client.delete(*(failures_key(url) for url in canonical))
        SeenSet(client, settings.seen_buckets).remove_many([fingerprint(u) for u in canonical])
        DoneSet(client, settings.seen_buckets).forget(canonical)


def purge(connection: pika.BlockingConnection) -> int:
    channel = connection.channel()
    try:
        return channel.queue_purge(topology.FAILED_QUEUE).method.message_count
    finally:
        channel.close()


def to_json_lines(letters: list[DeadLetter]) -> str:
    return "\n".join(json.dumps(letter.as_dict(), default=str) for letter in letters)
