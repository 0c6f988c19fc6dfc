"""The form login (common/web/login.py): the spec as SESSION_LOGIN or a job gives it, and a
login against a loopback members' site with a CSRF token, a redirect that sets the session
cookie and pages that answer 403 without it.

:class:`MembersSite` is the members' area on a TestSite; tests/test_login_fleet.py crawls it.
"""

from __future__ import annotations

import html
import ipaddress
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

import pytest

from common.core.config import Settings
from common.core.errors import ConfigError, FetchError
from common.web.cookies import Jar
from common.web.fetch import Fetcher, Identity
from common.web.login import LoginFailed, LoginSpec, log_in, parse_login
from devtools.testsite import RequestRecord, Response, TestSite

PASSWORD = "correct horse battery staple"
USER = "crawler"
_HTML = {"Content-Type": "text/html; charset=utf-8"}


class MembersSite:
    """A members' area under /members on ``site``: /members/login (a form with a CSRF token
    bound to a ``csrf`` cookie), /members/session (the form's action: 302 to /members/ with a
    ``member`` cookie when user, password and token are right, else the form again), and
    /members/ and /members/page/1..N, 403 without a valid ``member`` cookie; each member page
    links to every other and to ``outside`` (URLs of other sites)."""

    def __init__(self, site: TestSite, pages: int = 12, password: str = PASSWORD,
                 outside: tuple[str, ...] = ()) -> None:
        self.site = site
        self.pages = pages
        self.password = password
        self.outside = outside
        self.sessions: list[str] = []  # the member cookie of each successful login
        self.tokens: list[str] = []  # the CSRF token of each login page served
        self._lock = threading.Lock()
        site.route("/members/login", self._login_page)
        site.route("/members/session", self._submit)
        site.route("/members/", self._member_page)
        for n in range(1, pages + 1):
            site.route(f"/members/page/{n}", self._member_page)

    @property
    def login_url(self) -> str:
        return f"{self.site.base_url}/members/login"

    def spec(self, **extra: object) -> dict[str, object]:
        """A login mapping for this site, the password from $LOGIN_TEST_PASSWORD."""
        return {"url": self.login_url,
                "fields": {"user": USER, "password": {"env": "LOGIN_TEST_PASSWORD"}}, **extra}

    def member_urls(self) -> list[str]:
        base = self.site.base_url
        return [f"{base}/members/", *(f"{base}/members/page/{n}"
                                      for n in range(1, self.pages + 1))]

    def login_posts(self) -> list[RequestRecord]:
        return [r for r in self.site.log if r.method == "POST" and r.path == "/members/session"]

    @staticmethod
    def _cookies(request: RequestRecord) -> dict[str, str]:
        jar = SimpleCookie()
        jar.load(request.headers.get("Cookie", ""))
        return {name: morsel.value for name, morsel in jar.items()}

    def _form(self, token: str, error: str = "") -> bytes:
        return (f"<html><body>{error}<form id='login' action='session' method='post'>"
                f"<input type='hidden' name='csrf_token' value='{html.escape(token)}'>"
                "<input name='user'><input type='password' name='password'>"
                "<input type='submit' name='go' value='Sign in'></form>"
                "<form action='/search'><input name='q'></form></body></html>").encode()

    def _login_page(self, request: RequestRecord) -> Response:
        token = secrets.token_hex(8)
        with self._lock:
            self.tokens.append(token)
        return 200, {**_HTML, "Set-Cookie": f"csrf={token}; Path=/members"}, self._form(token)

    def _submit(self, request: RequestRecord) -> Response:
        form = {k: v[-1] for k, v in parse_qs(request.body.decode("ascii")).items()}
        token = self._cookies(request).get("csrf")
        if (request.method != "POST" or not token or form.get("csrf_token") != token
                or form.get("user") != USER or form.get("password") != self.password):
            return 200, _HTML, self._form(token or "", "<p class='error'>Wrong login</p>")
        session = secrets.token_hex(8)
        with self._lock:
            self.sessions.append(session)
        return 302, {"Location": "/members/",
                     "Set-Cookie": f"member={session}; Path=/members; HttpOnly"}, b""

    def _member_page(self, request: RequestRecord) -> Response:
        with self._lock:
            known = self._cookies(request).get("member") in self.sessions
        if not known:
            return 403, _HTML, b"<html><body>Members only</body></html>"
        path = request.path.split("?", 1)[0]
        links = "".join([*(f"<a href='/members/page/{n}'>page {n}</a>"
                           for n in range(1, self.pages + 1)),
                         *(f"<a href='{url}'>elsewhere</a>" for url in self.outside)])
        return 200, _HTML, (f"<html><head><title>member {path}</title></head><body>"
                            f"<a class='logout-hint'>signed in</a>{links}</body></html>").encode()


