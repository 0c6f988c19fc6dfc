"""What the step tests share: a GivingUp on the test Redis, trips and responses made by hand.

Each test builds the one step it tests with its collaborators (common/work/steps/), hands it a
:class:`~common.work.steps.trip.Trip` as the steps before it would have left it, and reads the
outcome (or None) and what the step set on the trip.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.urls import canonicalize
from common.store.dedupe import DoneSet, SeenSet
from common.store.results import ResultStore
from common.web.fetch import FetchResult
from common.web.ratelimit import RateLimiter
from common.work.giving_up import GivingUp
from common.work.outcome import Outcome
from common.work.poison import PoisonGuard, Progress
from common.work.steps.trip import Trip

QUEUE = topology.NORMAL_QUEUE


@pytest.fixture
def give_up(settings: Settings, redis_client: redis.Redis) -> GivingUp:
    """The worker's ways to give up, on the flushed test Redis."""
    return GivingUp(settings, redis_client, RateLimiter(redis_client, settings),
                    DoneSet(redis_client, settings.seen_buckets),
                    SeenSet(redis_client, settings.seen_buckets),
                    ResultStore(redis_client, settings.results_maxlen),
                    PoisonGuard(redis_client, settings.poison_deliveries,
                                settings.failures_ttl_s))


def trip_for(url: str, *, depth: int = 0, attempts: int = 0, **extra: Any) -> Trip:
    """A trip as Decode and Arrive leave it: the message decoded, its progress made."""
    message = WorkMessage(url=url, depth=depth, attempts=attempts, extra=extra)
    trip = Trip.begin(message.to_json(), QUEUE, False)
    trip.message, trip.url, trip.progress = message, canonicalize(url), Progress(url)
    return trip


def response(url: str, status: int = 200, body: bytes = b"<html><title>t</title></html>",
             content_type: str = "text/html; charset=utf-8", **fields: Any) -> FetchResult:
    """A fetched response, as the fetcher gives it."""
    return FetchResult(url, url, status, content_type, body, 1.0, **fields)


def reason(outcome: Outcome | None) -> str | None:
    """The dead-letter reason of ``outcome`` (None: not a dead letter)."""
    if outcome is None or outcome.kind != "dead_letter":
        return None
    return (outcome.publishes[0].headers or {}).get("reason")


def failure_of(end: Any) -> str | None:
    """The failure reason of a step's ending (None: it passed on or has no failure)."""
    failure = getattr(end, "failure", None)
    return failure.reason if failure is not None else None
