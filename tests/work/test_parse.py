"""Unit tests for common.work.parse: metadata, links, visible text and failure modes (charset
decoding and HTML sniffing are in test_charset.py)."""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urljoin

import pytest
import xxhash
from lxml import etree

from common.core.errors import FleetError
from common.work import links as link_rules
from common.work import parse
from common.work.page import measure_text
from common.work.parse import NotHTML, Page, parse_html, parse_tree

BASE = "https://example.com/dir/page.html"
UTF8 = "text/html; charset=utf-8"


#: Which parser page_of() asks for: lexbor (no hook: the default page) or libxml2 (a page
#: whose tree a hook reads). Every case below runs through both (parse_lexbor.py).
_PARSER = {"name": "lexbor"}


@pytest.fixture(autouse=True, params=["lexbor", "libxml2"])
def parser(request: pytest.FixtureRequest) -> str:
    _PARSER["name"] = request.param
    return request.param


def page_of(html: str, base_url: str = BASE, **kwargs: object) -> Page:
    if _PARSER["name"] == "libxml2" and "on_tree" not in kwargs:
        kwargs["on_tree"] = lambda _root, _base: None
    return parse_html(html.encode("utf-8"), base_url, UTF8, **kwargs)


def links_of(body_html: str, base_url: str = BASE) -> tuple[str, ...]:
    return page_of(f"<html><body>{body_html}</body></html>", base_url).links


# --- fields -----------------------------------------------------------------------------


def test_fields_of_a_normal_page_are_extracted() -> None:
    page = page_of(
        """<!DOCTYPE html>
        <html lang="en-GB">
        <head>
          <meta charset="utf-8">
          <title>
             Hello   World
          </title>
          <meta name="Description" content="  A page   about things. ">
          <link rel="stylesheet" href="/style.css">
          <link rel="canonical" href="/dir/canonical-page">
        </head>
        <body><h1>Heading</h1><p>Some <b>bold</b> text and <a href="other.html">a link</a>.</p>
        </body></html>"""
    )

    assert page.title == "Hello World"
    assert page.description == "A page about things."
    assert page.canonical == "https://example.com/dir/canonical-page"
    assert page.language == "en-GB"
    assert page.links == ("https://example.com/dir/other.html",)
    assert page.links_truncated is False
    assert page.encoding == "utf-8"
    assert page.text_length == len("Heading Some bold text and a link .")
    assert len(page.content_hash) == 32


def test_to_dict_is_json_serialisable_and_lists_the_links() -> None:
    page = page_of('<title>T</title><body><a href="/a">a</a></body>')

    as_dict = json.loads(json.dumps(page.to_dict()))

    assert as_dict["links"] == ["https://example.com/a"]
    assert as_dict["title"] == "T"
    assert set(as_dict) == {
        "title",
        "description",
        "canonical",
        "language",
        "links",
        "links_truncated",
        "text_length",
        "content_hash",
        "encoding",
        "canonical_truncated",
        "cut",
    }


def test_missing_metadata_comes_back_as_none() -> None:
    page = page_of("<html><body><p>just text</p></body></html>")

    assert (page.title, page.description, page.canonical, page.language) == (None,) * 4


def test_svg_title_in_the_body_is_not_taken_as_the_page_title() -> None:
    page = page_of("<body><svg><title>tooltip</title></svg><p>x</p></body>")

    assert page.title is None


def test_canonical_is_resolved_against_base_href_and_loses_its_fragment() -> None:
    page = page_of(
        '<head><base href="https://cdn.example.org/root/">'
        '<link rel="alternate CANONICAL" href="canon.html#top"></head><body></body>'
    )

    assert page.canonical == "https://cdn.example.org/root/canon.html"


def test_non_http_canonical_is_dropped() -> None:
    page = page_of('<head><link rel="canonical" href="javascript:void(0)"></head>')

    assert page.canonical is None
    assert page.canonical_truncated is False


def test_a_canonical_longer_than_a_url_may_be_is_dropped_and_flagged() -> None:
    longest = "/" + "c" * (link_rules.MAX_URL_CHARS - len("https://example.com/"))
    kept = page_of(f'<head><link rel="canonical" href="{longest}"></head>')
    too_long = page_of(f'<head><link rel="canonical" href="{longest}c"></head>')
    huge = page_of(f'<head><link rel="canonical" href="/{"c" * 1_000_000}"></head>')
    script = page_of(f'<head><link rel="canonical" href="javascript:{"c" * 5000}"></head>')

    assert kept.canonical == "https://example.com" + longest and not kept.canonical_truncated
    assert len(kept.canonical) == link_rules.MAX_URL_CHARS
    assert too_long.canonical is None and too_long.canonical_truncated is True
    assert huge.canonical is None and huge.canonical_truncated is True
    assert script.canonical is None and script.canonical_truncated is False  # not a URL


