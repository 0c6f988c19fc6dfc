"""A handler asking for its followed pages to be rendered: ``page.follow(url, render=...)``
(scrape_fleet) gives a Request whose wire form carries ``render`` as the worker reads it
(common/core/render_options.py); a bad value is refused in the handler, saying why."""

from __future__ import annotations

import json

import pytest

from common.core.render_options import MAX_SCROLLS, parse_render
from scrape_fleet import Router
from scrape_fleet.request import Request
from scrape_fleet.testing import page_from_html

PAGE = "<html><body><a href='/app/1'>app</a></body></html>"
URL = "https://shop.test/list"


def test_follow_with_render_true_gives_a_request_whose_wire_says_render_true():
    page = page_from_html(PAGE, URL)
    request = page.follow(page.css("a::attr(href)").get(), "product", render=True)
    wire = request.wire()
    assert wire["urls"] == ["https://shop.test/app/1"]
    assert wire["render"] is True and wire["handler"] == "product"
    assert json.loads(json.dumps(wire)) == wire  # it crosses the child's pipe as JSON


def test_follow_with_render_options_keeps_them_on_the_wire_as_the_worker_reads_them():
    page = page_from_html(PAGE, URL)
    wire = page.follow("/app/2", render={"scroll": 2}).wire()
    assert wire["render"] == {"scroll": 2}
    assert parse_render(wire["render"]).scroll == 2
    wire = page.follow("/app/3", render={"wait_for": " .item ", "scroll": 0}).wire()
    assert wire["render"] == {"wait_for": ".item"}  # trimmed, the default scroll left out


def test_follow_without_render_leaves_the_choice_to_the_fleet():
    page = page_from_html(PAGE, URL)
    for plain in (page.follow("/app/4"), page.follow("/app/4", render=False),
                  page.follow("/app/4", render=None)):
        assert plain.render is False
        assert "render" not in plain.wire()  # a plain follow's wire as before


@pytest.mark.parametrize(("render", "message"), [
    ("yes", "expected true, false or a mapping"),
    (1, "got int"),
    ({"scroll": MAX_SCROLLS + 1}, f"from 0 to {MAX_SCROLLS}"),
    ({"scroll": True}, "scroll: expected a whole number"),
    ({"wait_for": 7}, "wait_for: expected a CSS selector"),
    ({"when_missing": ".p"}, "unknown key(s) when_missing"),  # rules only
])
def test_a_bad_render_value_raises_value_error_saying_what_is_wrong(render, message):
    page = page_from_html(PAGE, URL)
    with pytest.raises(ValueError) as refused:
        page.follow("/app/5", render=render)
    assert message in str(refused.value)
    with pytest.raises(ValueError):
        Request.build(URL, "/app/5", render=render)


def test_a_handler_yielding_a_bad_render_keeps_its_items_and_records_the_error():
    router = Router()

    @router.default
    def listing(page):  # noqa: ANN001, ANN202
        yield {"seen": True}
        yield page.follow("/app/6", render={"scroll": "lots"})

    result = router.run(page_from_html(PAGE, URL))
    assert result.items == [{"seen": True}] and result.requests == []
    assert result.error is not None and "scroll" in result.error
