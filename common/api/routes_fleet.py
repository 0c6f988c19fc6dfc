"""The fleet as ``scrape-fleet status`` sees it: the status snapshot, workers, queues, the
settings (redacted), and the API's own Prometheus metrics.

``/api/status`` and ``/api/queues`` read :func:`common.ops.stats.collect` (the snapshot of
``scrape-fleet status --json``) over one AMQP connection opened for the call and closed after
it; a broker or Redis that does not answer is a 503 naming the service. ``/api/workers`` reads
the heartbeats alone. ``/api/settings`` shows every knob as ``repr(Settings)`` and
``scrape-fleet config`` do: passwords as ``***``, URLs through redact_url. ``/api/metrics``
counts this process's calls by route, method and status in its own CollectorRegistry.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import pika
import redis
from fastapi import Depends, FastAPI, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.api.deps import Reader, redis_of, settings_of
from common.broker.connection import connect_rabbitmq
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, ServiceUnavailable
from common.core.redact import scrub
from common.ops import stats
from common.ops.status_view import worker_state
from common.store.workers import alive_workers

#: Longest wait for the broker within one call: a 503 soon beats a hung request.
BROKER_WAIT_S = 5.0

Config = Annotated[Settings, Depends(settings_of)]
Client = Annotated[redis.Redis, Depends(redis_of)]


@contextmanager
def broker(settings: Settings) -> Iterator[pika.BlockingConnection]:
    """An AMQP connection for one call, closed after it; HTTP 503 naming RabbitMQ or Redis
    when either does not answer (the message without passwords)."""
    hurried = settings.with_overrides(
        connect_retry_s=min(settings.connect_retry_s, BROKER_WAIT_S))
    try:
        connection = connect_rabbitmq(hurried)
    except ServiceUnavailable as exc:
        raise HTTPException(503, scrub(f"RabbitMQ: {exc}", settings.secrets())) from None
    try:
        yield connection
    except AMQP_CONNECTION_LOST as exc:
        raise HTTPException(503, f"RabbitMQ: {type(exc).__name__}") from None
    except redis.RedisError as exc:
        raise HTTPException(503, f"Redis: {type(exc).__name__}") from None
    finally:
        if connection.is_open:
            connection.close()


def snapshot(settings: Settings, client: redis.Redis) -> dict[str, Any]:
    """``scrape-fleet status --json``'s snapshot."""
    with broker(settings) as connection:
        return stats.collect(settings, connection, client)


def workers(client: redis.Redis) -> list[dict[str, Any]]:
    """The alive workers from their heartbeats: what they fetch now and whether they pause."""
    try:
        beats = alive_workers(client)
    except redis.RedisError as exc:
        raise HTTPException(503, f"Redis: {type(exc).__name__}") from None
    rows = []
    for beat in beats:
        age = round(max(0.0, time.time() - beat.get("beat", time.time())), 1)
        beat["beat_age_s"], beat["stale"] = age, age > 2 * beat.get("interval_s", 5)
        pressure = beat.get("pressure") or {}
        rows.append({
            "id": beat["id"], "host": beat.get("host"), "pid": beat.get("pid"),
            "current": beat.get("current", []), "in_flight": beat.get("in_flight", 0),
            "jobs": beat.get("jobs", {}), "processed": beat.get("processed", 0),
            "concurrency": beat.get("concurrency"),
            "paused": bool(pressure.get("paused")), "reason": pressure.get("reason"),
            "state": worker_state(beat), "beat_age_s": age, "stale": beat["stale"]})
    return rows


def knobs(settings: Settings) -> list[dict[str, Any]]:
    """Every setting as ``repr(Settings)`` shows it: passwords ``***``, URLs redacted."""
    secrets = settings.secrets()
    rows = []
    for knob in settings.knobs():
        value = getattr(settings, knob.attr)
        hidden = knob.secret or knob.url
        rows.append({"name": knob.env, "value": _plain(knob.show(value) if hidden else value,
                                                       secrets),
                     "default": _plain(knob.show(knob.default) if hidden else knob.default,
                                       secrets),
                     "secret": hidden, "help": knob.help})
    return rows


def _plain(value: Any, secrets: frozenset[str]) -> Any:
    """A JSON value: tuples as lists, other objects (networks, paths) as text; any password
    the settings hold scrubbed out of text once more."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, tuple | list):
        return [_plain(item, secrets) for item in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, secrets) for k, v in value.items()}
    return scrub(str(value), secrets)


class CountCalls:
    """ASGI middleware counting each HTTP call by its route's template (``/api/jobs/{name}``,
    never the raw path: bounded label values), method and status. Plain ASGI, so a streamed
    answer (server-sent events) passes through untouched."""

    def __init__(self, app: ASGIApp, calls: Counter) -> None:
        self.app = app
        self.calls = calls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]  # what an exception that no handler answered becomes

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting)
        finally:
            route = scope.get("route")  # set by the router on this same scope
            self.calls.labels(getattr(route, "path", "unmatched"), scope["method"],
                              str(status[0])).inc()


def include(app: FastAPI) -> None:
    registry = CollectorRegistry()
    calls = Counter("api_calls", "Control-plane calls by route, method and status",
                    ["route", "method", "status"], registry=registry)
    app.state.metrics = registry

    app.add_middleware(CountCalls, calls=calls)

    @app.get("/api/status", tags=["fleet"])
    def status(caller: Reader, settings: Config, client: Client) -> dict[str, Any]:
        """The fleet's snapshot, as ``scrape-fleet status --json`` prints it."""
        return snapshot(settings, client)

    @app.get("/api/workers", tags=["fleet"])
    def list_workers(caller: Reader, client: Client) -> dict[str, Any]:
        """Alive workers: host, URLs being fetched, in flight, job runs, paused and why."""
        return {"workers": workers(client)}

    @app.get("/api/queues", tags=["fleet"])
    def queues(caller: Reader, settings: Config, client: Client) -> dict[str, Any]:
        """Queue depths, consumers and rates (rates when the management API answers)."""
        found = snapshot(settings, client)
        return {key: found[key] for key in ("queues", "delayed", "dead_lettered",
                                            "expired_waiting", "to_do")}

    @app.get("/api/settings", tags=["fleet"])
    def settings_shown(caller: Reader, settings: Config) -> dict[str, Any]:
        """Every setting of this API process (the fleet's), passwords never shown."""
        return {"settings": knobs(settings)}

    @app.get("/api/metrics", tags=["fleet"], response_class=Response)
    def metrics(caller: Reader) -> Response:
        """Prometheus text of this API process's calls by route, method and status."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
