"""Logins over HTTP (common/api/routes_auth.py): a user's login sets an HttpOnly, SameSite=Strict
cookie that every route takes as a token; logout revokes it; wrong passwords are refused and
then blocked; whoami says who calls."""

from __future__ import annotations

import requests

from common.api.auth import Tokens
from common.api.deps import COOKIE

PASSWORD = "correct horse battery"


def test_a_login_sets_a_strict_http_only_cookie_that_alone_authenticates(api, redis_client):
    Tokens(redis_client).add_user("ana", PASSWORD, "admin")
    browser = requests.Session()
    answer = browser.post(f"{api.url}/api/login", json={"user": "ana", "password": PASSWORD},
                          timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"user": "ana", "scope": "admin"}
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=sf_") and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
    assert "Max-Age=43200" in cookie
    who = browser.get(f"{api.url}/api/whoami", timeout=30)  # no Authorization header
    assert who.status_code == 200, who.text
    assert who.json() == {"name": "login:ana", "scope": "admin", "user": "ana"}
    assert browser.get(f"{api.url}/api/workers", timeout=30).status_code == 200


def test_logout_revokes_the_cookie_s_token_and_clears_the_cookie(api, redis_client):
    Tokens(redis_client).add_user("ana", PASSWORD, "read")
    browser = requests.Session()
    browser.post(f"{api.url}/api/login", json={"user": "ana", "password": PASSWORD}, timeout=30)
    token = browser.cookies[COOKIE]
    out = browser.post(f"{api.url}/api/logout", timeout=30)
    assert out.status_code == 200 and out.json() == {"revoked": 1}
    assert COOKIE not in browser.cookies  # cleared
    again = requests.get(f"{api.url}/api/whoami", cookies={COOKIE: token}, timeout=30)
    assert again.status_code == 401
    assert api.call("GET", "/api/whoami", token=token).status_code == 401


def test_a_cookie_holding_a_token_s_name_revokes_nothing(api):
    out = api.call("POST", "/api/logout", token="read", cookies={COOKIE: "test-admin"})
    assert out.status_code == 200 and out.json() == {"revoked": 0}
    assert api.call("GET", "/api/whoami").json()["name"] == "test-admin"


def test_a_read_user_s_cookie_may_read_but_not_write(api, redis_client):
    Tokens(redis_client).add_user("rita", PASSWORD, "read")
    browser = requests.Session()
    browser.post(f"{api.url}/api/login", json={"user": "rita", "password": PASSWORD},
                 timeout=30)
    assert browser.get(f"{api.url}/api/whoami", timeout=30).json()["scope"] == "read"
    refused = browser.post(f"{api.url}/api/dead-letters/replay", json={}, timeout=30)
    assert refused.status_code == 403


def test_wrong_passwords_are_401_then_the_name_is_blocked_with_429(api, redis_client):
    Tokens(redis_client).add_user("ana", PASSWORD, "admin")
    for _ in range(api.settings.api_login_attempts):
        wrong = requests.post(f"{api.url}/api/login", timeout=30,
                              json={"user": "ana", "password": "not the password"})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    blocked = requests.post(f"{api.url}/api/login", timeout=30,
                            json={"user": "ana", "password": PASSWORD})
    assert blocked.status_code == 429 and "set-cookie" not in blocked.headers


def test_whoami_names_a_bearer_token_and_bad_logins_name_the_field(api):
    assert api.call("GET", "/api/whoami", token="read").json() == {
        "name": "test-read", "scope": "read", "user": ""}
    assert api.call("GET", "/api/whoami", token=None).status_code == 401
    assert api.call("POST", "/api/logout", token=None).status_code == 401
    for body, field in (({"user": "ana"}, "password"), ({"password": "x" * 12}, "user"),
                        ({"user": "", "password": "x" * 12}, "user"),
                        ({"user": "ana", "password": "x" * 12, "scope": "admin"}, "scope")):
        answer = requests.post(f"{api.url}/api/login", json=body, timeout=30)
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["body", field]


def test_a_token_logs_in_too_and_logout_leaves_that_token_valid(api):
    answer = requests.post(f"{api.url}/api/login", json={"token": api.read}, timeout=30)
    assert answer.status_code == 200 and answer.json()["scope"] == "read"
    cookie = {COOKIE: answer.cookies[COOKIE]}
    assert cookie[COOKIE] == api.read
    assert requests.get(f"{api.url}/api/whoami", cookies=cookie, timeout=30).json()[
        "name"] == "test-read"
    out = requests.post(f"{api.url}/api/logout", cookies=cookie, timeout=30)
    assert out.status_code == 200 and out.json()["revoked"] == 0
    assert api.call("GET", "/api/whoami", token="read").status_code == 200  # still valid
    both = requests.post(f"{api.url}/api/login", timeout=30,
                         json={"token": api.read, "user": "ana", "password": PASSWORD})
    assert both.status_code == 422 and both.json()["detail"][0]["loc"] == ["body", "token"]


def test_wrong_tokens_at_the_login_are_401_then_the_address_is_blocked(api):
    for _ in range(api.settings.api_login_attempts):
        wrong = requests.post(f"{api.url}/api/login", json={"token": "sf_wrong"}, timeout=30)
        assert wrong.status_code == 401
    blocked = requests.post(f"{api.url}/api/login", json={"token": api.read}, timeout=30)
    assert blocked.status_code == 429
