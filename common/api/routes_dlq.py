"""Dead letters and failures: list them (nothing removed), replay them by reason or job, and page
through the ``failures`` stream (one record a dead-lettered URL).

Listing and replay are common/ops/dlq.py's, as ``scrape-fleet dlq list|replay`` runs them:
listing takes letters with ``basic_get`` and never acks them (the queue is left as it was);
replay sends them back through the producer path, each into its own job's running run, and
leaves a letter whose run is not running in the queue (``refused``, by why).

``/api/failures`` pages like the results: ``after`` (a stream id, exclusive) and ``limit``;
the answer's ``next`` is the ``after`` of the next page, None at the end of the stream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import redis
from fastapi import Depends, FastAPI, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from common.api.deps import Admin, Reader, redis_of, settings_of, unprocessable
from common.api.routes_fleet import broker
from common.core.config import Settings
from common.ops import dlq
from common.ops.export import parse_stream_id
from common.sink.files import job_dir
from common.store.keys import FAILURES_STREAM

Config = Annotated[Settings, Depends(settings_of)]
Client = Annotated[redis.Redis, Depends(redis_of)]
#: Most letters one listing looks at when it filters by reason (each is a basic_get).
MAX_BROWSE = 10_000
#: Most stream entries one page of failures reads while it filters by job.
MAX_SCAN = 10_000


def _job(name: str | None, where: str) -> str | None:
    if name is not None:
        try:
            job_dir(Path("."), name)  # what no job can be named (export's check)
        except ValueError as exc:
            raise unprocessable(where, "job", message=str(exc)) from None
    return name


class Replay(BaseModel):
    """Which dead letters go back: by reason and job, at most ``limit`` (all by default)."""

    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(None, min_length=1, max_length=200)
    job: str | None = Field(None, min_length=1, max_length=100)
    limit: int | None = Field(None, ge=1, le=1_000_000)


def failures(client: redis.Redis, job: str | None, after: str, limit: int) -> dict[str, Any]:
    """Up to ``limit`` failure records after stream id ``after`` (of ``job``: any for None)."""
    items: list[dict[str, Any]] = []
    cursor, scanned, low = after, 0, after if after == "-" else f"({after}"
    while len(items) < limit and scanned < MAX_SCAN:
        batch = client.xrange(FAILURES_STREAM, min=low, max="+", count=min(500, MAX_SCAN))
        if not batch:
            return {"items": items, "next": None}
        for raw_id, fields in batch:
            cursor = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            scanned += 1
            record = json.loads(fields[b"json"] if b"json" in fields else fields["json"])
            if job is None or record.get("job") == job:
                items.append({"id": cursor, **record})
                if len(items) == limit:
                    break
        low = f"({cursor}"
    last = client.xrevrange(FAILURES_STREAM, count=1)
    at_end = not last or (last[0][0].decode() if isinstance(last[0][0], bytes)
                          else last[0][0]) == cursor
    return {"items": items, "next": None if at_end else cursor}


def include(app: FastAPI) -> None:
    @app.get("/api/dead-letters", tags=["dead letters"])
    def dead_letters(caller: Reader, settings: Config,
                     job: Annotated[str | None, Query(max_length=100)] = None,
                     run: Annotated[int | None, Query(ge=1)] = None,
                     reason: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
        """Dead letters, oldest first, left in the queue; with counts by reason of those
        looked at (every one of ``job`` and ``run`` when ``reason`` filters)."""
        _job(job, "query")
        if run is not None and job is None:
            raise unprocessable("query", "run", message="run goes with job")
        with broker(settings) as connection:
            letters = dlq.browse(connection, MAX_BROWSE if reason else limit, job=job, run=run)
        by_reason = dlq.count_by_reason(letters)
        chosen = [letter for letter in letters if reason is None or letter.reason == reason]
        return {"letters": [letter.as_dict() for letter in chosen[:limit]],
                "looked_at": len(letters), "by_reason": by_reason}

    @app.post("/api/dead-letters/replay", tags=["dead letters"])
    def replay(caller: Admin, settings: Config, client: Client, asked: Replay) -> dict[str, Any]:
        """Send dead letters back through routing (each into its job's running run); a letter
        whose run is not running stays in the queue, counted in ``refused`` by why."""
        _job(asked.job, "body")
        with broker(settings) as connection:
            summary = dlq.replay(settings, connection, client, reason=asked.reason,
                                 limit=asked.limit, job=asked.job)
        return {"replayed": summary.matched, "unreplayable": summary.skipped_unreplayable,
                "kept": sum(summary.refused.values()), "refused": summary.refused,
                "produced": summary.produced.as_dict()}

    @app.get("/api/failures", tags=["dead letters"])
    def list_failures(caller: Reader, client: Client,
                      job: Annotated[str | None, Query(max_length=100)] = None,
                      after: Annotated[str, Query(max_length=50)] = "-",
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
        """Failure records (one a dead-lettered URL: its reason, error, job and run), oldest
        first, from after the stream id ``after``; ``next`` continues."""
        _job(job, "query")
        try:
            start = parse_stream_id(after)
        except ValueError as exc:
            raise unprocessable("query", "after", message=str(exc)) from None
        try:
            return failures(client, job, start, limit)
        except redis.RedisError as exc:
            raise HTTPException(503, f"Redis: {type(exc).__name__}") from None
