"""A job's progress as server-sent events: ``GET /api/jobs/{name}/progress/stream``.

One ``data: {RunProgress as JSON}`` event every ``interval`` seconds (one state read and one
:func:`~common.jobs.progress.measure` call a tick, in a worker thread: the event loop never
waits on Redis), then ``event: end`` once the run is finished or cancelled (its last figures)
or the job is deleted (``{"name": …, "state": "deleted"}``); ``event: error`` if Redis fails
(an EventSource reconnects by itself: a client closes it on ``end``). A client that goes away
ends it: Starlette cancels the generator when the connection closes (ASGI http.disconnect).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import redis
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import StreamingResponse

from common.api.deps import Reader
from common.api.routes_jobs import registry_of, state_or_404
from common.jobs.progress import measure
from common.jobs.registry import ENDED, JobRegistry, JobStateError

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/api/jobs", tags=["jobs"])


def _tick(registry: JobRegistry, name: str) -> tuple[str, dict[str, Any]]:
    """("data" | "end" | "error", the event's body)."""
    try:
        state = registry.state(name)
        [progress] = measure(registry.client, [state])
    except JobStateError:
        return "end", {"name": name, "state": "deleted"}
    except redis.RedisError as exc:
        logger.warning("progress stream of job %s: Redis failed: %s", name, exc)
        return "error", {"name": name, "error": f"Redis: {type(exc).__name__}"}
    return ("end" if state.state in ENDED else "data"), progress.as_dict()


def _event(kind: str, body: dict[str, Any]) -> str:
    text = json.dumps(body, separators=(",", ":"))
    return f"data: {text}\n\n" if kind == "data" else f"event: {kind}\ndata: {text}\n\n"


async def _events(registry: JobRegistry, name: str, interval_s: float) -> AsyncIterator[str]:
    while True:
        kind, body = await anyio.to_thread.run_sync(_tick, registry, name)
        yield _event(kind, body)
        if kind != "data":
            return
        await anyio.sleep(interval_s)


@router.get("/{name}/progress/stream", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}},
                             "description": "server-sent events: `data: {progress}` each "
                             "interval, then `event: end`"},
                       404: {"description": "no job"}})
def stream_progress(request: Request, caller: Reader, name: str,
                    interval: float = Query(1.0, ge=0.2, le=10,
                                            description="seconds between events")
                    ) -> StreamingResponse:
    """The current run's progress as server-sent events until the run ends."""
    registry = registry_of(request)
    state_or_404(registry, name)
    return StreamingResponse(_events(registry, name, interval), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def include(app: FastAPI) -> None:
    app.include_router(router)
