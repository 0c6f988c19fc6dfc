"""Archive: a fetched exchange goes into the WARC file before its outcome; a cached one not."""

from __future__ import annotations

from common.web.fetch import Fetcher
from common.work.steps.archive import Archive
from tests.work.steps.conftest import response, trip_for


def test_a_fetched_response_is_archived_and_carries_its_place(settings, site, tmp_path):
    warc = settings.with_overrides(archive="warc", archive_dir=str(tmp_path))
    step, fetcher = Archive.from_settings(warc), Fetcher(warc)
    try:
        trip = trip_for(site.page_url(1))
        trip.response = fetcher.fetch(site.page_url(1))
        assert step.archive_response(trip) is None
    finally:
        fetcher.close()
        step.close()
    assert trip.response.archive is not None and trip.response.archive["length"] > 0
    assert trip.response.exchanges == ()  # the raw exchange let go once written
    assert [p for p in tmp_path.iterdir() if p.name.endswith(".warc.gz")]


def test_with_archive_off_or_a_cached_response_nothing_is_written(settings, tmp_path):
    fetched = trip_for("http://127.0.0.1:9/a")
    fetched.response = response("http://127.0.0.1:9/a")
    assert Archive(None).archive_response(fetched) is None
    assert fetched.response.archive is None
    on = Archive.from_settings(settings.with_overrides(archive="warc",
                                                       archive_dir=str(tmp_path)))
    try:
        cached = trip_for("http://127.0.0.1:9/b")
        cached.response, cached.cached = response("http://127.0.0.1:9/b"), True
        assert on.archive_response(cached) is None
    finally:
        on.close()
    assert cached.response.archive is None and not list(tmp_path.iterdir())
