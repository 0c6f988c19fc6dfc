"""Classify: a success goes on; a permanent error status is a dead letter, a transient a retry."""

from __future__ import annotations

from common.work.outcome import DeadLetter, Retry
from common.work.steps.classify import Classify
from tests.work.steps.conftest import reason, response, trip_for


def _fetched(status: int, **fields):
    trip = trip_for("http://127.0.0.1:9/x")
    trip.response = response("http://127.0.0.1:9/x", status=status, **fields)
    return trip


def test_a_success_or_a_cached_response_goes_on():
    assert Classify().classify_response(_fetched(200)) is None
    cached = _fetched(500)
    cached.cached = True
    assert Classify().classify_response(cached) is None


def test_a_404_is_dead_lettered_at_once_with_its_archive_reference(give_up):
    place = {"file": "w.warc.gz", "offset": 0, "length": 10}
    trip = _fetched(404, archive=place)
    end = Classify().classify_response(trip)
    assert isinstance(end, DeadLetter) and end.failure.status == 404
    outcome = give_up.settle(trip, end)
    assert reason(outcome) == "http_404" and outcome.record["archive"] == place


def test_a_503_is_retried_later_with_its_retry_after(give_up):
    trip = _fetched(503, headers={"retry-after": "1"})
    end = Classify().classify_response(trip)
    assert isinstance(end, Retry) and end.failure.retry_after == "1"
    outcome = give_up.settle(trip, end)
    assert outcome.kind == "delay" and "retry 1/" in outcome.detail
