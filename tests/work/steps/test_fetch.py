"""Fetch: one GET with the message's own headers (under the conditional ones) to the site."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from common.broker.messages import WorkMessage
from common.web.fetch import Fetcher
from common.web.ratelimit import Admission, RateLimiter
from common.work.identities import Identities
from common.work.job_book import JobBook
from common.work.outcome import Park, Retry
from common.work.processor import Processor
from common.work.steps.fetch import Fetch
from tests.work.steps.conftest import QUEUE, failure_of, response, trip_for


@pytest.fixture
def step(settings, redis_client) -> Iterator[Fetch]:
    fetcher = Fetcher(settings)
    yield Fetch(fetcher, RateLimiter(redis_client, settings))
    fetcher.close()


def _admitted(url: str, **extra):
    trip = trip_for(url, **extra)
    trip.admission, trip.domain = Admission(go=True), "127.0.0.1"
    return trip


def test_the_messages_own_headers_reach_the_site_under_the_conditional_ones(step, site):
    trip = _admitted(site.page_url(1), validators={"etag": '"v1"'})
    trip.headers = {"X-Api-Key": "k-1", "If-None-Match": '"mine"'}
    assert step.fetch_page(trip) is None
    assert trip.response.status == 200 and trip.progress.stage == "fetch"
    sent = site.requests_for("/page/1")[-1].headers
    assert sent["X-Api-Key"] == "k-1"
    assert sent["If-None-Match"] == '"v1"'  # the revisit's validator wins the name


def test_a_request_s_accept_replaces_the_fleet_s_instead_of_joining_it(step, site):
    trip = _admitted(site.page_url(3))
    trip.headers = {"Accept": "application/json"}
    assert step.fetch_page(trip) is None
    sent = site.requests_for("/page/3")[-1]
    assert [v for k, v in sent.header_lines if k.lower() == "accept"] == ["application/json"]


def test_a_cached_response_is_not_fetched_again(step, site):
    trip = _admitted(site.page_url(2))
    trip.response, trip.cached = response(site.page_url(2)), True
    assert step.fetch_page(trip) is None
    assert site.count("/page/2") == 0


def test_a_refused_connection_is_retried_later(step):
    end = step.fetch_page(_admitted("http://127.0.0.1:9/closed"))
    assert isinstance(end, Retry) and failure_of(end) == "fetch_connection"
    assert end.retime is not None and end.retime.sent_at is not None


def test_a_processed_message_with_headers_sends_them_and_one_with_crlf_is_dead_lettered(
        settings, redis_client, site):
    processor = Processor(settings.with_overrides(robots_enabled=False), redis_client)
    try:
        sent = processor.process(WorkMessage(url=site.page_url(3), extra={
            "headers": {"Accept-Language": "fr"}}).to_json(), QUEUE)
        hostile = processor.process(WorkMessage(url=site.page_url(4), extra={
            "headers": {"X-A": "1\r\nX-Injected: yes"}}).to_json(), QUEUE)
    finally:
        processor.close()
    assert sent.kind == "result"
    assert site.requests_for("/page/3")[-1].headers["Accept-Language"] == "fr"
    assert hostile.kind == "dead_letter" and site.count("/page/4") == 0
    assert hostile.publishes[0].headers["reason"] == "bad_message"


@pytest.fixture
def with_identities(settings, redis_client) -> Iterator:
    made = []

    def build(**overrides) -> Fetch:
        s = settings.with_overrides(**overrides)
        fetcher = Fetcher(s)
        made.append(fetcher)
        return Fetch(fetcher, RateLimiter(redis_client, s),
                     Identities(s, redis_client, JobBook(s, redis_client), fetcher))

    yield build
    for fetcher in made:
        fetcher.close()


def test_a_cookie_a_page_set_goes_with_the_next_page_of_its_site(with_identities, site):
    step = with_identities()
    site.route("/set", lambda _r: (200, {"Content-Type": "text/html",
                                         "Set-Cookie": "sid=s1; Path=/"}, b"<p>set</p>"))
    assert step.fetch_page(_admitted(site.url("/set"))) is None
    assert step.fetch_page(_admitted(site.page_url(1))) is None
    assert site.requests_for("/page/1")[-1].headers.get("Cookie") == "sid=s1"
    assert "Cookie" not in site.requests_for("/set")[-1].headers


def test_a_blocking_answer_to_a_pooled_session_parks_the_url_for_another(with_identities, site):
    step = with_identities(session_pool_size=2)
    site.route("/blocked", lambda _r: (403, {"Content-Type": "text/html"}, b"no"))
    end = step.fetch_page(_admitted(site.url("/blocked")))
    assert isinstance(end, Park) and end.message.extra["session_retires"] == 1
    assert site.count("/blocked") == 1
