"""Admit at a domain's full rate (issue 31): a near turn is waited for in the fetch loop to
the millisecond; a far one is parked to come back a little early, keeping its slot."""

from __future__ import annotations

import time

from common.store.results import ResultStore
from common.web.ratelimit import RateLimiter
from common.work.outcome import Park
from common.work.steps.admit import LOOP_WAIT_MS, PARK_EARLY_MS, Admit
from tests.work.steps.conftest import trip_for


def _step(settings, redis_client, give_up) -> Admit:
    return Admit.from_settings(settings, RateLimiter(redis_client, settings),
                               ResultStore(redis_client, settings.results_maxlen), give_up,
                               redis_client)


def _counted(redis_client) -> int:
    return int(redis_client.hget("stats:counters", "rate_limited") or 0)


def test_a_turn_a_few_milliseconds_away_is_waited_for_here_not_on_a_hold_queue(
        settings, redis_client, give_up):
    # One request per 120 ms (+2% guard): the second URL's turn is under LOOP_WAIT_MS away.
    step = _step(settings.with_overrides(rate_limit=(1, 120)), redis_client, give_up)
    assert step.take_turn(trip_for("http://127.0.0.1:9/one")) is None
    trip = trip_for("http://127.0.0.1:9/two")
    started = time.monotonic()

    assert step.take_turn(trip) is None  # no Park: a 100 ms hop would have come back late

    assert trip.admission.go and trip.admission.permit is not None
    assert 0.05 < time.monotonic() - started < LOOP_WAIT_MS / 1000 + 0.5
    assert _counted(redis_client) == 1  # it waited for its turn: counted as rate-limited


def test_a_longer_wait_is_parked_to_come_back_before_its_slot_which_it_keeps(
        settings, redis_client, give_up):
    step = _step(settings.with_overrides(rate_limit=(1, 60_000)), redis_client, give_up)
    assert step.take_turn(trip_for("http://127.0.0.1:9/one")) is None
    trip = trip_for("http://127.0.0.1:9/two")

    end = step.take_turn(trip)

    assert isinstance(end, Park) and end.why == "rate limit"
    assert end.delay_ms == trip.admission.wait_ms - PARK_EARLY_MS
    assert end.message.extra["slot"] == trip.admission.slot_ms
