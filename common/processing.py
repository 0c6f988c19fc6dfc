"""What a worker does with one message, decided off the I/O thread.

:meth:`Processor.process` runs in a worker thread: it decodes the message, fetches, parses and
records the result in Redis, and returns an :class:`Outcome` telling the I/O thread what must
be durably published (dead-letter, retry) before the delivery may be acked. It never talks to
RabbitMQ itself: pika channels belong to the connection's thread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from common.config import Settings
from common.deadletter import DLQ_EXCHANGE, DLQ_ROUTING_KEY, dead_letter_headers
from common.errors import BadMessage, FetchError, InvalidURL
from common.fetch import Fetcher, FetchResult
from common.messages import WorkMessage
from common.parse import NotHTML, is_html, parse_html
from common.results import ResultStore
from common.urls import canonicalize

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publish:
    """A message the I/O thread must publish (with confirm) before acking the delivery."""

    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any] | None = None
    expiration_ms: int | None = None


@dataclass(frozen=True)
class Outcome:
    kind: str  # "result" | "dead_letter" | "retry"
    url: str
    publishes: tuple[Publish, ...] = field(default=())
    detail: str = ""


class Processor:
    def __init__(self, settings: Settings, fetcher: Fetcher, results: ResultStore) -> None:
        self.settings = settings
        self.fetcher = fetcher
        self.results = results

    def process(self, body: bytes, queue: str) -> Outcome:
        try:
            message = WorkMessage.from_json(body)
        except BadMessage as exc:
            return self._dead_letter(body, "<unparsable>", BadMessage.reason, str(exc))
        try:
            url = canonicalize(message.url, max_length=self.settings.max_url_length)
        except InvalidURL as exc:
            return self._dead_letter(body, message.url, InvalidURL.reason, str(exc))

        fetched_at = time.time()
        try:
            response = self.fetcher.fetch(url)
        except FetchError as exc:
            record = self._base_record(url, message, queue, fetched_at)
            record.update(status=None, error=f"{exc.kind}: {exc}")
            self.results.record(record)
            return Outcome("result", url, detail=f"error {exc.kind}")
        record = self._base_record(url, message, queue, fetched_at)
        record.update(self._describe(response))
        self.results.record(record)
        return Outcome("result", url, detail=f"status {response.status}")

    def _base_record(self, url: str, message: WorkMessage, queue: str,
                     fetched_at: float) -> dict[str, Any]:
        return {"url": url, "fetched_at": round(fetched_at, 3), "worker": self.settings.worker_id,
                "queue": queue, "depth": message.depth, "attempts": message.attempts + 1,
                "cached": False, "error": None}

    def _describe(self, response: FetchResult) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "final_url": response.final_url, "status": response.status,
            "content_type": response.content_type, "bytes": len(response.body),
            "truncated": response.truncated, "elapsed_ms": round(response.elapsed_ms, 1),
        }
        if response.body and is_html(response.content_type, response.body[:512]):
            try:
                page = parse_html(response.body, response.final_url, response.content_type)
            except NotHTML as exc:
                fields["error"] = f"not_html: {exc}"
            else:
                fields.update(page.to_dict())
        return fields

    def worker_error(self, body: bytes, exc: BaseException) -> Outcome:
        """The outcome for a message whose processing raised an unexpected exception."""
        return self._dead_letter(body, "<unknown>", "worker_error", f"{type(exc).__name__}: {exc}")

    def _dead_letter(self, body: bytes, url: str, reason: str, error: str) -> Outcome:
        headers = dead_letter_headers(reason, last_error=error)
        publish = Publish(DLQ_EXCHANGE, DLQ_ROUTING_KEY, body, headers=headers)
        return Outcome("dead_letter", url, (publish,), detail=f"{reason}: {error}")