def _cookie(jar: Jar, url: str, name: str) -> str | None:
    """The value of the cookie ``name`` the jar would send to ``url``."""
    sent = SimpleCookie()
    sent.load(jar.header_for(url) or "")
    return sent[name].value if name in sent else None


@pytest.fixture
def fetcher() -> Iterator[Fetcher]:
    made = Fetcher(Settings().with_overrides(
        fetch_allow_networks=(ipaddress.ip_network("127.0.0.0/8"),)))
    yield made
    made.close()


@pytest.fixture
def members(site: TestSite, monkeypatch: pytest.MonkeyPatch) -> MembersSite:
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", PASSWORD)
    return MembersSite(site)


def _failure(fetcher: Fetcher, spec: LoginSpec, jar: Jar | None = None) -> str:
    with pytest.raises(LoginFailed) as info:
        log_in(fetcher, Identity(cookies=jar or Jar()), spec)
    assert PASSWORD not in str(info.value)
    return str(info.value)


# -- the spec ----------------------------------------------------------------------------------
def test_an_empty_setting_declares_no_login():
    assert parse_login("") is None
    assert parse_login("  ") is None
    assert parse_login(None) is None


def test_inline_json_gives_the_url_fields_form_and_success_check(monkeypatch):
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", PASSWORD)
    spec = parse_login(json.dumps({
        "url": "https://members.example/login", "form": "form#login",
        "fields": {"user": USER, "password": {"env": "LOGIN_TEST_PASSWORD"}},
        "success": {"css": "a.logout", "status": 200}, "method": "post"}))
    assert spec == LoginSpec(url="https://members.example/login", form="form#login",
                             fields={"user": USER, "password": PASSWORD},
                             success={"css": "a.logout", "status": 200}, method="POST")


def test_a_yaml_file_reads_a_secret_file_beside_it_without_its_trailing_newline(tmp_path):
    (tmp_path / "secret.txt").write_text(PASSWORD + "\n")
    (tmp_path / "login.yml").write_text(
        "url: http://members.example/login\nform: 1\n"
        "fields:\n  user: crawler\n  password: {file: secret.txt}\n")
    spec = parse_login(f"@{tmp_path / 'login.yml'}")
    assert spec is not None and spec.form == 1
    assert spec.fields == {"user": USER, "password": PASSWORD}


def test_a_login_belongs_to_the_site_of_its_url():
    spec = parse_login({"url": "https://Members.Example:8443/login"})
    assert spec is not None and spec.site == "members.example"


def test_a_job_mapping_is_read_like_the_setting(monkeypatch):
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", PASSWORD)
    spec = parse_login({"url": "http://m.example/in",
                        "fields": {"pin": 1234, "password": {"env": "LOGIN_TEST_PASSWORD"}}})
    assert spec is not None and spec.fields == {"pin": "1234", "password": PASSWORD}


def test_a_missing_env_var_is_an_error_naming_the_field_and_the_variable(monkeypatch):
    monkeypatch.delenv("LOGIN_TEST_NOT_SET", raising=False)
    with pytest.raises(ConfigError, match=r"login\.fields\.password: .*LOGIN_TEST_NOT_SET"):
        parse_login({"url": "http://m.example/", "fields": {"password": {"env":
                                                                           "LOGIN_TEST_NOT_SET"}}})


def test_secrets_are_not_read_when_only_checking_a_spec(monkeypatch):
    monkeypatch.delenv("LOGIN_TEST_NOT_SET", raising=False)
    spec = parse_login({"url": "http://m.example/",
                        "fields": {"password": {"env": "LOGIN_TEST_NOT_SET"}}}, resolve=False)
    assert spec is not None and spec.fields == {"password": ""}


