"""The web UI's pages without a browser: served for a logged-in cookie only (else a redirect
to the login page), every form input labelled, the static files served, the rules editor's
YAML read into JSON (422 naming the field and line), no management password in a link."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import requests

from common.api.deps import COOKIE
from common.api.ui import rabbitmq_ui
from common.jobs.spec import parse_job

PAGES = ["/", "/jobs/new", "/jobs/shop", "/workers"]


def get(api, path: str, token: str | None = "admin", **kwargs: object) -> requests.Response:
    chosen = {"admin": api.admin, "read": api.read}.get(token or "", token)
    cookies = {COOKIE: chosen} if chosen else {}
    return requests.get(api.url + path, cookies=cookies, allow_redirects=False, timeout=10,
                        **kwargs)


class Labels(HTMLParser):
    """Each input/textarea/select id and the ids <label for=…> names; buttons' types."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[str] = []
        self.labelled: set[str] = set()
        self.buttons: list[dict[str, str | None]] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag in ("input", "textarea", "select") and found.get("type") != "hidden":
            self.inputs.append(found.get("id") or "")
        if tag == "label" and found.get("for"):
            self.labelled.add(found["for"] or "")
        if tag == "button":
            self.buttons.append(found)
        if tag == "a":
            self.links.append(found.get("href") or "")


@pytest.mark.parametrize("path", PAGES)
def test_a_page_without_a_cookie_or_with_a_refused_one_redirects_to_the_login_page(api, path):
    for token in (None, "sf_not-a-token"):
        answer = get(api, path, token=token)
        assert answer.status_code == 303, (path, token, answer.status_code)
        assert answer.headers["location"].startswith("/login?next=")
        assert requests.utils.unquote(answer.headers["location"].split("=", 1)[1]) == path


@pytest.mark.parametrize("path", [*PAGES, "/login"])
def test_every_page_labels_each_input_uses_typed_buttons_and_sets_a_strict_policy(api, path):
    answer = get(api, path)
    assert answer.status_code == 200, answer.text
    assert "no-store" in answer.headers["cache-control"]
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    page = Labels()
    page.feed(answer.text)
    assert all(page.inputs), f"an input without an id on {path}"
    assert set(page.inputs) <= page.labelled, set(page.inputs) - page.labelled
    assert all(b.get("type") in ("button", "submit") for b in page.buttons), page.buttons
    assert '<meta name="viewport"' in answer.text
    assert "<script>" not in answer.text  # no inline script: the policy would refuse it


def test_every_page_links_to_the_rabbitmq_ui_grafana_and_the_api_docs(api):
    page = Labels()
    page.feed(get(api, "/workers").text)
    assert {rabbitmq_ui(api.settings), "http://127.0.0.1:3000", "/api/docs"} <= set(page.links)


def test_a_read_only_caller_sees_no_button_that_changes_anything(api):
    page = get(api, "/jobs/shop", token="read").text
    assert 'data-scope="read"' in page
    assert 'id="cancel"' not in page and 'id="replay"' not in page
    assert "/jobs/new" not in get(api, "/", token="read").text
    assert 'id="cancel"' in get(api, "/jobs/shop").text


def test_a_job_page_refuses_a_name_no_job_can_have(api):
    assert get(api, "/jobs/Bad%20Name").status_code == 404


def test_the_login_page_sends_back_only_to_a_path_of_this_site(api):
    assert 'data-next="/jobs/shop"' in get(api, "/login?next=/jobs/shop", token=None).text
    for outside in ("https://evil.example/", "//evil.example/x"):
        page = get(api, "/login", token=None, params={"next": outside}).text
        assert 'data-next="/"' in page


def test_the_static_script_and_stylesheet_are_served_and_load_no_library(api):
    script = requests.get(api.url + "/static/app.js", timeout=10)
    style = requests.get(api.url + "/static/app.css", timeout=10)
    assert script.status_code == 200 and style.status_code == 200
    assert "credentials: \"same-origin\"" in script.text
    assert not re.search(r"https?://", script.text.replace("http://www.w3.org/2000/svg", ""))
    assert "@media (max-width" in style.text and ":focus-visible" in style.text


def test_the_rules_editors_yaml_becomes_json_that_a_job_accepts(api):
    text = "- name: product\n  path: '^/page/'\n  fields:\n    title: h1\n"
    answer = api.call("POST", "/ui/yaml", json={"text": text})
    assert answer.status_code == 200, answer.text
    rules = answer.json()["rules"]
    assert rules == [{"name": "product", "path": "^/page/", "fields": {"title": "h1"}}]
    assert parse_job({"name": "x", "seeds": {"urls": ["http://127.0.0.1/"]},
                      "rules": rules}).knobs["EXTRACT_RULES"]


def test_bad_yaml_is_refused_naming_the_field_and_the_line(api):
    answer = api.call("POST", "/ui/yaml", json={"text": "- name: a\n  fields: {title: h1\n"})
    assert answer.status_code == 422
    [problem] = answer.json()["detail"]
    assert problem["loc"] == ["body", "text"] and "line 3" in problem["msg"]


def test_reading_yaml_needs_an_admin_token(api):
    assert api.call("POST", "/ui/yaml", token=None, json={"text": "[]"}).status_code == 401
    assert api.call("POST", "/ui/yaml", token="read", json={"text": "[]"}).status_code == 403


def test_the_rabbitmq_link_never_carries_the_management_password(settings):
    with_password = settings.with_overrides(
        rabbitmq_management_url="http://fleet:s3cret@broker.example:15672/api/,http://b:1/")
    assert rabbitmq_ui(with_password) == "http://broker.example:15672/"
    plain = settings.with_overrides(rabbitmq_management_url=None,
                                    rabbitmq_url_raw="amqp://u:p@10.0.0.7:5672/%2F")
    assert rabbitmq_ui(plain) == "http://10.0.0.7:15672/"
