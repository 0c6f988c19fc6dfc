"""Admit: one Redis call gives the URL its turn, parks it, or finds its outcome recorded."""

from __future__ import annotations

from common.store.dedupe import DoneSet
from common.store.results import ResultStore
from common.web.ratelimit import RateLimiter
from common.work.outcome import Park
from common.work.steps.admit import Admit
from tests.work.steps.conftest import trip_for


def _step(settings, redis_client, give_up) -> Admit:
    return Admit.from_settings(settings, RateLimiter(redis_client, settings),
                               ResultStore(redis_client, settings.results_maxlen), give_up,
                               redis_client)


def test_a_url_whose_turn_has_come_goes_on_with_its_done_mark_and_permit(
        settings, redis_client, give_up):
    trip = trip_for("http://127.0.0.1:9/turn", slot=5, parked_at=1.0, keep="me")
    assert _step(settings, redis_client, give_up).take_turn(trip) is None
    assert trip.admission.go and trip.admission.permit is not None
    assert trip.done == give_up.done_mark(trip.url, trip.message)
    assert trip.domain == "127.0.0.1"
    assert trip.message.extra == {"keep": "me"}  # its booked slot and wait are spent
    assert trip.progress.stage == "admit" and not trip.cached


def test_a_url_over_its_domains_rate_is_parked_keeping_its_slot(settings, redis_client,
                                                                 give_up):
    step = _step(settings.with_overrides(rate_limit=(1, 60_000)), redis_client, give_up)
    assert step.take_turn(trip_for("http://127.0.0.1:9/one")) is None
    trip = trip_for("http://127.0.0.1:9/two")
    end = step.take_turn(trip)
    assert isinstance(end, Park) and end.why == "rate limit" and end.delay_ms > 0
    assert end.message.extra["slot"] > 0
    outcome = give_up.settle(trip, end)
    assert outcome.kind == "delay" and b'"slot"' in outcome.publishes[0].body


def test_a_redelivered_url_whose_outcome_is_recorded_is_already_done(settings, redis_client,
                                                                      give_up):
    trip = trip_for("http://127.0.0.1:9/done")
    DoneSet(redis_client, settings.seen_buckets).add(give_up.done_mark(trip.url, trip.message))
    outcome = _step(settings, redis_client, give_up).take_turn(trip)
    assert outcome is not None and outcome.kind == "already_done"
