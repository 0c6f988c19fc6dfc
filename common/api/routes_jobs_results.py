"""A job run's results over HTTP: ``GET /api/jobs/{name}/results``.

Read from the results stream with common/ops/export.py's reader and job filter (as ``scrape-fleet
job results`` and ``export --job``), so the same caveat holds: a sink trims that stream to what
it has not written yet. Paged: ``{"items": [record + its stream "id"], "next": id | null}``,
``after`` the last page's ``next`` (exclusive); with ``format=jsonl|csv`` every matching record
(after ``after``) is streamed in that format instead, in constant memory.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from itertools import islice
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from common.api.deps import Reader, redis_of, settings_of
from common.api.routes_jobs import registry_of, state_or_404
from common.core.errors import ServiceUnavailable
from common.ops.export import Entry, Exporter, of_job, parse_stream_id, read_entries
from common.store.results import ResultStore

router = APIRouter(prefix="/api/jobs", tags=["jobs"])

MAX_LIMIT = 1000
#: Bytes of JSON Lines or CSV gathered before a chunk is sent.
CHUNK_BYTES = 64 * 1024
_MEDIA = {"jsonl": "application/x-ndjson", "csv": "text/csv; charset=utf-8"}


class ResultsPage(BaseModel):
    items: list[dict[str, Any]] = Field(description="records, oldest first, each with its "
                                        "stream id as `id`")
    next: str | None = Field(description="`after` for the next page; null: no more")


def _after(entries: Iterator[Entry], after: str | None) -> Iterator[Entry]:
    for entry_id, record in entries:
        if entry_id != after:  # the stream read starts at ``after`` inclusive
            yield entry_id, record


def _chunks(entries: Iterator[Entry], fmt: str) -> Iterator[str]:
    buffer = io.StringIO()
    exporter = Exporter(buffer, fmt)
    for entry_id, record in entries:
        exporter.write(entry_id, record)
        if buffer.tell() >= CHUNK_BYTES:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


@router.get("/{name}/results", response_model=ResultsPage,
            responses={200: {"content": {"application/x-ndjson": {}, "text/csv": {}},
                             "description": "a page (JSON), or every record with format"},
                       404: {"description": "no job"}})
def job_results(request: Request, caller: Reader, name: str,
                run: int | None = Query(None, ge=1, description="default: the current run"),
                after: str | None = Query(None, description="a stream id: records after it"),
                limit: int = Query(100, ge=1, le=MAX_LIMIT,
                                   description="records a page (a format streams them all)"),
                format: Literal["jsonl", "csv"] | None = Query(  # noqa: A002 - the API's word
                    None, description="stream every matching record in this format")
                ) -> Any:
    """A run's records from the results stream, paged or streamed whole."""
    state = state_or_404(registry_of(request), name)
    if after is not None:
        try:
            after = parse_stream_id(after)
        except ValueError as exc:
            raise HTTPException(422, [{"loc": ["query", "after"], "msg": str(exc),
                                       "type": "value_error"}]) from None
        if after == "-":
            after = None
    chosen = run or state.run
    store = ResultStore(redis_of(request), settings_of(request).results_maxlen)
    mine = _after(of_job(read_entries(store, after or "-"), name, chosen), after)
    if format is not None:
        return StreamingResponse(_chunks(mine, format), media_type=_MEDIA[format])
    try:
        page = list(islice(mine, limit + 1)) if chosen else []
    except ServiceUnavailable as exc:
        raise HTTPException(503, str(exc)) from None
    items = [{"id": entry_id, **record} | {"id": entry_id} for entry_id, record in page[:limit]]
    return ResultsPage(items=items, next=page[limit - 1][0] if len(page) > limit else None)


def include(app: FastAPI) -> None:
    app.include_router(router)
