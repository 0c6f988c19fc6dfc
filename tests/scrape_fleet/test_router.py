"""The public Router without a fleet: which handler a page goes to, what a handler may give,
the item pipeline, and errors recorded rather than raised."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scrape_fleet import DropItem, Request, Router
from scrape_fleet.testing import page_from_html

LISTING = """<html><head><title>Catalogue</title></head><body>
<a class=product href="/p/1">One</a> <a class=product href="p/2">Two</a>
<a class=next href="?page=2">next</a></body></html>"""


def _router() -> Router:
    router = Router()

    @router.default
    def listing(page):
        yield page.follow(page.css("a.product::attr(href)").getall(), "product",
                          meta={"from": page.url})
        yield page.follow(page.css("a.next::attr(href)").get())
        yield {"kind": "listing", "title": page.css("title::text").get()}

    @router.handler("product", url=r"/p/\d+$")
    def product(page):
        return {"kind": "product", "name": page.css("h1::text").get(), "meta": page.meta}

    @router.item
    def needs_name(item, page):
        if item["kind"] == "product" and not item["name"]:
            raise DropItem("no name")
        return {**item, "seen_at": page.url}

    return router


def test_the_default_handler_yields_items_and_follow_requests_resolved_against_the_page():
    result = _router().run(page_from_html(LISTING, "https://shop.test/catalog/"))
    assert result.handler == "default" and result.error is None
    assert result.items == [{"kind": "listing", "title": "Catalogue",
                             "seen_at": "https://shop.test/catalog/"}]
    assert result.requests == [
        Request(("https://shop.test/p/1", "https://shop.test/catalog/p/2"), "product",
                meta={"from": "https://shop.test/catalog/"}),
        Request(("https://shop.test/catalog/?page=2",))]


def test_a_label_wins_over_a_rule_and_a_rule_over_a_url_pattern():
    router = _router()
    labelled = page_from_html("<h1>X</h1>", "https://shop.test/p/1", label="default")
    assert router.choose(labelled, rule_handler="product") == "default"
    assert router.choose(page_from_html("<h1>X</h1>", "https://shop.test/x"),
                         rule_handler="product") == "product"
    assert router.choose(page_from_html("<h1>X</h1>", "https://shop.test/p/7")) == "product"
    assert router.choose(page_from_html("<h1>X</h1>", "https://shop.test/p/7/reviews")) == "default"


def test_a_label_naming_no_handler_is_an_error_on_the_page_not_an_exception():
    result = _router().run(page_from_html("<p>", "https://shop.test/", label="nope"))
    assert result.handler is None and result.items == []
    assert result.error.startswith("LookupError: no handler named 'nope' (the page's label)")


def test_a_router_without_default_says_so_for_a_page_nothing_claims():
    router = Router()
    router.handler("only", url="/only/")(lambda page: None)
    result = router.run(page_from_html("<p>", "https://shop.test/elsewhere"))
    assert result.error == ("LookupError: no label, rule or URL pattern chose a handler, and "
                            "the router has no default")


def test_dropped_items_are_listed_with_their_reason_and_the_stage_that_dropped_them():
    result = _router().run(page_from_html("<p>no heading</p>", "https://shop.test/p/3",
                                          meta={"from": "list"}))
    assert result.handler == "product" and result.items == []
    assert result.dropped == [{"reason": "no name", "by": "needs_name"}]


def test_items_given_before_an_exception_are_kept_and_the_error_is_recorded():
    router = Router()

    @router.default
    def half(page):
        yield {"n": 1}
        yield page.follow("/next")
        raise ValueError("boom")

    result = router.run(page_from_html("<p>", "https://shop.test/"))
    assert result.items == [{"n": 1}] and result.requests[0].urls == ("https://shop.test/next",)
    assert result.error == "ValueError: boom"


@pytest.mark.parametrize(("given", "error"), [
    ({1, 2}, "TypeError: handler gave a set: expected an item (a dict or a dataclass), a "
             "Request from page.follow(), or None"),
    ("text", "TypeError: handler gave a str"),
    ({"when": object()}, "TypeError: Type is not JSON serializable: object"),
    ({1: "int key"}, "TypeError: an item's keys must be strings"),
])
def test_garbage_from_a_handler_is_a_clear_error(given, error):
    router = Router()
    router.default(lambda page: given)
    assert router.run(page_from_html("<p>", "https://shop.test/")).error.startswith(error)


def test_dataclasses_generators_lists_and_async_handlers_all_give_items():
    @dataclass
    class Product:
        name: str

    router = Router()
    router.handler("dc")(lambda page: Product("a"))
    router.handler("many")(lambda page: [{"n": 1}, None, {"n": 2}])

    @router.handler("co")
    async def co(page):
        return {"n": "async"}

    @router.handler("agen")
    async def agen(page):
        yield {"n": "agen"}

    got = {name: router.run(page_from_html("<p>", "https://s.test/", label=name)).items
           for name in ("dc", "many", "co", "agen")}
    assert got == {"dc": [{"name": "a"}], "many": [{"n": 1}, {"n": 2}],
                   "co": [{"n": "async"}], "agen": [{"n": "agen"}]}


def test_a_pipeline_stage_that_forgets_to_return_the_item_is_an_error():
    router = Router()
    router.default(lambda page: {"n": 1})
    router.item(lambda item, page: None)
    assert router.run(page_from_html("<p>", "https://s.test/")).error == (
        "TypeError: item stage '<lambda>' returned a NoneType: it must return the item or "
        "raise DropItem")


def test_handler_names_are_checked_when_declared():
    router = Router()
    router.handler("product")(lambda page: None)
    with pytest.raises(ValueError, match="declared twice"):
        router.handler("product")
    for bad in ("", "has space", "default", "x" * 65):
        with pytest.raises(ValueError, match="a word of at most 64 characters"):
            router.handler(bad)


def test_an_item_with_megabytes_of_text_is_refused_before_it_is_encoded():
    router = Router()
    router.default(lambda page: {"blob": ["x" * (3 << 20), {"more": "y" * (2 << 20)}]})
    assert router.run(page_from_html("<p>", "https://s.test/")).error == (
        "ValueError: an item holds over 4194304 bytes of text; a record keeps far less "
        "(MAX_RECORD_BYTES)")


def test_a_memory_error_is_not_recorded_as_the_handler_s_error_but_ends_the_call():
    router = Router()

    @router.default
    def hog(page):
        raise MemoryError

    with pytest.raises(MemoryError):
        router.run(page_from_html("<p>", "https://s.test/"))
