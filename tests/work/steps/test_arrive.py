"""Arrive: a redelivery counts a death; past POISON_DELIVERIES the URL is poison."""

from __future__ import annotations

import threading

from common.broker.messages import WorkMessage
from common.store.dedupe import DoneSet
from common.store.keys import poison_key
from common.work.poison import PoisonGuard, StuckWatch
from common.work.steps.arrive import Arrive
from common.work.steps.trip import Trip
from tests.work.steps.conftest import QUEUE, failure_of, reason


def _step(settings, redis_client) -> tuple[Arrive, StuckWatch]:
    guard = PoisonGuard(redis_client, settings.poison_deliveries, settings.failures_ttl_s)
    watch = StuckWatch(guard, 60.0)
    return Arrive(guard, watch), watch


def _trip(url: str, redelivered: bool) -> Trip:
    message = WorkMessage(url=url)
    trip = Trip.begin(message.to_json(), QUEUE, redelivered)
    trip.message, trip.url = message, url
    return trip


def test_a_first_delivery_is_watched_and_costs_no_redis_call(settings, redis_client):
    step, watch = _step(settings, redis_client)
    trip = _trip("http://127.0.0.1:9/first", redelivered=False)
    assert step.count_arrival(trip) is None
    assert trip.progress is not None and not trip.progress.tracked
    assert not redis_client.exists(poison_key(trip.url))
    watch.discard(trip.progress)


def test_a_redelivered_url_waits_in_quarantine_until_the_one_before_it_departs(
        settings, redis_client):
    step, _watch = _step(settings, redis_client)
    first = _trip("http://127.0.0.1:9/suspect-1", redelivered=True)
    assert step.count_arrival(first) is None and first.progress.quarantined
    fresh = _trip("http://127.0.0.1:9/fresh", redelivered=False)
    assert step.count_arrival(fresh) is None  # a first delivery never waits
    second = _trip("http://127.0.0.1:9/suspect-2", redelivered=True)
    arrived = threading.Event()
    waiter = threading.Thread(target=lambda: (step.count_arrival(second), arrived.set()))
    waiter.start()
    try:
        assert not arrived.wait(0.3)
        # Waiting, written where a dying worker leaves it: not counted as a death.
        assert redis_client.hget(poison_key(second.url), "stage") == b"quarantine"
        step.depart(first.progress)
        assert arrived.wait(5) and second.progress.quarantined
    finally:
        step.depart(first.progress)
        waiter.join(5)
    step.depart(second.progress)
    step.depart(second.progress)  # twice is harmless
    third = _trip("http://127.0.0.1:9/suspect-3", redelivered=True)
    assert step.count_arrival(third) is None and third.progress.quarantined
    step.depart(third.progress)
    step.depart(fresh.progress)


def test_a_url_redelivered_poison_deliveries_times_is_dead_lettered_as_poison(
        settings, redis_client, give_up):
    step, _watch = _step(settings, redis_client)
    trips = [_trip("http://127.0.0.1:9/dies", redelivered=True)
             for _ in range(settings.poison_deliveries)]
    ends = []
    for trip in trips:  # each in a worker that dies on it: its trip ends there
        ends.append(step.count_arrival(trip))
        if ends[-1] is None:
            step.depart(trip.progress)
    assert all(end is None for end in ends[:-1])
    assert failure_of(ends[-1]) == "poison" and ends[-1].unless_done
    outcome = give_up.settle(trips[-1], ends[-1])
    assert reason(outcome) == "poison"
    assert "deliveries ended without an outcome" in outcome.publishes[0].headers["last_error"]


def test_a_poison_url_whose_outcome_is_recorded_is_already_done_and_forgiven(
        settings, redis_client, give_up):
    step, _watch = _step(settings.with_overrides(poison_deliveries=1), redis_client)
    trip = _trip("http://127.0.0.1:9/done", redelivered=True)
    DoneSet(redis_client, settings.seen_buckets).add(give_up.done_mark(trip.url, trip.message))
    outcome = give_up.settle(trip, step.count_arrival(trip))
    assert outcome.kind == "already_done"
    assert not redis_client.exists(poison_key(trip.url))


def test_a_url_whose_worker_dies_while_it_waits_for_its_turn_is_never_poison(
        settings, redis_client):
    # A neighbour waiting for its rate-limit turn in the fetch loop when a hanging page kills
    # the worker again and again (tests/test_poison.py) is not what killed it.
    step, watch = _step(settings, redis_client)
    url = "http://127.0.0.1:9/waiting"
    for _ in range(settings.poison_deliveries + 2):
        trip = _trip(url, redelivered=True)
        assert step.count_arrival(trip) is None
        trip.progress.enter("turn")  # the worker dies here
        step.depart(trip.progress)
    assert int(redis_client.hget(poison_key(url), "deaths")) == 1  # its first, untracked death

    trip = _trip(url, redelivered=True)
    step.count_arrival(trip)
    trip.progress.enter("fetch")  # dying while fetching counts again
    step.depart(trip.progress)
    step.count_arrival(_trip(url, redelivered=True))
    assert int(redis_client.hget(poison_key(url), "deaths")) == 2
