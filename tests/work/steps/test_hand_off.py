"""HandOff: a 304 is recorded unchanged, a redirect not followed is handed off, others go on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from common.store.results import ResultStore
from common.work.redirects import Redirects
from common.work.steps.hand_off import HandOff
from tests.helpers import results
from tests.work.steps.conftest import failure_of, response, trip_for


@pytest.fixture
def step(settings, redis_client) -> Iterator[HandOff]:
    made = HandOff.from_settings(settings, Redirects(settings, redis_client, None),
                                 ResultStore(redis_client, settings.results_maxlen))
    yield made
    made.close()


def _fetched(url: str, give_up, **fields):
    trip = trip_for(url)
    trip.response, trip.done = response(url, **fields), give_up.done_mark(trip.url,
                                                                          trip.message)
    return trip


def test_a_page_to_parse_goes_on(step, give_up):
    assert step.hand_off_unparsed(_fetched("http://127.0.0.1:9/a", give_up)) is None


def test_a_304_is_recorded_unchanged(step, give_up, redis_client):
    outcome = step.hand_off_unparsed(_fetched("http://127.0.0.1:9/same", give_up, status=304,
                                              body=b""))
    assert outcome.kind == "result" and "unchanged" in outcome.detail
    [record] = results(redis_client)
    assert record["status"] == 304 and record["unchanged"] is True


def test_a_redirect_is_handed_to_the_producer_path_and_recorded(step, give_up, redis_client):
    outcome = step.hand_off_unparsed(_fetched(
        "http://127.0.0.1:9/old", give_up, status=301, body=b"",
        redirect_to="http://127.0.0.2:9/new"))
    assert outcome.kind == "result"
    [record] = results(redis_client)
    assert record["redirect_to"] == "http://127.0.0.2:9/new" and record["redirect"] == "queued"


def test_one_hop_past_max_redirects_is_dead_lettered(settings, step, give_up):
    trip = _fetched("http://127.0.0.1:9/loop", give_up, status=302, body=b"",
                    redirect_to="http://127.0.0.2:9/loop")
    trip.message.extra["hops"] = settings.max_redirects
    assert failure_of(step.hand_off_unparsed(trip)) == "fetch_too_many_redirects"
