"""The public Page: selectors on the worker's tree, main content, and follow requests."""

from __future__ import annotations

import pytest

from scrape_fleet.testing import page_from_html

ARTICLE = """<html><head><title>T</title><script>var x = 1;</script></head><body>
<nav><a href="/">Home</a> <a href="/about">About us</a></nav>
<div id=cookie>We use cookies. Accept all</div>
<article><h1>Rivers of Europe</h1>
<p>The Danube flows through ten countries, more than any other river in the world, and
its basin drains a large part of central and south-eastern Europe into the Black Sea.</p>
<ul><li>Danube</li><li>Rhine</li></ul>
<p>The Rhine rises in the Swiss Alps and reaches the North Sea in the Netherlands after a
course of more than twelve hundred kilometres past cities, vineyards and castles.</p>
</article><footer>Copyright 2026 Example Ltd</footer></body></html>"""


def test_css_xpath_and_re_read_the_worker_s_tree_without_scripts():
    page = page_from_html(ARTICLE, "https://geo.test/rivers")
    assert page.css("h1::text").get() == "Rivers of Europe"
    assert page.xpath("//li/text()").getall() == ["Danube", "Rhine"]
    assert page.re(r"flows through (\w+) countries") == ["ten"]
    assert page.css("script").getall() == []  # stripped, as in the worker


def test_main_text_and_markdown_keep_the_article_and_drop_menus_banners_and_footers():
    page = page_from_html(ARTICLE, "https://geo.test/rivers")
    assert "The Danube flows through ten countries" in page.main_text
    markdown = page.markdown
    assert markdown.startswith("# Rivers of Europe")
    assert "- Danube" in markdown
    for boilerplate in ("About us", "cookies", "Copyright"):
        assert boilerplate not in markdown and boilerplate not in page.main_text


def test_text_is_the_body_decoded_as_the_worker_decodes_it():
    page = page_from_html("<p>café</p>".encode("latin-1"), "https://x.test/",
                          headers={"Content-Type": "text/html; charset=iso-8859-1"})
    assert "café" in page.text and page.headers["content-type"].endswith("iso-8859-1")


def test_follow_skips_empty_urls_and_checks_meta_and_headers():
    page = page_from_html("<p>", "https://x.test/a/")
    request = page.follow([None, "", "b", "https://y.test/c"], "next", priority=True,
                          meta={"n": 1}, headers={"Accept-Language": "de"})
    assert request.urls == ("https://x.test/a/b", "https://y.test/c")
    assert (request.handler, request.priority, request.meta, request.headers) == (
        "next", True, {"n": 1}, {"Accept-Language": "de"})
    assert page.follow(page.css("a::attr(href)").get()).urls == ()
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        page.follow("b", meta={"x": object()})
    with pytest.raises(ValueError, match="over 4096"):
        page.follow("b", meta={"x": "y" * 5000})
    with pytest.raises(ValueError, match="set by the fetcher"):
        page.follow("b", headers={"Host": "evil.test"})
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        page.follow("b", headers={"X-A": "1\r\nX-B: 2"})
    with pytest.raises(TypeError, match="URL strings"):
        page.follow([b"bytes"])