def test_language_comes_from_html_lang_before_meta_content_language() -> None:
    page = page_of(
        '<html lang="fr"><head><meta http-equiv="Content-Language" content="de">'
        "</head><body>x</body></html>"
    )

    assert page.language == "fr"


def test_language_falls_back_to_meta_content_language_when_html_lang_is_missing_or_empty() -> None:
    missing = page_of(
        '<html><head><meta http-equiv="content-language" content="de, en"></head></html>'
    )
    empty = page_of(
        '<html lang=" "><head><meta http-equiv="content-language" content="nl"></head></html>'
    )

    assert missing.language == "de"
    assert empty.language == "nl"


# --- links ------------------------------------------------------------------------------


def test_relative_absolute_and_protocol_relative_links_are_resolved() -> None:
    links = links_of(
        '<a href="https://other.org/x?q=1">abs</a>'
        '<a href="/root">root</a>'
        '<a href="sibling.html">sibling</a>'
        '<a href="../up">up</a>'
        '<a href="./here?x=1">here</a>'
        '<a href="//cdn.example.net/asset">proto</a>'
        '<a href="?page=2">query</a>'
        '<a href="HTTP://Upper.example/Path">upper scheme</a>'
    )

    assert links == (
        "https://other.org/x?q=1",
        "https://example.com/root",
        "https://example.com/dir/sibling.html",
        "https://example.com/up",
        "https://example.com/dir/here?x=1",
        "https://cdn.example.net/asset",
        "https://example.com/dir/page.html?page=2",
        "http://Upper.example/Path",
    )


def test_base_href_is_honoured_for_relative_links() -> None:
    page = page_of(
        '<head><base href="/other/dir/"></head>'
        '<body><a href="a.html">a</a><a href="/b">b</a><a href="https://x.org/">x</a></body>'
    )

    assert page.links == (
        "https://example.com/other/dir/a.html",
        "https://example.com/b",
        "https://x.org/",
    )


def test_base_href_that_is_not_http_is_ignored() -> None:
    page = page_of('<head><base href="javascript:alert(1)"></head><body><a href="a">a</a>')

    assert page.links == ("https://example.com/dir/a",)


def test_duplicate_links_are_kept_once_in_document_order() -> None:
    links = links_of(
        '<a href="/b">1</a><a href="/a">2</a><a href="/b">3</a>'
        '<a href="https://example.com/a">4</a><a href="/a#section">5</a>'
    )

    assert links == ("https://example.com/b", "https://example.com/a")


def test_fragments_are_dropped_and_fragment_only_links_point_at_the_page() -> None:
    links = links_of('<a href="/x#one">x</a><a href="#top">top</a>', base_url=BASE + "?q=1#frag")

    assert links == ("https://example.com/x", "https://example.com/dir/page.html?q=1")


@pytest.mark.parametrize(
    "href",
    [
        "javascript:void(0)",
        "JavaScript:alert(1)",
        " javascript:alert(1)",
        "mailto:someone@example.com",
        "tel:+441234567890",
        "data:text/html,<p>hi</p>",
        "ftp://files.example.com/x",
        "about:blank",
        "http:///no-host",
        "https://",
    ],
)
def test_non_http_schemes_and_hostless_urls_are_skipped(href: str) -> None:
    assert links_of(f'<a href="{href}">x</a>') == ()


def test_links_longer_than_2048_characters_are_skipped() -> None:
    long_path = "/" + "a" * link_rules.MAX_URL_CHARS
    links = links_of(f'<a href="{long_path}">long</a><a href="/short">short</a>')

    assert links == ("https://example.com/short",)


def test_surrounding_whitespace_and_inner_newlines_in_hrefs_are_removed_like_browsers_do() -> None:
    links = links_of('<a href="  /a/b\n/c\t ">x</a>')

    assert links == ("https://example.com/a/b/c",)


def test_malformed_ipv6_hosts_in_base_or_links_do_not_raise() -> None:
    page = parse_html(
        b'<base href="http://[::1/"><a href="http://[bad/../x">x</a><a href="/ok">ok</a>',
        "https://[broken/dir/",
        UTF8,
    )

    assert isinstance(page, Page)


def test_anchors_without_href_are_ignored() -> None:
    assert links_of('<a name="x">x</a><a>y</a>') == ()


