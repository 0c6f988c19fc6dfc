"""RobotsStore.refresh: one fetch of robots.txt, stored fleet-wide, whoever's wait policy.

Each test serves its own loopback :class:`TestSite` (its robots.txt differs per test; a route
set on the session site would stay for every later test). The fetch handed to ``refresh`` is
a plain :class:`Fetcher` call: the callers' wait policies (worker, sitemap reader) are tested
with them.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator

import pytest

from common.core.errors import FetchError
from common.store.keys import robots_key
from common.web.fetch import Fetcher, FetchResult
from common.web.robots import (
    ALLOW_ALL,
    FAILED,
    RULES,
    UNAVAILABLE,
    RobotsEntry,
    RobotsStore,
    forget_failures,
    robots_url,
)
from devtools.testsite import TestSite

ROBOTS = "User-agent: *\nDisallow: /private\nCrawl-delay: 2\n"


@pytest.fixture
def robots_site() -> Iterator[TestSite]:
    with TestSite(pages=5, robots_txt=ROBOTS) as site:
        yield site


def _store(settings, redis_client) -> RobotsStore:
    return RobotsStore.from_settings(redis_client, settings)


def _fetch_with(settings):
    fetcher = Fetcher(settings)
    asked: list[str] = []

    def fetch(url: str) -> FetchResult:
        asked.append(url)
        return fetcher.fetch(url, accept_any_type=True)

    return fetch, asked


def _stored(redis_client, origin: str) -> dict | None:
    raw = redis_client.get(robots_key(origin))
    return None if raw is None else json.loads(raw)


def test_rules_are_fetched_once_stored_for_the_fleet_and_logged_once(
        settings, redis_client, robots_site, caplog):
    origin = robots_site.base_url
    fetch, asked = _fetch_with(settings)

    with caplog.at_level(logging.INFO, logger="common.web.robots"):
        rules = _store(settings, redis_client).refresh(origin, fetch)

    assert asked == [robots_url(origin)] == [origin + "/robots.txt"]
    assert robots_site.count("/robots.txt") == 1
    assert rules.entry.status == RULES
    assert not rules.allows(robots_site.url("/private/1"))
    assert rules.allows(robots_site.page_url(1)) and rules.crawl_delay_s() == 2.0
    assert _stored(redis_client, origin)["body"] == ROBOTS
    # Another process's store finds it in Redis, with no fetch of its own.
    other = _store(settings, redis_client).get(origin)
    assert other is not None and not other.allows(robots_site.url("/private/1"))
    assert robots_site.count("/robots.txt") == 1
    assert [r.getMessage() for r in caplog.records if "robots.txt for" in r.getMessage()] == [
        f"robots.txt for {origin}: ok "]


@pytest.mark.parametrize(("status", "expected"), [(404, ALLOW_ALL), (503, UNAVAILABLE),
                                                  (429, UNAVAILABLE)])
def test_an_http_status_gives_the_entry_rfc_9309_says(settings, redis_client, robots_site,
                                                      status, expected):
    robots_site.route("/robots.txt", lambda _r: (status, {"Content-Type": "text/plain"}, b"no"))
    origin = robots_site.base_url

    rules = _store(settings, redis_client).refresh(origin, _fetch_with(settings)[0])

    assert rules.entry.status == expected and rules.entry.detail == f"status {status}"
    assert rules.allows(robots_site.url("/private/1"))  # only "ok" entries disallow anything
    assert _stored(redis_client, origin)["status"] == expected
    ttl_ms = redis_client.pttl(robots_key(origin))
    if expected == UNAVAILABLE:
        # Forgotten before the shortest first retry delay (half of RETRY_BASE_S): the retry
        # asks robots.txt again.
        assert 0 < ttl_ms <= settings.retry_base_s * 1000 / 4
    else:
        assert ttl_ms > settings.retry_base_s * 1000


def test_a_connection_that_fails_is_stored_as_unavailable(settings, redis_client):
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        origin = f"http://127.0.0.1:{sock.getsockname()[1]}"

    rules = _store(settings, redis_client).refresh(origin, _fetch_with(settings)[0])

    assert rules.unavailable and rules.entry.detail.startswith("connection: ")
    assert _stored(redis_client, origin)["status"] == UNAVAILABLE


def test_an_origin_the_address_guard_refuses_raises_and_stores_nothing(
        settings, redis_client, robots_site, caplog):
    origin = robots_site.base_url
    fetch, asked = _fetch_with(settings.with_overrides(fetch_allow_networks=()))

    with caplog.at_level(logging.INFO, logger="common.web.robots"), \
            pytest.raises(FetchError) as caught:
        _store(settings, redis_client).refresh(origin, fetch)

    assert caught.value.kind == "blocked"
    assert asked == [robots_url(origin)]
    assert robots_site.log == []
    assert _stored(redis_client, origin) is None
    assert _store(settings, redis_client).get(origin) is None
    assert not [r for r in caplog.records if "robots.txt for" in r.getMessage()]


def test_a_failure_is_never_believed_longer_in_a_workers_memory_than_in_redis(
        settings, redis_client, robots_site):
    robots_site.route("/robots.txt", lambda _r: (503, {"Content-Type": "text/plain"}, b"no"))
    origin = robots_site.base_url
    store = _store(settings, redis_client)
    assert store.refresh(origin, _fetch_with(settings)[0]).unavailable
    assert origin not in store.local and store.get(origin).unavailable  # from Redis

    redis_client.delete(robots_key(origin))  # expired, or deleted by dlq replay

    assert store.get(origin) is None  # this worker asks again at once


def test_a_permanent_fetch_failure_is_stored_failed_with_its_kind_for_retry_base_s(
        settings, redis_client, robots_site, caplog):
    origin = robots_site.base_url

    def fetch(url: str) -> FetchResult:
        raise FetchError("curl error 60: SSL certificate problem", kind="tls_certificate")

    with caplog.at_level(logging.INFO, logger="common.web.robots"):
        rules = _store(settings, redis_client).refresh(origin, fetch)

    assert rules.failed and not rules.unavailable
    assert (rules.entry.kind, rules.entry.detail) == (
        "tls_certificate", "robots.txt: curl error 60: SSL certificate problem")
    stored = _stored(redis_client, origin)
    assert (stored["status"], stored["kind"]) == (FAILED, "tls_certificate")
    assert 0 < redis_client.pttl(robots_key(origin)) <= settings.retry_base_s * 1000
    other = _store(settings, redis_client).get(origin)  # another worker: the same answer
    assert other.failed and other.entry.kind == "tls_certificate"
    assert f"robots.txt for {origin}: failed tls_certificate robots.txt: curl error 60" in \
        caplog.text


def test_forget_failures_deletes_unavailable_and_failed_entries_and_keeps_good_ones(
        settings, redis_client):
    store = _store(settings, redis_client)
    origins = {status: f"http://{status.replace('_', '-')}.test" for status in
               (RULES, ALLOW_ALL, UNAVAILABLE, FAILED)}
    for status, origin in origins.items():
        store.put(origin, RobotsEntry(status, body="User-agent: *\nDisallow: /x\n"
                                      if status == RULES else "", kind="invalid"
                                      if status == FAILED else ""))
    redis_client.set(robots_key("http://garbled.test"), b"not json")

    gone = forget_failures(redis_client, [*origins.values(), "http://garbled.test",
                                          "http://never-fetched.test"])

    assert gone == 3
    assert {status for status, origin in origins.items()
            if redis_client.exists(robots_key(origin))} == {RULES, ALLOW_ALL}
    assert forget_failures(redis_client, []) == 0
