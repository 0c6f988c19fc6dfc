"""A page's main content as text and Markdown (common/work/content.py), and the rules fields
``get: main_text`` / ``get: markdown`` through the worker's own reader. No services."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from lxml import etree

from common.core.config import load_settings
from common.web.fetch import FetchResult
from common.work import content
from common.work.content import (
    MAX_INPUT_BYTES,
    ContentError,
    PageContent,
    bound_html,
    extract_main,
)
from common.work.extract import Extractor
from common.work.page_record import PageReader
from common.work.parse import parse_html
from common.work.rules_file import load_rules
from tests.helpers import REPO_ROOT

URL = "https://kettle.example/guides/descale"
BOILERPLATE = ("We use cookies", "Accept all cookies", "Contact us", "Copyright 2026",
               "Terms of service")
ARTICLE_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Kettles and how to descale them</title>
<style>body{margin:0}</style><script>trackPageView();</script></head>
<body>
<div id="cookie-banner" class="cookie-consent">We use cookies to improve your experience.
 <button>Accept all cookies</button> <a href="/privacy">Privacy policy</a></div>
<header><nav class="main-nav"><ul>
 <li><a href="/">Home</a></li><li><a href="/shop">Shop</a></li><li><a href="/blog">Blog</a></li>
 <li><a href="/contact">Contact us</a></li></ul></nav></header>
<main><article>
<h1>Kettles and how to descale them</h1>
<p>Limescale builds up in every kettle that boils hard water, and a scaled kettle wastes
energy: the element has to heat the scale before it heats the water. This guide explains
how often to descale, what to use and what to avoid.</p>
<h2>What you need</h2>
<ul><li>White vinegar or citric acid</li><li>Fresh water for rinsing</li>
<li>A soft brush for the spout filter</li></ul>
<p>Citric acid is <em>odourless</em> and works as well as vinegar; see our
<a href="/guides/citric-acid">citric acid guide</a> for the quantities that suit your kettle.</p>
<table><tr><th>Kettle</th><th>Citric acid</th></tr><tr><td>1.7 l</td><td>2 tbsp</td></tr></table>
<h2>How often</h2>
<p>In a hard-water area, descale once a month; in a soft-water area, every three months is
enough. If you see white flakes floating in your tea, it is overdue, whatever the calendar
says. Rinse twice after descaling and boil one kettle of fresh water before use.</p>
</article></main>
<footer><p>Copyright 2026 Kettle World Ltd. All rights reserved.</p>
<ul><li><a href="/terms">Terms of service</a></li><li><a href="/imprint">Imprint</a></li></ul>
</footer>
</body></html>"""
#: Menus, a cookie banner and a footer around an empty <main>.
NO_CONTENT_PAGE = """<html><head><title>Shop</title></head><body>
<div class="cookie-banner">We use cookies. <button>Accept</button></div>
<header><nav><ul><li><a href="/">Home</a></li><li><a href="/shop">Shop</a></li></ul></nav>
</header><main></main><footer><p>Copyright 2026 Kettle World Ltd.</p>
<a href="/terms">Terms</a></footer></body></html>"""


def test_main_text_keeps_the_article_and_drops_the_banner_menu_and_footer():
    text = extract_main(ARTICLE_PAGE, URL, "text")
    assert text is not None and text.startswith("Kettles and how to descale them")
    for kept in ("Limescale builds up", "White vinegar or citric acid", "citric acid guide",
                 "boil one kettle of fresh water"):
        assert kept in text
    assert not [junk for junk in BOILERPLATE if junk in text]
    assert "trackPageView" not in text and "#" not in text and "](" not in text


