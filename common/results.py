"""Results: one JSON record per URL, appended to the Redis stream ``results``.

Record fields: url, final_url, status, title, description, canonical, language, links,
links_count, text_length, content_hash, content_type, bytes, truncated, fetched_at,
elapsed_ms, worker, queue, depth, attempts, cached, error. The stream is capped with an
approximate MAXLEN (``RESULTS_MAXLEN``) so it cannot grow without bound; readers use XRANGE /
XREAD from an id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import redis

from common.keys import RESULTS_STREAM


class ResultStore:
    def __init__(self, client: redis.Redis, maxlen: int) -> None:
        self.client = client
        self.maxlen = maxlen

    def record(self, record: dict[str, Any]) -> str:
        """Append one result; returns its stream id."""
        entry_id = self.client.xadd(RESULTS_STREAM, {"json": encode(record)},
                                    maxlen=self.maxlen, approximate=True)
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    def count(self) -> int:
        return int(self.client.xlen(RESULTS_STREAM))

    def iter_records(self, start: str = "-", batch: int = 1000) -> Iterator[tuple[str, dict]]:
        """Every record from ``start`` (a stream id, inclusive) on, oldest first."""
        cursor = start
        exclusive = False
        while True:
            low = f"({cursor}" if exclusive else cursor
            entries = self.client.xrange(RESULTS_STREAM, min=low, max="+", count=batch)
            if not entries:
                return
            for entry_id, fields in entries:
                ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                yield ident, json.loads(fields[b"json"] if b"json" in fields else fields["json"])
            cursor, exclusive = ident, True


def encode(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)
