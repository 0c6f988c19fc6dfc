"""Which pages a browser renders (common/work/render_route.py), the render options read from
rules and messages (common/core/render_options.py, common/work/rules_file.py), and a hostile
``render`` field reaching an HTTP worker. Real Redis (``render:domains``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.errors import ConfigError
from common.core.render_options import (
    MAX_SCROLLS,
    MAX_SELECTOR_CHARS,
    BadRenderOptions,
    RenderOptions,
    parse_render,
)
from common.store.keys import RENDER_DOMAINS
from common.web.renderer import Renderer
from common.work import render_route
from common.work.job_book import JobBook
from common.work.outcome import Outcome
from common.work.parse import parse_html
from common.work.processor import Processor
from common.work.render_route import RenderDomains, RenderRoute, looks_like_shell
from common.work.rules_file import load_rules

SITE = "http://127.0.0.1:9"
SHELL = (b"<!doctype html><html><head><title>app</title></head><body><div id=root></div>"
         b"<noscript>You need to enable JavaScript to run this app.</noscript>"
         b"<script src=/static/js/main.js></script></body></html>")
ARTICLE = ("<!doctype html><html><head><title>news</title><script>window.ga = 1;</script>"
           "</head><body><article><h1>A long read</h1>"
           + "<p>" + "Plain words anyone can read without a browser. " * 20 + "</p>"
           + "</article><script src=/analytics.js></script></body></html>").encode()


def _rules(*rules: dict[str, Any]) -> str:
    return json.dumps({"rules": list(rules)})


def _route(settings: Settings, redis_client: Any, **overrides: Any) -> RenderRoute:
    configured = settings.with_overrides(**overrides)
    return RenderRoute(configured, redis_client, JobBook(configured, redis_client))


# -- the shell check ---------------------------------------------------------------------------


def _shell(body: bytes) -> bool:
    """The shell check on a page measured as the Read step measures it."""
    return looks_like_shell(parse_html(body, f"{SITE}/").text_length, body)


def test_an_empty_app_page_with_a_script_looks_like_a_shell():
    assert _shell(SHELL)
    assert _shell(b"<html><head><script src=/app.js></script></head><body></body></html>")


def test_a_page_with_scripts_and_a_lot_of_text_is_not_a_shell():
    assert parse_html(ARTICLE, f"{SITE}/").text_length > render_route.SHELL_TEXT_CHARS
    assert not _shell(ARTICLE)


def test_script_text_does_not_count_as_visible_text():
    padded = (b"<html><body><div id=root></div><script>var state = '"
              + b"x" * 5000 + b"';</script></body></html>")
    assert _shell(padded)


def test_a_short_page_without_any_script_is_not_a_shell():
    assert not looks_like_shell(12, b"<html><body><p>Short page.</p></body></html>")


def test_a_page_whose_text_was_not_measured_is_not_a_shell():
    assert not looks_like_shell(None, SHELL)


# -- marked domains ---------------------------------------------------------------------------


def test_a_marked_domain_is_wanted_at_once_by_its_marker_and_by_another_worker_after_a_read(
        redis_client):
    marker, other = RenderDomains(redis_client, 60), RenderDomains(redis_client, 60)
    assert not other.wants("default", "127.0.0.1")  # read now: nothing marked yet
    marker.mark("default", "127.0.0.1")
    assert marker.wants("default", "127.0.0.1")
    assert not marker.wants("default", "127.0.0.2")
    assert not marker.wants("shop", "127.0.0.1")  # marks are per job
    until = float(redis_client.hget(RENDER_DOMAINS, "default|127.0.0.1"))
    assert time.time() + 55 < until <= time.time() + 61
    assert not other.wants("default", "127.0.0.1")  # its copy is younger than REFRESH_S
    other._read_at -= render_route.REFRESH_S  # noqa: SLF001 - as if REFRESH_S went by
    assert other.wants("default", "127.0.0.1")


def test_a_mark_past_its_time_is_not_wanted_and_is_removed_at_the_next_mark(redis_client):
    domains = RenderDomains(redis_client, 60)
    redis_client.hset(RENDER_DOMAINS, "default|old.example", f"{time.time() - 1:.0f}")
    domains._read_at = 0.0  # noqa: SLF001 - read now
    assert not domains.wants("default", "old.example")
    domains.mark("default", "new.example")
    assert redis_client.hkeys(RENDER_DOMAINS) == [b"default|new.example"]


def test_bad_entries_in_the_marked_domains_are_skipped(redis_client, caplog):
    redis_client.hset(RENDER_DOMAINS, mapping={"default|bad": "soon",
                                               "default|good": f"{time.time() + 60:.0f}"})
    domains = RenderDomains(redis_client, 60)
    assert domains.wants("default", "good") and not domains.wants("default", "bad")
    assert "bad entry" in caplog.text


# -- before the fetch -------------------------------------------------------------------------


def test_a_message_asking_for_rendering_is_rendered_with_its_options(settings, redis_client):
    route = _route(settings, redis_client)
    assert route.before_fetch(None, f"{SITE}/a", True) == RenderOptions()
    assert route.before_fetch(None, f"{SITE}/a", {"wait_for": ".x", "scroll": 2}) == \
        RenderOptions(wait_for=".x", scroll=2)
    assert route.before_fetch(None, f"{SITE}/a", None) is None
    assert route.before_fetch(None, f"{SITE}/a", False) is None


def test_a_rule_saying_render_false_wins_over_the_message_and_render_always(
        settings, redis_client):
    route = _route(settings, redis_client, render="always", extract_rules=_rules(
        {"path": "^/never/", "render": False, "fields": {"t": "title"}}))
    assert route.before_fetch(None, f"{SITE}/never/1", True) is None
    assert route.before_fetch(None, f"{SITE}/other", None) == RenderOptions()


def test_a_rules_options_render_its_pages_and_others_stay_plain(settings, redis_client):
    route = _route(settings, redis_client, extract_rules=_rules(
        {"path": "^/app/", "render": {"wait_for": "#list li", "scroll": 3},
         "fields": {"t": "title"}},
        {"path": "^/", "fields": {"t": "title"}}))
    assert route.before_fetch(None, f"{SITE}/app/1", None) == RenderOptions(
        wait_for="#list li", scroll=3)
    assert route.before_fetch(None, f"{SITE}/plain", None) is None


def test_render_auto_sends_a_shell_on_marks_its_domain_and_its_next_page_skips_the_fetch(
        settings, redis_client):
    route = _route(settings, redis_client, render="auto")
    assert route.before_fetch(None, f"{SITE}/1", None) is None
    assert route.after_read(None, f"{SITE}/1", 40, SHELL) == RenderOptions()
    assert redis_client.hkeys(RENDER_DOMAINS) == [b"default|127.0.0.1"]
    assert route.before_fetch(None, f"{SITE}/2", None) == RenderOptions()
    assert route.before_fetch(None, "http://127.0.0.2:9/2", None) is None


def test_render_auto_keeps_a_text_page_with_scripts_plain_and_marks_nothing(
        settings, redis_client):
    route = _route(settings, redis_client, render="auto")
    assert route.after_read(None, f"{SITE}/article", 1000, ARTICLE) is None
    assert redis_client.hlen(RENDER_DOMAINS) == 0


def test_without_render_auto_a_shell_is_recorded_as_read(settings, redis_client):
    route = _route(settings, redis_client)
    assert route.after_read(None, f"{SITE}/1", 40, SHELL) is None
    assert redis_client.hlen(RENDER_DOMAINS) == 0


def test_a_when_missing_rule_renders_a_page_lacking_its_selector_only(settings, redis_client):
    route = _route(settings, redis_client, extract_rules=_rules(
        {"path": "^/shop/", "render": {"when_missing": ".product", "wait_for": ".product"},
         "fields": {"t": "title"}}))
    assert route.before_fetch(None, f"{SITE}/shop/1", None) is None  # plain first
    with_it = b"<html><body><div class=product>pot</div></body></html>"
    assert route.after_read(None, f"{SITE}/shop/1", 3, with_it) is None
    assert redis_client.hlen(RENDER_DOMAINS) == 0
    rendered = route.after_read(None, f"{SITE}/shop/2", 0, SHELL)
    assert rendered == RenderOptions(wait_for=".product", when_missing=".product")
    assert rendered.to_message() == {"wait_for": ".product"}  # when_missing stays behind
    assert route.before_fetch(None, f"{SITE}/shop/3", None) == rendered  # domain marked
    assert route.before_fetch(None, f"{SITE}/elsewhere", None) is None  # no rule, no RENDER


def test_a_hostile_render_field_in_a_message_is_refused_by_the_route(settings, redis_client):
    route = _route(settings, redis_client)
    with pytest.raises(BadRenderOptions, match="scroll"):
        route.before_fetch(None, f"{SITE}/a", {"scroll": 10**9})


# -- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    ("true", "expected true, false or a mapping, got str"),
    (1, "got int"),
    ([True], "got list"),
    ({"scroll": True}, "scroll: expected a whole number"),
    ({"scroll": 2.5}, "scroll: expected a whole number"),
    ({"scroll": "3"}, "scroll: expected a whole number"),
    ({"scroll": -1}, "scroll: expected a whole number"),
    ({"scroll": MAX_SCROLLS + 1}, f"from 0 to {MAX_SCROLLS}"),
    ({"scroll": 10**400}, "scroll: expected a whole number"),
    ({"scroll": {"nested": [1, {"deep": None}]}}, "scroll: expected a whole number"),
    ({"wait_for": "x" * (MAX_SELECTOR_CHARS + 1)}, "wait_for: expected a CSS selector"),
    ({"wait_for": ["a", "b"]}, "wait_for: expected a CSS selector"),
    ({"wait_for": "   "}, "wait_for: expected a CSS selector"),
    ({"when_missing": ".product"}, "unknown key(s) when_missing"),
    ({"evaluate": "alert(1)", "x" * 1000: 1}, "unknown key(s) evaluate"),
])
def test_hostile_render_values_are_refused_saying_what_is_wrong(value, message):
    with pytest.raises(BadRenderOptions) as refused:
        parse_render(value)
    assert message in str(refused.value)
    assert len(str(refused.value)) < 400  # a huge value is not echoed whole


def test_good_render_values_give_their_options():
    assert parse_render(None) is None and parse_render(False) is None
    assert parse_render(True) == RenderOptions()
    assert parse_render({"wait_for": " .a ", "scroll": MAX_SCROLLS}) == RenderOptions(
        wait_for=".a", scroll=MAX_SCROLLS)
    assert parse_render({"when_missing": ".p"}, from_rule=True).adaptive
    assert RenderOptions().to_message() is True


@pytest.mark.parametrize(("render", "message"), [
    ("yes", "got str"),
    ({"scroll": 99}, "scroll"),
    ({"wait_for": "div[[["}, "render.wait_for"),
    ({"when_missing": "::nonsense("}, "render.when_missing"),
    ({"click": ".more"}, "unknown key(s) click"),
    (None, "expected true, false or a mapping"),
])
def test_a_bad_render_in_a_rule_is_a_config_error_naming_the_rule(render, message):
    raw = _rules({"name": "listing", "path": "^/l/", "render": render,
                  "fields": {"t": "title"}})
    with pytest.raises(ConfigError) as refused:
        load_rules(raw)
    assert "listing" in str(refused.value) and message in str(refused.value)


def test_render_is_read_from_a_rule_with_its_when_missing_check():
    [rule] = load_rules(_rules({"path": "^/p/", "render": {"when_missing": ".product"},
                                "fields": {"t": "title"}}))
    assert rule.render == RenderOptions(when_missing=".product")
    assert rule.render_missing and "product" in rule.render_missing


# -- a hostile message reaching an HTTP worker -------------------------------------------------


@pytest.fixture
def processor(settings: Settings, redis_client: Any) -> Iterator[Processor]:
    made = Processor(settings.with_overrides(robots_enabled=False), redis_client)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("render", ["please", {"scroll": 10**6}, {"wait_for": {"$gt": ""}},
                                    {"exec": "rm -rf /"}])
def test_a_message_with_a_hostile_render_field_is_dead_lettered_as_a_bad_message(
        processor, render):
    body = WorkMessage(url=f"{SITE}/page", extra={"render": render}).to_json()
    outcome: Outcome = processor.process(body, topology.NORMAL_QUEUE)
    assert outcome.kind == "dead_letter", outcome
    [publish] = outcome.publishes
    assert (publish.headers or {}).get("reason") == "bad_message"
    assert publish.headers["last_error"].startswith("render: "), publish.headers


def _no_browser() -> Any:
    raise AssertionError("a hostile render field must be refused before any browser starts")


@pytest.mark.parametrize("render", [{"scroll": -5}, {"wait_for": "x" * 100_000}, [1, 2]])
def test_a_hostile_render_field_reaching_a_render_worker_is_dead_lettered_unrendered(
        settings, redis_client, render):
    configured = settings.with_overrides(robots_enabled=False)
    renderer = Renderer(configured, 1, browser_factory=_no_browser)
    made = Processor(configured, redis_client, renderer=renderer)
    try:
        body = WorkMessage(url=f"{SITE}/page", extra={"render": render}).to_json()
        outcome = made.process(body, topology.RENDER_QUEUE)
    finally:
        made.close()
        renderer.close()
    assert outcome.kind == "dead_letter", outcome
    [publish] = outcome.publishes
    assert (publish.headers or {}).get("reason") == "bad_message"
    error = publish.headers["last_error"]
    assert error.startswith("render: ") and len(error) < 400, error  # not the 100 kB value
