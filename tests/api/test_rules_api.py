"""The rules check over HTTP (common/api/routes_rules.py): rules on a fetched URL or on pasted
HTML give what ``scrape-fleet try`` gives; the address guard refuses a URL before any fetch;
every bad input a 4xx naming the field."""

from __future__ import annotations

import requests

from common.api.auth import Tokens
from tests.api.conftest import served

RULES = {"rules": [{"name": "page", "path": "^/page/",
                    "fields": {"title": "h1", "sentence": "p"},
                    "follow": {"allow": ["/page/1"]}}]}
PASTED = ('<html><head><title>Kettle</title></head><body><h1>Kettle</h1>'
          '<p class=price>12.50</p><a href="/p/2">Spoon</a><a href="/about">About</a>'
          '</body></html>')


def test_rules_on_a_url_give_the_data_and_the_links_the_rule_keeps(api, site):
    answer = api.call("POST", "/api/rules/check",
                      json={"rules": RULES, "url": site.page_url(3)})
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert out["rule"] == "page" and out["data"]["title"] == "Page 3"
    assert out["links_from"] == "rule" and out["links"]
    assert all(link.startswith(site.url("/page/1")) for link in out["links"])
    assert out["record"]["title"] == "Page 3" and out["record"]["data"] == out["data"]
    assert site.count("/page/3") == 1  # fetched once
    assert answer.headers["content-type"] == "application/json"


def test_rules_on_pasted_html_match_the_base_url_and_keep_every_link_without_follow(api):
    rules = [{"name": "product", "path": "^/p/", "fields": {"title": "h1", "price": ".price"}}]
    answer = api.call("POST", "/api/rules/check",
                      json={"rules": rules, "html": PASTED,
                            "base_url": "https://shop.test/p/1"})
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert out["data"] == {"title": "Kettle", "price": "12.50"}
    assert out["links_from"] == "page"
    assert out["links"] == ["https://shop.test/p/2", "https://shop.test/about"]
    elsewhere = api.call("POST", "/api/rules/check",
                         json={"rules": rules, "html": PASTED,
                               "base_url": "https://shop.test/about"})
    assert elsewhere.status_code == 422
    assert elsewhere.json()["detail"][0]["loc"] == ["body", "rules"]
    assert "no rule matches" in elsewhere.json()["detail"][0]["msg"]


def test_a_url_the_address_guard_refuses_is_never_fetched(settings, redis_client, site):
    guarded = settings.with_overrides(fetch_allow_networks=())
    token = Tokens(redis_client).create("checker", "admin")
    with served(guarded) as url:
        answer = requests.post(f"{url}/api/rules/check", timeout=30,
                               headers={"Authorization": f"Bearer {token}"},
                               json={"rules": RULES, "url": site.page_url(1)})
    assert answer.status_code == 422, answer.text
    [problem] = answer.json()["detail"]
    assert problem["loc"] == ["body", "url"]
    assert "refused by the address guard (FETCH_ALLOW_NETWORKS)" in problem["msg"]
    assert site.requests_for("/page/") == []


def test_bad_inputs_are_refused_naming_the_field(api, site):
    cases = [
        ({"url": site.page_url(1)}, ["body", "rules"]),
        ({"rules": RULES}, ["body", "url"]),
        ({"rules": RULES, "url": site.page_url(1), "html": PASTED}, ["body", "url"]),
        ({"rules": RULES, "url": "ftp://127.0.0.1/x"}, ["body", "url"]),
        ({"rules": RULES, "url": site.page_url(1), "base_url": "https://a.test/"},
         ["body", "base_url"]),
        ({"rules": RULES, "html": PASTED, "base_url": "file:///etc/passwd"},
         ["body", "base_url"]),
        ({"rules": [{"name": "x", "fields": {"t": "h1"}}], "html": PASTED}, ["body", "rules"]),
        ({"rules": "@/etc/passwd", "html": PASTED}, ["body", "rules"]),
        ({"rules": RULES, "html": PASTED, "label": "x" * 500}, ["body", "label"]),
        ({"rules": RULES, "html": PASTED, "extra": 1}, ["body", "extra"]),
    ]
    for body, loc in cases:
        answer = api.call("POST", "/api/rules/check", json=body)
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["detail"][0]["loc"][:2] == loc, (body, answer.text)
    matcher = api.call("POST", "/api/rules/check",
                       json={"rules": [{"name": "x", "fields": {"t": "h1"}}], "html": PASTED})
    assert "needs a matcher" in matcher.json()["detail"][0]["msg"]
    broken = api.call("POST", "/api/rules/check", data=b"{not json",
                      headers={"Content-Type": "application/json"})
    assert broken.status_code == 422
    assert api.call("POST", "/api/rules/check", token=None,
                    json={"rules": RULES, "html": PASTED}).status_code == 401


def test_html_over_max_body_bytes_is_refused_with_413(settings, redis_client):
    small = settings.with_overrides(max_body_bytes=1000)
    token = Tokens(redis_client).create("checker", "admin")
    with served(small) as url:
        over = requests.post(f"{url}/api/rules/check", timeout=30,
                             headers={"Authorization": f"Bearer {token}"},
                             json={"rules": RULES, "html": "<p>" + "x" * 1500})
        huge = requests.post(f"{url}/api/rules/check", timeout=30,
                             headers={"Authorization": f"Bearer {token}"},
                             json={"rules": RULES, "html": "x" * 200_000})
    assert over.status_code == 413 and over.json()["detail"][0]["loc"] == ["body", "html"]
    assert huge.status_code == 413 and "request body is over" in huge.json()["detail"]


def test_a_read_only_token_may_not_make_the_server_fetch(api, site):
    answer = api.call("POST", "/api/rules/check", token="read",
                      json={"rules": RULES, "url": site.page_url(1)})
    assert answer.status_code == 403
    assert site.requests_for("/page/") == []
