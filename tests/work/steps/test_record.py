"""Record: the page's record, done mark and cache entry go into Redis in one call."""

from __future__ import annotations

from common.store.results import ResultStore
from common.work.page_record import PageRead
from common.work.steps.record import Record
from tests.helpers import results
from tests.work.steps.conftest import response, trip_for


def _read(url: str, give_up, **extra):
    trip = trip_for(url, **extra)
    trip.response = response(url)
    trip.done = give_up.done_mark(trip.url, trip.message)
    trip.read = PageRead({"url": url, "status": 200})
    return trip


def test_a_page_is_recorded_and_marked_done(settings, redis_client, give_up):
    step = Record.from_settings(settings, ResultStore(redis_client, settings.results_maxlen))
    trip = _read("http://127.0.0.1:9/a", give_up, redirected_from="http://127.0.0.2:9/a")
    outcome = step.record_page(trip)
    assert outcome.kind == "result" and outcome.detail == "status 200"
    [record] = results(redis_client)
    assert record["redirected_from"] == "http://127.0.0.2:9/a"
    assert give_up.is_done(trip.url, trip.message)


def test_with_the_cache_on_the_response_is_cached_for_the_next_admit(settings, redis_client,
                                                                      give_up):
    step = Record.from_settings(settings.with_overrides(cache_ttl_s=60),
                                ResultStore(redis_client, settings.results_maxlen))
    step.record_page(_read("http://127.0.0.1:9/c", give_up))
    assert redis_client.hget("stats:counters", "cache_misses") == b"1"
    assert any(key.startswith(b"content:") for key in redis_client.scan_iter())
