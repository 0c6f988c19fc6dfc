"""Poison messages: a URL whose deliveries keep ending without an outcome is dead-lettered.

A delivery ends without an outcome when its worker dies on it (an OOM kill, a segfault,
``kill -9``, the stuck-page restart below) or its connection drops: the broker hands it out
again with ``redelivered`` set. Every such arrival is counted in Redis (``poison:{url}``, key
schema in common/store/keys.py); from the POISON_DELIVERIES-th on, the URL is dead-lettered
with reason ``poison`` and the last stage it reached, instead of being processed again (and
killing the next worker). A URL under suspicion (a redelivered arrival) writes each stage it
enters to the same hash before doing it, so the stage outlives the worker. The counts are the
same on classic and quorum queues; a quorum queue's own delivery limit (x-death reason
``delivery_limit``) also ends as ``poison`` (common/work/processor.py), never as *expired*.

Stuck pages: libxml2 releases the GIL while it parses, but cannot be interrupted. The
:class:`StuckWatch` thread looks at every page in a watched stage (parse, extract) once a
second; one there for STUCK_PAGE_S has its URL condemned (its count set so that the next
arrival is dead-lettered ``poison``, with the stage and why) and the worker exits with
:data:`STUCK_EXIT_CODE`, to be restarted like any crashed container. Its other deliveries go
back to the broker, unharmed (one count each, far below the limit).

Quarantine: a URL under suspicion goes on alone. Past its arrival it holds the worker's
:class:`Quarantine`, and the worker's other redelivered URLs wait for it in stage
``quarantine``, which, like waiting for a rate-limit turn, is not counted when the worker dies
there. So a page redelivered beside a killer is not killed with it again and again, and
condemned with it: only the killer's deaths add up (NOTES #50). First deliveries never wait.

Hot path: a first delivery costs two attribute writes per stage and a set add/remove; no
Redis call (NOTES #50).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

import redis

from common.store.keys import poison_key
from common.web import multi

logger = logging.getLogger(__name__)

#: Exit code of a worker that gave up on a stuck page (EX_TEMPFAIL): restart it.
STUCK_EXIT_CODE = 75
#: Stages the stuck watch may end: the ones that run without yielding to the fetch loop.
WATCHED_STAGES = frozenset({"parse", "extract"})
#: Stages that cannot be what killed a worker: waiting for the domain's rate-limit turn in
#: the fetch loop (steps/admit.py), or for the worker's quarantine. A tracked delivery that
#: died there is not counted again.
WAITING_STAGES = frozenset({"turn", "quarantine"})
#: How often a redelivered URL waiting for the quarantine looks again (its loop runs others).
QUARANTINE_POLL_S = 0.02
_DETAIL_MAX_CHARS = 200


class Progress:
    """Where one delivery is: its stage, since when, and whether Redis must hear of it."""

    __slots__ = ("url", "stage", "since", "quarantined", "_client", "_key")

    def __init__(self, url: str, client: redis.Redis | None = None) -> None:
        self.url = url
        self.stage = "start"
        self.since = time.monotonic()
        self.quarantined = False  # holds its worker's Quarantine
        self._client = client  # set only for a URL under suspicion (a redelivery)
        self._key = poison_key(url) if client is not None else ""

    @property
    def tracked(self) -> bool:
        return self._client is not None

    def enter(self, stage: str) -> None:
        """Mark the start of ``stage``; under suspicion, written to Redis first."""
        self.stage, self.since = stage, time.monotonic()
        if self._client is not None:
            self._client.hset(self._key, "stage", stage)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A URL whose deliveries died ``deaths`` times: it is poison."""

    deaths: int
    stage: str
    detail: str

    def error(self) -> str:
        text = f"{self.deaths} deliveries ended without an outcome; last stage {self.stage}"
        return f"{text}: {self.detail}" if self.detail else text


