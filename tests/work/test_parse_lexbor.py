"""The default page's parser (lexbor) against libxml2's: the same page from the same body, and
bounded time on hostile nesting (common/work/parse_lexbor.py, NOTES #81). Every case of
test_parse.py also runs through both."""

from __future__ import annotations

import random

import pytest

from bench.farm_pages import Site, page_html, paragraph_pool
from bench.parse_cost import make_page
from common.work import parse_lexbor
from common.work.parse import parse_html

SITES = [Site(index, f"127.0.0.{index + 2}", 8080) for index in range(4)]


def both(body: bytes, url: str) -> tuple[object, object]:
    fast = parse_html(body, url, "text/html; charset=utf-8")
    full = parse_html(body, url, "text/html; charset=utf-8", on_tree=lambda _root, _base: None)
    return fast, full


@pytest.mark.parametrize("n", [1, 2, 17, 99, 500])
def test_both_parsers_give_the_same_page_for_the_bench_farms_pages(n: int) -> None:
    pool = paragraph_pool()
    for site in SITES:
        body = page_html(site, n, 1000, SITES, pool).encode("utf-8")
        fast, full = both(body, site.page_url(n))

        assert fast == full
        assert fast.links and fast.title and fast.text_length > 10_000


def test_both_parsers_give_the_same_page_for_the_parse_benchs_odd_link_shapes() -> None:
    fast, full = both(make_page(), "https://example.com/dir/page.html")

    assert fast == full
    assert len(fast.links) > 50


def test_both_parsers_agree_on_randomly_nested_and_broken_markup() -> None:
    # Unclosed, misnested and stray tags in random order: the HTML5 and libxml2 trees may
    # differ in shape, but what the record keeps from the page must not.
    rng = random.Random(20261127)
    pieces = ["<p>", "</p>", "<div>", "</div>", "<b>", "</b>", "<i>", "</i>", "<span>",
              "</span>", "<ul><li>", "<li>", "</ul>", "word ", "café ", "<br>",
              '<a href="/x/1">one</a>', '<a href="rel/2#f">two</a>', "<!-- c -->",
              "<noscript><a href='/ns'>ns</a></noscript>", "<script>var a='<p>';</script>"]
    for _ in range(300):
        body = ("<html><head><title>t</title></head><body>"
                + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))).encode()
        fast, full = both(body, "http://127.0.0.2/d/p.html")

        assert fast == full, body


def test_links_inside_a_template_are_not_the_pages_in_either_parser() -> None:
    body = b'<body><template><a href="/inert">x</a></template><a href="/real">y</a></body>'
    fast, full = both(body, "http://127.0.0.2/")

    assert fast.links == full.links == ("http://127.0.0.2/real",)


@pytest.mark.parametrize("body", [
    b"<div>" * 99_000 + b"x",  # libxml2 stops at depth 256; HTML5's building is quadratic
    b"<div>" * 50_000 + b"</zz>" * 50_000,  # stray end tags do not hide the depth
    b"<div>" * 1_000 + b"<p>x</p>" * 40_000,
], ids=["nested", "stray-end-tags", "deep-then-wide"])
def test_a_page_whose_tags_could_make_lexbor_quadratic_goes_to_libxml2(body: bytes) -> None:
    assert not parse_lexbor.fits(body)

    page = parse_html(body, "http://127.0.0.2/")  # returns: libxml2 read it

    assert page.links == ()


def test_an_ordinary_page_is_read_by_lexbor() -> None:
    body = page_html(SITES[0], 3, 1000, SITES, paragraph_pool()).encode("utf-8")

    assert parse_lexbor.fits(body)
    assert body.count(b"<") < parse_lexbor.MAX_START_TAGS


def test_the_start_tag_bound_is_exact_at_its_limit() -> None:
    limit = parse_lexbor.MAX_START_TAGS

    assert parse_lexbor.fits(b"<i>" * limit + b"</i>" * limit)
    assert not parse_lexbor.fits(b"<i>" * (limit + 1) + b"</i>" * limit)
    assert not parse_lexbor.fits(b"<i>" * (limit + 1))
