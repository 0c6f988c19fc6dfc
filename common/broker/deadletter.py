"""Dead-letter records: what a message in ``failed_urls`` carries and how it gets there.

Headers on every dead-lettered message (AMQP table)::

    reason          invalid_url | bad_message | http_4xx | max_retries | robots_disallowed | ...
    attempts        fetch attempts made (0 when never fetched)
    last_status     last HTTP status, when there was one
    last_error      exception class or short error text, when there was one
    first_failure   ISO 8601 UTC time of the first failure
    last_failure    ISO 8601 UTC time of the last failure

Times are strings because AMQP tables carry no floats.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from common.broker import topology


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def dead_letter_headers(reason: str, *, attempts: int = 0, last_status: int | None = None,
                        last_error: str | None = None,
                        first_failure: str | None = None) -> dict[str, Any]:
    now = utc_now_iso()
    headers: dict[str, Any] = {"reason": reason, "attempts": attempts,
                               "first_failure": first_failure or now, "last_failure": now}
    if last_status is not None:
        headers["last_status"] = last_status
    if last_error is not None:
        headers["last_error"] = last_error[:500]
    return headers


DLQ_EXCHANGE = topology.FAILED_EXCHANGE
DLQ_ROUTING_KEY = topology.FAILED_ROUTING_KEY