def test_links_inside_noscript_are_kept_and_script_strings_are_not_links() -> None:
    links = links_of(
        '<noscript><a href="/no-js">x</a></noscript><script>var s=\'<a href="/js">\';</script>'
    )

    assert links == ("https://example.com/no-js",)


@pytest.mark.parametrize(
    "base_url",
    [
        "https://example.com/dir/page.html",
        "https://example.com",
        "http://example.com:8080/a/b/?q=1",
        "https://user@example.com/a/b/c.html#frag",
    ],
)
@pytest.mark.parametrize(
    "href",
    [
        "https://other.org/p",
        "http://other.org",
        "http://other.org/a/../b#f",
        "/abs",
        "/abs/../x",
        "/.well-known/x",
        "rel",
        "rel/deeper.html",
        "./dot",
        "../up",
        "../../../../way-up",
        "?q=2",
        "#frag",
        "",
        "//cdn.net/x",
        "//cdn.net",
        "page.html#f",
        "a/./b/../c",
        "http:relative",
        "https:relative",
        "..x",
        ".hidden",
        "x?y=/../z",
        "%2E%2E/encoded",
    ],
)
def test_fast_link_resolution_agrees_with_urljoin(base_url: str, href: str) -> None:
    joined = urljoin(base_url.partition("#")[0], href).partition("#")[0]
    # urljoin leaves 'http:relative' alone under an https base; that is not a fetchable URL.
    expected = joined if joined.startswith(("http://", "https://")) else None

    resolved = link_rules.resolve(href, link_rules.make_base(base_url))

    assert resolved == expected


@pytest.mark.parametrize(("href", "expected"), [
    ("HTTP://Other.org/p", "http://Other.org/p"),  # urljoin keeps an upper-case scheme
    ("https://", None),  # urljoin makes these the base, or a URL without a host
    ("http:///no-host", None),
    ("https://h.org#f", "https://h.org"),
])
def test_absolute_hrefs_get_a_lower_case_scheme_and_need_a_host(href: str,
                                                               expected: str | None) -> None:
    for base_url in ("https://example.com/dir/page.html", "http://example.com:8080/a/?q=1"):
        assert link_rules.resolve(href, link_rules.make_base(base_url)) == expected


def test_links_beyond_max_links_are_dropped_and_flagged() -> None:
    anchors = "".join(f'<a href="/p/{i}">{i}</a>' for i in range(50_000))
    body = f"<html><body>{anchors}</body></html>".encode()

    page = parse_html(body, BASE, UTF8)
    small = parse_html(body, BASE, UTF8, max_links=5)

    assert len(page.links) == 10_000
    assert page.links_truncated is True
    assert page.links[-1] == "https://example.com/p/9999"
    assert small.links == tuple(f"https://example.com/p/{i}" for i in range(5))


def test_exactly_max_links_unique_links_is_not_flagged_as_truncated() -> None:
    page = page_of('<a href="/a">1</a><a href="/b">2</a><a href="/a">dup</a>', max_links=2)

    assert page.links == ("https://example.com/a", "https://example.com/b")
    assert page.links_truncated is False


def test_negative_max_links_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_links"):
        page_of("<p>x</p>", max_links=-1)


# --- robustness -------------------------------------------------------------------------


def test_broken_html_with_unclosed_tags_is_still_parsed() -> None:
    page = page_of(
        "<html><head><title>Broken</title><body><div><p>first <b>bold <i>both"
        '<a href="/one">one<a href="/two">two<table><tr><td>cell</div></span>'
    )

    assert page.title is not None
    assert page.links == ("https://example.com/one", "https://example.com/two")
    assert page.text_length > 0


@pytest.mark.parametrize("body", [b"", b"   \n\t  ", b"<!-- only a comment -->"])
def test_empty_or_blank_body_gives_an_empty_page(body: bytes) -> None:
    page = parse_html(body, BASE, "text/html")

    assert page == Page(None, None, None, None, (), 0, parse.EMPTY_TEXT_HASH, "utf-8")


@pytest.mark.parametrize("seed", range(20))
def test_random_binary_bytes_raise_not_html_and_nothing_else(seed: int) -> None:
    body = random.Random(seed).randbytes(4096)

    with pytest.raises(NotHTML):
        parse_html(body, BASE, "text/html")


def test_png_served_as_html_raises_not_html_which_is_a_value_error() -> None:
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200)

    with pytest.raises(NotHTML) as caught:
        parse_html(png, BASE, "text/html")

    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, FleetError)
    assert caught.value.reason == "not_html"