def test_a_missing_secret_file_is_an_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"login\.fields\.password: cannot read"):
        parse_login({"url": "http://m.example/", "fields": {"password": {"file": "nope"}}},
                    base_dir=str(tmp_path))


def test_a_password_written_in_the_spec_itself_is_refused_without_echoing_it():
    with pytest.raises(ConfigError, match=r"login\.fields\.password") as info:
        parse_login({"url": "http://m.example/", "fields": {"password": PASSWORD}})
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize(("given", "field"), [
    ({"url": "ftp://m.example/login"}, "login.url"),
    ({"url": "http:///login"}, "login.url"),
    ({"fields": {}}, "login.url"),
    ({"url": "http://m.example/", "colour": "red"}, "login.colour"),
    ({"url": "http://m.example/", "success": {"smell": "x"}}, "login.success.smell"),
    ({"url": "http://m.example/", "success": {"status": 99}}, "login.success.status"),
    ({"url": "http://m.example/", "success": {"css": "a[["}}, "login.success.css"),
    ({"url": "http://m.example/", "success": {}}, "login.success"),
    ({"url": "http://m.example/", "form": "form[["}, "login.form"),
    ({"url": "http://m.example/", "form": True}, "login.form"),
    ({"url": "http://m.example/", "form": -1}, "login.form"),
    ({"url": "http://m.example/", "method": "PUT"}, "login.method"),
    ({"url": "http://m.example/", "fields": {"user": ["a"]}}, "login.fields.user"),
    ({"url": "http://m.example/", "fields": {"password": {"vault": "x"}}},
     "login.fields.password"),
])
def test_a_malformed_spec_is_an_error_naming_the_field(given, field):
    with pytest.raises(ConfigError, match=rf"^{field.replace('.', '[.]')}\b"):
        parse_login(given)


def test_text_that_is_not_yaml_or_a_mapping_is_an_error():
    with pytest.raises(ConfigError, match="not valid YAML/JSON"):
        parse_login("{url: [")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_login("[1, 2]")


def test_the_repr_of_a_spec_masks_every_field_value(monkeypatch):
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", PASSWORD)
    spec = parse_login({"url": "http://m.example/", "fields": {
        "user": "someone-private", "password": {"env": "LOGIN_TEST_PASSWORD"}}})
    shown = repr(spec) + str(spec) + f"{spec}"
    assert "password=***" in shown and "user=***" in shown
    assert PASSWORD not in shown and "someone-private" not in shown


# -- logging in --------------------------------------------------------------------------------
def test_a_login_fills_the_form_keeps_its_csrf_token_and_opens_the_members_pages(
        fetcher, members, site, caplog):
    caplog.set_level(logging.DEBUG)
    jar = Jar()
    assert fetcher.fetch(members.member_urls()[1], identity=Identity(cookies=jar)).status == 403
    log_in(fetcher, Identity(cookies=jar), parse_login(members.spec()))
    [post] = members.login_posts()
    sent = {k: v[-1] for k, v in parse_qs(post.body.decode()).items()}
    [page] = [r for r in site.log if r.path == "/members/login"]
    assert sent == {"csrf_token": members.tokens[0], "user": USER, "password": PASSWORD,
                    "go": "Sign in"}
    assert post.headers["Referer"] == members.login_url
    assert post.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert _cookie(jar, members.member_urls()[0], "member") == members.sessions[0]  # 302 hop
    for url in members.member_urls():
        assert fetcher.fetch(url, identity=Identity(cookies=jar)).status == 200, url
    assert fetcher.fetch(members.member_urls()[1]).status == 403  # without the jar
    assert PASSWORD not in caplog.text and page.method == "GET"