def test_markdown_keeps_headings_list_items_emphasis_and_absolute_links():
    markdown = extract_main(ARTICLE_PAGE, URL, "markdown")
    assert markdown is not None
    lines = markdown.splitlines()
    assert "# Kettles and how to descale them" in lines
    assert "## What you need" in lines and "## How often" in lines
    assert "- Fresh water for rinsing" in lines
    assert "*odourless*" in markdown
    assert "| Kettle | Citric acid |" in markdown and "| 1.7 l | 2 tbsp |" in markdown
    assert "[citric acid guide](https://kettle.example/guides/citric-acid)" in markdown
    assert not [junk for junk in BOILERPLATE if junk in markdown]


@pytest.mark.parametrize("html", [NO_CONTENT_PAGE, "", "   \n", "<html><body></body></html>"])
def test_a_page_without_main_content_gives_none_and_logs_nothing(html, caplog):
    caplog.set_level(logging.DEBUG)
    assert extract_main(html, URL, "markdown") is None
    assert extract_main(html, URL, "text") is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_same_page_gives_the_same_markdown_every_time():
    assert len({extract_main(ARTICLE_PAGE, URL, "markdown") for _ in range(3)}) == 1


def test_an_unknown_output_is_refused():
    with pytest.raises(ValueError, match="output must be one of text, markdown"):
        extract_main(ARTICLE_PAGE, URL, "html")