class PoisonGuard:
    """Counts the deliveries that died, per URL, and says when a URL is poison."""

    def __init__(self, client: redis.Redis, max_deliveries: int, ttl_s: int) -> None:
        self.client = client
        self.max_deliveries = max_deliveries
        self.ttl_s = ttl_s

    def arrive(self, url: str, redelivered: bool) -> tuple[Progress, Verdict | None]:
        """The progress of a delivery of ``url``, and a verdict when it is poison.

        A first delivery is not looked up. A redelivery counts one death in Redis (one
        round trip) and is tracked from then on; a tracked one that died waiting for its
        turn (:data:`WAITING_STAGES`) is not counted (a second round trip).
        """
        if not redelivered:
            return Progress(url), None
        key = poison_key(url)
        pipe = self.client.pipeline(transaction=True)
        pipe.hincrby(key, "deaths", 1)
        pipe.hmget(key, "stage", "detail")
        pipe.expire(key, self.ttl_s)
        deaths, (stage, detail), _ = pipe.execute()
        if _text(stage) in WAITING_STAGES:  # it died with its worker, not of its page
            deaths = self.client.hincrby(key, "deaths", -1)
        progress = Progress(url, self.client)
        if int(deaths) < self.max_deliveries:
            return progress, None
        return progress, Verdict(int(deaths), _text(stage) or "unknown", _text(detail))

    def condemn(self, progress: Progress, detail: str) -> None:
        """Make the next arrival of ``progress.url`` poison: its worker is about to exit."""
        key = poison_key(progress.url)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={"deaths": max(self.max_deliveries - 1, 0),
                                "stage": progress.stage, "detail": detail[:_DETAIL_MAX_CHARS]})
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def last_stage(self, url: str) -> str:
        """The last stage a tracked delivery of ``url`` entered (``unknown``: none was)."""
        return _text(self.client.hget(poison_key(url), "stage")) or "unknown"

    def clear(self, progress: Progress) -> None:
        """A tracked URL reached its outcome: forget its deaths."""
        if progress.tracked:
            self.client.delete(poison_key(progress.url))


class Quarantine:
    """One URL under suspicion at a time in this worker, from its arrival to its end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # any fetch loop's task, any thread, takes it

    def enter(self, progress: Progress) -> None:
        """A tracked delivery waits here (stage ``quarantine``) until no other one is past
        its arrival in this worker; any other goes straight on."""
        if not progress.tracked:
            return
        if not self._lock.acquire(blocking=False):
            progress.enter("quarantine")  # written first: dying here counts no death
            while not self._lock.acquire(blocking=False):
                multi.sleep(QUARANTINE_POLL_S)
        progress.quarantined = True

    def leave(self, progress: Progress) -> None:
        if progress.quarantined:
            progress.quarantined = False
            self._lock.release()


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class StuckWatch:
    """Ends the worker when a page stays in a watched stage for ``limit_s`` (see module doc).

    Pages are added and discarded whether or not its thread runs; :meth:`start` starts one
    (again after :meth:`stop`), so a processor outlives the workers that ran it.
    """

    def __init__(self, guard: PoisonGuard, limit_s: float, check_s: float = 1.0) -> None:
        self.guard = guard
        self.limit_s = limit_s
        self.check_s = min(check_s, limit_s / 4)
        self._active: set[Progress] = set()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, progress: Progress) -> None:
        self._active.add(progress)

    def discard(self, progress: Progress) -> None:
        self._active.discard(progress)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop_event,),
                                        name="stuck-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop_event.set()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.check_s):
            stuck = self.find_stuck()
            if stuck is not None:
                self.give_up(stuck)

    def find_stuck(self) -> Progress | None:
        now = time.monotonic()
        for progress in list(self._active):
            if progress.stage in WATCHED_STAGES and now - progress.since >= self.limit_s:
                return progress
        return None

    def give_up(self, progress: Progress) -> None:
        """Condemn the stuck URL and exit the process (a thread cannot stop libxml2)."""
        took_s = time.monotonic() - progress.since
        detail = (f"{progress.stage} still running after {took_s:.0f} s "
                  f"(STUCK_PAGE_S {self.limit_s:g}); worker restarted")
        try:
            self.guard.condemn(progress, detail)
        except redis.RedisError as exc:
            logger.error("could not mark %s as poison (Redis: %s); exiting anyway",
                         progress.url, exc)
        logger.error("%s: %s; exiting with %d so the page goes to dead letters", progress.url,
                     detail, STUCK_EXIT_CODE)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(STUCK_EXIT_CODE)
