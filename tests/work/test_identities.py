"""Who a page is fetched as (common/work/identities.py): a job's and a rule's cookies and
proxies, a session retired on a blocking answer, a login run once per session, on real Redis
and a loopback site."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from common.core.errors import ConfigError, FetchError
from common.jobs.registry import JobRef, JobRegistry
from common.jobs.spec import parse_job
from common.store.keys import COUNTERS, cookie_jar_key, proxy_rest_key, session_login_key
from common.web.fetch import Fetcher
from common.web.proxies import proxy_id
from common.work.identities import RETIRES_FIELD, Identities, Visit
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Park
from common.work.rules_file import load_rules
from tests.work.steps.conftest import response, trip_for

PROXY = "http://127.0.0.1:9"  # nothing listens: only chosen, never used here


@pytest.fixture
def make(settings, redis_client) -> Iterator:
    made: list[Fetcher] = []

    def build(**overrides) -> Identities:
        s = settings.with_overrides(**overrides)
        fetcher = Fetcher(s)
        made.append(fetcher)
        return Identities(s, redis_client, JobBook(s, redis_client), fetcher)

    yield build
    for fetcher in made:
        fetcher.close()


def _trip(url: str, job: JobRef | None = None, **extra):
    trip = trip_for(url, **extra)
    trip.domain, trip.job = "127.0.0.1", job
    return trip


def _rules(*rules: dict) -> str:
    return json.dumps(list(rules))


def test_a_page_gets_its_sites_jar_and_a_cookie_it_set_is_kept_for_the_next(make, site):
    identities = make()
    first = _trip(site.page_url(1))
    identity, visit = identities.begin(first)
    assert identity.proxy is None and identity.cookies.header_for(first.url) is None
    identity.cookies.receive(first.url, ["sid=1; Path=/"])
    assert identities.settle(first, visit, response(first.url)) is None
    identity, _visit = identities.begin(_trip(site.page_url(2)))
    assert identity.cookies.header_for(site.page_url(2)) == "sid=1"


def test_a_rules_cookies_false_fetches_its_pages_without_a_jar(make, site, redis_client):
    rules = _rules({"path": "^/page/1$", "cookies": False},
                   {"path": "^/page/", "fields": {"t": "title"}})
    identities = make(extract_rules=rules)
    assert identities.begin(_trip(site.page_url(1))) is None
    identity, _visit = identities.begin(_trip(site.page_url(2)))
    assert identity.cookies is not None


def test_rules_without_identity_keys_are_never_matched_before_the_fetch(make, site):
    identities = make(extract_rules=_rules({"path": "^/page/", "fields": {"t": "title"}}))
    identity, _visit = identities.begin(_trip(site.page_url(1)))
    assert identity.cookies is not None
    assert list(identities._rules._extractors.values()) == [None]  # noqa: SLF001 - none


def test_a_rules_proxies_replace_the_fleets_and_false_goes_direct(make, site):
    rules = _rules({"path": "^/page/1$", "proxies": False},
                   {"path": "^/page/2$", "proxies": ["socks5h://u:pw@127.0.0.1:1080"]})
    identities = make(extract_rules=rules, proxy_urls=PROXY)
    identity, _visit = identities.begin(_trip(site.page_url(1)))
    assert identity.proxy is None
    identity, _visit = identities.begin(_trip(site.page_url(2)))
    assert identity.proxy == "socks5h://u:pw@127.0.0.1:1080"
    identity, _visit = identities.begin(_trip(site.page_url(3)))
    assert identity.proxy == PROXY


def test_a_proxy_that_failed_rests_fleet_wide_and_one_that_served_does_not(make, site,
                                                                           redis_client):
    identities = make(proxy_urls=PROXY, cookies_enabled=False)
    trip = _trip(site.page_url(1))
    identity, visit = identities.begin(trip)
    assert identity.cookies is None and identity.proxy == PROXY
    identities.settle(trip, visit, response(trip.url))
    assert not redis_client.exists(proxy_rest_key(proxy_id(PROXY)))
    identities.settle(trip, visit, None, FetchError("refused", kind="proxy"))
    assert redis_client.exists(proxy_rest_key(proxy_id(PROXY)))


def test_a_jobs_own_settings_turn_its_cookies_off_and_its_proxies_on(make, site,
                                                                     redis_client):
    spec = parse_job({"name": "shop", "seeds": {"urls": [site.url("/")]},
                      "session": {"cookies": False}, "proxies": {"urls": [PROXY]}})
    JobRegistry(redis_client).submit(spec)
    identities = make()
    identity, _visit = identities.begin(_trip(site.page_url(1), JobRef("shop", 1)))
    assert identity.cookies is None and identity.proxy == PROXY
    assert identities.begin(_trip(site.page_url(1))) is not None  # the default job's: jar


def test_a_blocking_answer_retires_a_pooled_session_and_parks_the_url_for_another(
        make, site, redis_client):
    identities = make(session_pool_size=1, session_max_retires=2)
    trip = _trip(site.page_url(1))
    _identity, visit = identities.begin(trip)
    end = identities.settle(trip, visit, response(trip.url, status=403))
    assert isinstance(end, Park) and end.message.extra[RETIRES_FIELD] == 1
    again = _trip(site.page_url(1), **{RETIRES_FIELD: 2})  # it has retired two already
    _identity, visit = identities.begin(again)
    assert visit.session.name == "0.1"
    assert identities.settle(again, visit, response(again.url, status=403)) is None
    assert identities.settle(trip, visit, response(trip.url, status=404)) is None


def test_without_a_pool_a_blocking_answer_is_an_answer(make, site):
    identities = make()
    trip = _trip(site.page_url(1))
    _identity, visit = identities.begin(trip)
    assert identities.settle(trip, visit, response(trip.url, status=403)) is None


def _login_site(site, *, password: str = "right") -> list[str]:
    posts: list[str] = []
    form = (b'<html><body><form method="post" action="/login"><input name="csrf" '
            b'type="hidden" value="t0k"><input name="user"><input name="password" '
            b'type="password"></form></body></html>')

    def login(record):  # noqa: ANN001, ANN202
        if record.method == "GET":
            return 200, {"Content-Type": "text/html"}, form
        posts.append(record.body.decode())
        if f"password={password}" in record.body.decode():
            return 303, {"Location": "/home", "Set-Cookie": "auth=ok; Path=/"}, b""
        return 200, {"Content-Type": "text/html"}, form

    site.route("/login", login)
    site.route("/home", lambda _r: (200, {"Content-Type": "text/html"},
                                    b"<html><body>welcome</body></html>"))
    return posts


def _login(site) -> str:
    return json.dumps({"url": site.url("/login"),
                       "fields": {"user": "me", "password": {"env": "TEST_LOGIN_PW"}}})


def test_a_session_logs_in_once_before_its_first_page(make, site, monkeypatch):
    monkeypatch.setenv("TEST_LOGIN_PW", "right")
    posts = _login_site(site)
    identities = make(session_login=_login(site))
    for n in (1, 2):
        identity, _visit = identities.begin(_trip(site.page_url(n)))
        assert identity.cookies.header_for(site.page_url(n)) == "auth=ok"
    assert len(posts) == 1 and "csrf=t0k" in posts[0]
    assert identities.client.hget(COUNTERS, "session_logins") == b"1"


def test_pages_of_a_session_another_worker_is_logging_in_wait(make, site, monkeypatch,
                                                             redis_client):
    monkeypatch.setenv("TEST_LOGIN_PW", "right")
    posts = _login_site(site)
    redis_client.set(session_login_key("default", "127.0.0.1", "0.0"), "other", px=5000)
    end = make(session_login=_login(site)).begin(_trip(site.page_url(1)))
    assert isinstance(end, Park) and posts == []


def test_a_refused_login_dead_letters_the_page_and_is_not_tried_again_per_page(
        make, site, monkeypatch, redis_client):
    monkeypatch.setenv("TEST_LOGIN_PW", "wrong")
    posts = _login_site(site)
    identities = make(session_login=_login(site))
    for n in (1, 2):
        end = identities.begin(_trip(site.page_url(n)))
        assert isinstance(end, DeadLetter) and end.failure.reason == "login_failed"
        assert "wrong" not in (end.failure.error or "")
    assert len(posts) == 1
    assert redis_client.hget(COUNTERS, "session_logins_failed") == b"1"
    stored = redis_client.hgetall(cookie_jar_key("default", "127.0.0.1", "0.0"))
    assert b"wrong" not in b"".join(stored.values())


def test_a_visit_without_a_session_settles_without_redis(make, site):
    identities = make(cookies_enabled=False, proxy_urls=PROXY)
    trip = _trip(site.page_url(1))
    identity, visit = identities.begin(trip)
    assert isinstance(visit, Visit) and visit.session is None
    assert identities.settle(trip, visit, response(trip.url, status=403)) is None


def test_a_rule_may_say_only_who_to_fetch_as_and_its_mistakes_are_named():
    rules = load_rules(_rules({"host": "shop.test", "cookies": False},
                              {"path": "^/p/", "proxies": "http://p.test:3128"},
                              {"path": "^/d/", "proxies": False}))
    assert [(r.cookies, r.proxies) for r in rules] == [
        (False, None), (None, ("http://p.test:3128",)), (None, ())]
    for bad, says in (({"host": "a.test", "cookies": "no"}, "cookies: expected true or false"),
                      ({"host": "a.test", "proxies": []}, "proxies: expected a list"),
                      ({"host": "a.test", "proxies": ["ftp://u:pw-never-shown@p.test:21"]},
                       "proxies: proxy 'ftp://u:***@p.test:21'")):
        with pytest.raises(ConfigError) as caught:
            load_rules(_rules(bad))
        assert says in str(caught.value) and "pw-never-shown" not in str(caught.value)


def test_a_login_is_run_for_its_own_sites_sessions_only(make, site, monkeypatch):
    monkeypatch.setenv("TEST_LOGIN_PW", "right")
    posts = _login_site(site)
    identities = make(session_login=_login(site))
    trip = trip_for("http://127.0.0.9:9/page/1")
    trip.domain = "127.0.0.9"  # another site of the crawl
    identity, _visit = identities.begin(trip)
    assert identity.cookies is not None and posts == []
