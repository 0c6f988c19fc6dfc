"""Worker heartbeats: each live worker keeps ``workers:{id}`` fresh in Redis.

A background thread rewrites the key every HEARTBEAT_INTERVAL_S with a TTL of three
intervals, so the status view lists live workers and a worker killed with -9 disappears by
itself within 3 intervals. A clean stop deletes the key at once. The beat carries the worker's
pause state (``pressure``: paused, reason, health and the figures; common/work/pressure.py).

A Redis that refuses the write (OOM at ``maxmemory``: SET is refused, EXPIRE is not) gets the
last beat's TTL renewed instead, so a paused worker stays listed; its ``beat`` time then shows
how old the figures are (the status view marks it stale).

The beat's ``jobs`` ({"name/run": deliveries of that job run this worker is processing now},
:func:`jobs_in_flight`, read from the bodies only when a beat is written: nothing on the hot
path) lets the job runner see that no page of a run is in flight before it declares the run
finished (common/jobs/runner.py sums them over the live workers).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from common.jobs.registry import JobRef
from common.store.keys import worker_key
from common.work.user_extractor import handler_refs

logger = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, client: redis.Redis, worker_id: str, interval_s: float,
                 snapshot: Callable[[], dict[str, Any]]) -> None:
        self.client = client
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.snapshot = snapshot
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        try:
            self.client.delete(worker_key(self.worker_id))
        except redis.RedisError as exc:
            logger.warning("could not remove heartbeat key: %s", exc)

    def beat(self) -> None:
        payload = {"id": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                   "started": round(self.started, 3), "beat": round(time.time(), 3),
                   "interval_s": self.interval_s, **self.snapshot()}
        key, ttl_s = worker_key(self.worker_id), max(1, round(self.interval_s * 3))
        try:
            self.client.set(key, json.dumps(payload), ex=ttl_s)
        except redis.ResponseError:
            self.client.expire(key, ttl_s)  # keep the last beat listed (see the docstring)
            raise

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except redis.RedisError as exc:
                logger.warning("heartbeat failed (Redis: %s)", exc)
            self._stop.wait(self.interval_s)


def jobs_in_flight(bodies: Iterable[bytes]) -> dict[str, int]:
    """How many of these work-message bodies each job run has, by "name/run" (the default
    job's and unreadable ones are left out; the decode step dead-letters bad fields)."""
    counts: dict[str, int] = {}
    for body in bodies:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            continue
        if not isinstance(data, dict):
            continue
        ref = JobRef.of(data)
        if ref is not None:
            counts[ref.scope] = counts.get(ref.scope, 0) + 1
    return counts



def job_fields(bodies: Iterable[bytes], handlers: str) -> dict[str, Any]:
    """The beat's ``jobs`` (:func:`jobs_in_flight`) and ``handlers`` (the worker's HANDLERS
    routers, which a job's ``handlers:`` must name: common/work/job_check.py)."""
    return {"jobs": jobs_in_flight(bodies), "handlers": list(handler_refs(handlers))}
