"""Read: the response into its record, parsed once; the message reaches the page reader."""

from __future__ import annotations

from common.work.steps.read import Read
from tests.work.steps.conftest import response, trip_for


def test_a_page_is_read_into_its_record_through_the_parse_stage(settings, site):
    step = Read.from_settings(settings)
    trip = trip_for(site.page_url(1), depth=2, attempts=1)
    trip.response = response(site.page_url(1), body=site.page_html(1).encode())
    try:
        assert step.read_page(trip) is None
    finally:
        step.close()
    record = trip.read.record
    assert record["url"] == site.page_url(1) and record["title"]
    assert record["depth"] == 2 and record["attempts"] == 2
    assert trip.progress.stage == "parse"
    assert trip.read.follow is None  # no crawl mode: nothing to follow


def test_a_body_that_is_not_html_is_recorded_unparsed(settings):
    step = Read.from_settings(settings)
    trip = trip_for("http://127.0.0.1:9/data")
    trip.response = response("http://127.0.0.1:9/data", body=b'{"a": 1}',
                             content_type="application/json")
    step.read_page(trip)
    assert trip.read.record["status"] == 200 and trip.progress.stage == "start"