def test_a_stray_control_byte_does_not_make_a_page_binary() -> None:
    page = parse_html(b"<title>ok\x0b</title><body>pasted\x1ftext</body>", BASE, UTF8)

    assert page.title is not None
    assert page.text_length > 0



def test_deeply_nested_markup_does_not_crash() -> None:
    page = parse_html(b"<div>" * 20_000 + b'<a href="/deep">x</a>', BASE, UTF8)

    assert isinstance(page, Page)


def test_parsing_from_several_threads_gives_the_same_page() -> None:
    body = "<title>t</title>" + "".join(f'<p><a href="/{i}">{i}</a></p>' for i in range(300))
    expected = parse_html(body.encode(), BASE, UTF8)

    with ThreadPoolExecutor(max_workers=4) as pool:
        pages = list(pool.map(lambda _: parse_html(body.encode(), BASE, UTF8), range(40)))

    assert all(page == expected for page in pages)


# --- visible text and hash --------------------------------------------------------------


def test_content_hash_is_equal_for_whitespace_only_differences() -> None:
    minified = page_of("<html><body><h1>Title</h1><p>One two three.</p><p>Four</p></body></html>")
    pretty = page_of(
        """<html>
          <body>
            <h1>
              Title
            </h1>
            <p>One    two
               three.</p>
            <p>Four</p>
          </body>
        </html>"""
    )

    assert pretty.content_hash == minified.content_hash
    assert pretty.text_length == minified.text_length == len("Title One two three. Four")


def test_content_hash_differs_for_different_text() -> None:
    before = page_of("<body><p>The price is 10 euros.</p></body>")
    after = page_of("<body><p>The price is 12 euros.</p></body>")

    assert before.content_hash != after.content_hash


def test_script_style_noscript_and_template_text_is_not_counted() -> None:
    plain = page_of("<body><p>visible words</p></body>")
    noisy = page_of(
        "<head><style>p { color: red }</style><script>var head = 1;</script></head>"
        "<body><script>var x = 'lots of invisible text';</script><p>visible words</p>"
        "<style>.a{}</style><noscript>enable js</noscript><template><p>later</p></template>"
        "</body>"
    )

    assert noisy.text_length == plain.text_length == len("visible words")
    assert noisy.content_hash == plain.content_hash


def test_title_changes_do_not_change_the_body_text_hash() -> None:
    first = page_of("<title>One</title><body><p>same</p></body>")
    second = page_of("<title>Two</title><body><p>same</p></body>")

    assert first.content_hash == second.content_hash


def test_text_adjacent_to_removed_script_keeps_its_tail() -> None:
    page = page_of("<body><p>before<script>x()</script>after</p></body>")

    assert page.text_length == len("before after")


def test_text_length_and_hash_match_the_collapsed_text_on_random_node_lists() -> None:
    # The length is counted without building the collapsed string (page.measure_text);
    # check it against building it, on seeded random runs of ASCII whitespace and
    # characters of one to four UTF-8 bytes (and a lone surrogate, as lxml can hand over).
    rng = random.Random(20261122)
    alphabet = [" ", "\t", "\n", "\r", "\f", "  ", "a", "bc", "é", "中", "\u00a0", "\U0001f600",
                "\ud800", "\x0b", "\u3000"]
    for _ in range(5000):
        nodes = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
                 for _ in range(rng.randint(0, 6))]
        text = " ".join(nodes)
        collapsed = re.sub(r"[ \t\n\r\f]+", " ", text).strip(" ")
        squeezed = re.sub(r"[ \t\n\r\f]+", "", text).encode("utf-8", "surrogatepass")
        digest = xxhash.xxh3_128_hexdigest(squeezed)
        assert measure_text(text) == (len(collapsed), digest), nodes


def test_parse_tree_gives_the_very_tree_and_base_that_parse_html_hands_to_its_hook():
    body = ('<html><head><base href="/docs/"><script>x()</script><style>p{}</style></head>'
            '<body><noscript><a href="n">n</a></noscript><p>café <a href="a">a</a></p>'
            '</body></html>').encode()
    seen = []
    parse_html(body, "https://s.test/x/y", "text/html; charset=utf-8",
               on_tree=lambda root, base: seen.append((etree.tostring(root), base)))
    root, base = parse_tree(body, "https://s.test/x/y", "text/html; charset=utf-8")
    assert (etree.tostring(root), base) == seen[0]
    assert base == "https://s.test/docs/" and b"<script" not in etree.tostring(root)
    assert parse_tree(b"   ", "https://s.test/") is None