def test_a_wrong_password_fails_the_success_check_without_showing_it(
        fetcher, members, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", "wrong-" + PASSWORD)
    jar = Jar()
    reason = _failure(fetcher, parse_login(members.spec()), jar)
    assert "success check failed" in reason and "login form is still on the page" in reason
    assert "wrong-" not in reason and "wrong-" not in caplog.text
    assert _cookie(jar, members.member_urls()[0], "member") is None and members.sessions == []


@pytest.mark.parametrize("success", [
    {"css": "a.logout-hint"}, {"text": "signed in"}, {"status": 200}, {"cookie": "member"},
    {"css": "a.logout-hint", "text": "signed in", "status": 200, "cookie": "member"}])
def test_each_success_check_holds_after_a_good_login(fetcher, members, success):
    jar = Jar()
    log_in(fetcher, Identity(cookies=jar), parse_login(members.spec(success=success)))
    assert _cookie(jar, members.member_urls()[0], "member") == members.sessions[-1]


@pytest.mark.parametrize(("success", "why"), [
    ({"css": "a.logout"}, "no element matches 'a.logout'"),
    ({"text": "Welcome back"}, "the expected text is not on the page"),
    ({"status": 201}, "status 200, expected 201"),
    ({"cookie": "remember_me"}, "no cookie 'remember_me' was set"),
])
def test_a_success_check_that_does_not_hold_fails_the_login(fetcher, members, success, why):
    assert why in _failure(fetcher, parse_login(members.spec(success=success)))


def test_the_form_can_be_chosen_by_selector_or_index(fetcher, members):
    for form in ("form#login", 0):
        log_in(fetcher, Identity(cookies=Jar()), parse_login(members.spec(form=form)))
    assert len(members.sessions) == 2
    reason = _failure(fetcher, parse_login(members.spec(form=1)))  # the search form
    assert "success check failed" in reason
    assert "does not have the form 'form#nope'" in _failure(
        fetcher, parse_login(members.spec(form="form#nope")))


def test_a_get_form_sends_its_values_in_the_query_string(fetcher, members, site):
    spec = parse_login(members.spec(method="GET"))
    _failure(fetcher, spec)  # the site wants a POST: the form comes back
    [submit] = [r for r in site.log if r.path.startswith("/members/session")]
    assert submit.method == "GET" and "user=crawler" in submit.path


def test_a_failed_submit_fetch_never_shows_the_values_it_carried(fetcher, site, monkeypatch):
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", PASSWORD)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    site.route("/away", lambda r: (200, _HTML, (
        f"<form method=get action='http://127.0.0.1:{closed}/in'><input name=user>"
        "<input type=password name=password></form>").encode()))
    spec = parse_login({"url": f"{site.base_url}/away",
                        "fields": {"user": USER, "password": {"env": "LOGIN_TEST_PASSWORD"}}})
    with pytest.raises(FetchError) as info:
        log_in(fetcher, Identity(cookies=Jar()), spec)
    assert info.value.kind == "connection"
    assert "correct" not in str(info.value) and f":{closed}/in" in str(info.value)


@pytest.mark.parametrize(("body", "why"), [
    (b"<html><body>No forms here</body></html>", "does not have any form"),
    (b"", "is not HTML"),
    (b"<html><form>" + b"<input name=x>" * 10_000 + b"</form></html>", "over 500 inputs"),
])
def test_a_hostile_login_page_fails_quickly(fetcher, site, monkeypatch, body, why):
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", PASSWORD)
    site.route("/hostile", lambda r: (200, _HTML, body))
    spec = parse_login({"url": f"{site.base_url}/hostile",
                        "fields": {"password": {"env": "LOGIN_TEST_PASSWORD"}}})
    started = time.monotonic()
    assert why in _failure(fetcher, spec)
    assert time.monotonic() - started < 5
    assert not [r for r in site.log if r.method == "POST"]


def test_a_huge_login_page_is_cut_by_the_fetcher_and_fails_quickly(fetcher, site, monkeypatch):
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", PASSWORD)
    spec = parse_login({"url": f"{site.base_url}/big/20480",  # 20 MiB, cut at 10 MiB
                        "fields": {"password": {"env": "LOGIN_TEST_PASSWORD"}}})
    started = time.monotonic()
    assert "does not have any form" in _failure(fetcher, spec)
    assert time.monotonic() - started < 10


def test_a_login_page_that_is_not_found_fails_with_its_status(fetcher, site, monkeypatch):
    monkeypatch.setenv("LOGIN_TEST_PASSWORD", PASSWORD)
    spec = parse_login({"url": f"{site.base_url}/status/404",
                        "fields": {"password": {"env": "LOGIN_TEST_PASSWORD"}}})
    assert "answered 404" in _failure(fetcher, spec)