def test_a_5_mib_page_is_read_only_up_to_its_first_mib():
    filler = "<p>" + "More about kettles, limescale and the hardness of water. " * 4 + "</p>\n"
    big = ARTICLE_PAGE.replace(
        "</article>", "</article>" + filler * (5 * 1024 * 1024 // len(filler))
        + "<p>The very last paragraph of this page, past every cap.</p>")
    assert len(big) > 5 * 1024 * 1024
    bounded, cut = bound_html(big, MAX_INPUT_BYTES, 100_000)
    assert cut == "bytes" and len(bounded.encode()) <= MAX_INPUT_BYTES
    text = extract_main(big, URL, "text")
    assert text is not None and "Limescale builds up" in text
    assert "past every cap" not in text and len(text.encode()) < MAX_INPUT_BYTES


def test_a_page_of_more_tags_than_the_cap_is_cut_as_the_worker_cuts_it():
    page = "<html><body>" + "<p>kettle</p>" * 200 + "<p>after the cap</p></body></html>"
    bounded, cut = bound_html(page, MAX_INPUT_BYTES, max_tags=100)
    assert cut == "tags" and bounded.count("<") == 100 and "after the cap" not in bounded
    assert bound_html(ARTICLE_PAGE, MAX_INPUT_BYTES, 100_000) == (ARTICLE_PAGE, None)


def test_a_multibyte_character_cut_in_two_is_dropped_not_garbled():
    bounded, cut = bound_html("<p>" + "é" * 100 + "</p>", 10, 100)
    assert cut == "bytes" and bounded == "<p>ééé"


def _tree(html: str) -> tuple[etree._Element, str]:
    trees = []
    parse_html(html.encode(), URL, "text/html; charset=utf-8",
               on_tree=lambda root, base: trees.append((root, base)))
    return trees[0]


def test_the_workers_tree_is_left_as_it_was():
    root, base = _tree(ARTICLE_PAGE)
    before = etree.tostring(root)
    main = PageContent(root, base)
    assert main.get("markdown")[0].startswith("# Kettles")
    assert main.get("text", "//article", root.xpath("//article")[0])[0].startswith("Kettles")
    assert etree.tostring(root) == before


def test_a_value_over_the_cap_is_cut_on_a_line_and_says_so():
    root, base = _tree(ARTICLE_PAGE)
    value, note = PageContent(root, base, max_bytes=300).get("markdown")
    assert len(value.encode()) <= 300 and value.startswith("# Kettles")
    assert not value.endswith(" ") and value.count("\n") >= 2  # whole lines kept
    assert note.startswith("cut: main content is ") and note.endswith(f"the first {len(value)}")


def test_a_library_failure_is_a_content_error_naming_it(monkeypatch):
    def broken(*_args, **_kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(content._library(), "extract", broken)
    with pytest.raises(ContentError, match="main content: RecursionError: maximum recursion"):
        extract_main(ARTICLE_PAGE, URL, "text")


def test_trafilatura_is_imported_only_when_a_page_asks_for_main_content():
    script = (
        "import json, sys\n"
        "from common.work.extract import Extractor\n"
        "from common.work.page_record import PageReader\n"
        "from common.work.rules_file import load_rules\n"
        "rules = json.dumps([{'host': 'a.example', 'fields': {'b': {'get': 'markdown'}}}])\n"
        "Extractor(load_rules(rules))\n"
        "assert 'trafilatura' not in sys.modules, 'imported at start'\n"
        "from common.work.content import extract_main\n"
        "extract_main('<p>x</p>', 'https://a.example/', 'text')\n"
        "assert 'trafilatura' in sys.modules\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr


# -- rules: get main_text / markdown ---------------------------------------------------------

RULES = [{"name": "guides", "host": "kettle.example", "handler": "guide", "fields": {
    "title": "h1",
    "body": {"get": "markdown"},
    "body_again": {"get": "markdown"},
    "plain": {"get": "main_text"},
    "article": {"css": "article", "get": "markdown"},
    "sidebar": {"css": "aside.related", "get": "main_text", "default": ""},
}}]


def _read(settings_env: dict[str, str], html: str) -> dict:
    reader = PageReader(load_settings(settings_env))
    response = FetchResult(url=URL, final_url=URL, status=200,
                           content_type="text/html; charset=utf-8", body=html.encode(),
                           elapsed_ms=1.0)
    return reader.read(URL, response, queue="q", depth=0, attempts=1, cached=False).record


def test_the_workers_reader_puts_the_markdown_under_data(monkeypatch):
    calls = []
    real = content.extract_main

    def counted(html: str, url: str, output: str, **kwargs) -> str | None:
        calls.append(output)
        return real(html, url, output, **kwargs)

    monkeypatch.setattr(content, "extract_main", counted)
    record = _read({"EXTRACT_RULES": json.dumps(RULES)}, ARTICLE_PAGE)
    data = record["data"]
    assert data["title"] == "Kettles and how to descale them"
    assert data["body"] == data["body_again"] == extract_main(ARTICLE_PAGE, URL, "markdown")
    assert "## What you need" in data["body"] and "Copyright" not in data["body"]
    assert data["plain"].startswith("Kettles") and "#" not in data["plain"]
    assert data["article"].startswith("# Kettles") and "cookies" not in data["article"]
    assert data["sidebar"] == "" and "data_errors" not in record
    # body and body_again: one extraction; plain, article: one each
    assert sorted(calls) == ["markdown", "markdown", "text"]


def test_a_page_without_content_gives_null_fields_and_no_error():
    record = _read({"EXTRACT_RULES": json.dumps(RULES)}, NO_CONTENT_PAGE)
    assert record["data"]["body"] is None and record["data"]["plain"] is None
    assert "data_errors" not in record and record["error"] is None


def test_a_failed_extraction_nulls_its_field_and_keeps_the_others(monkeypatch):
    def broken(*_args, **_kwargs):
        raise ContentError("main content: RecursionError: too deep")

    monkeypatch.setattr(content, "extract_main", broken)
    record = _read({"EXTRACT_RULES": json.dumps(RULES)}, ARTICLE_PAGE)
    assert record["data"]["body"] is None and record["data"]["title"].startswith("Kettles")
    assert record["data_errors"]["body"] == "main content: RecursionError: too deep"


def test_a_matched_rule_carries_its_handler():
    extractor = Extractor(load_rules(json.dumps(
        RULES + [{"path": "^/shop/", "handler": "shop.listing-v2"}])))
    assert extractor.match(URL).handler == "guide"
    assert extractor.match("https://other.example/shop/kettles").handler == "shop.listing-v2"
    assert extractor.match("https://other.example/about") is None
