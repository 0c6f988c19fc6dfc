"""Unit tests for common.work.parse: decoding, metadata, links, visible text and failure modes."""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urljoin

import pytest
from bs4.dammit import chardet_module

from common.core.errors import FleetError
from common.work import parse
from common.work.parse import NotHTML, Page, decode_html, is_html, parse_html

BASE = "https://example.com/dir/page.html"
UTF8 = "text/html; charset=utf-8"


def page_of(html: str, base_url: str = BASE, **kwargs: object) -> Page:
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
    assert len(page.content_hash) == 2 * parse.HASH_DIGEST_BYTES


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
    long_path = "/" + "a" * parse.MAX_URL_CHARS
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

    resolved = parse._resolve(href, parse._make_base(base_url))

    assert resolved == expected


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


# --- encodings --------------------------------------------------------------------------


def test_latin1_page_declared_only_in_meta_is_decoded_correctly() -> None:
    body = '<html><head><meta charset="iso-8859-1"><title>Café</title></head><body>café</body>'

    page = parse_html(body.encode("latin-1"), BASE, "text/html")

    assert page.title == "Café"
    # iso-8859-1 is decoded as its superset windows-1252, as the encoding spec says.
    assert page.encoding == "cp1252"
    assert decode_html(body.encode("latin-1"), None)[0] == body


def test_http_equiv_content_type_meta_is_honoured() -> None:
    body = (
        '<meta http-equiv="Content-Type" content="text/html; charset=windows-1251">'
        "<title>Привет</title>"
    )

    page = parse_html(body.encode("cp1251"), BASE, None)

    assert page.title == "Привет"
    assert page.encoding == "cp1251"


def test_utf8_page_without_any_declaration_is_decoded_as_utf8() -> None:
    body = "<html><head><title>café — 日本語</title></head><body>naïve</body></html>"

    text, encoding = decode_html(body.encode("utf-8"), None)

    assert (text, encoding) == (body, "utf-8")
    assert parse_html(body.encode("utf-8"), BASE).title == "café — 日本語"


def test_windows_1252_page_without_declaration_keeps_its_smart_quotes() -> None:
    body = "<html><body><p>He said “hello” – it’s a café.</p></body></html>"

    text, encoding = decode_html(body.encode("cp1252"), "text/html")

    assert text == body
    assert encoding == "cp1252"


def test_long_windows_1252_page_is_not_taken_for_another_latin_code_page() -> None:
    # Long enough for the detector to run; charset-normalizer alone says windows-1250 here,
    # which would turn 'naïvely' into 'naďvely'.
    body = "<html><body>" + "<p>He said “hello” – it’s naïvely “fine”.</p>\n" * 20 + "</body>"

    assert decode_html(body.encode("cp1252"), None) == (body, "cp1252")


def test_http_header_charset_wins_over_a_disagreeing_meta() -> None:
    body = '<meta charset="iso-8859-1"><title>café</title>'.encode()

    page = parse_html(body, BASE, "text/html; charset=UTF-8")

    assert page.title == "café"
    assert page.encoding == "utf-8"


def test_byte_order_mark_wins_over_the_http_header() -> None:
    body = "\ufeff<title>café</title>".encode()

    page = parse_html(body, BASE, "text/html; charset=iso-8859-1")

    assert page.title == "café"
    assert page.encoding == "utf-8"


def test_utf16_page_with_a_bom_is_decoded_and_not_mistaken_for_binary() -> None:
    body = "<html><head><title>café</title></head><body>x</body></html>".encode("utf-16")

    page = parse_html(body, BASE, "text/html")

    assert page.title == "café"
    assert page.encoding.startswith("utf-16")


def test_header_charset_that_cannot_decode_the_bytes_gives_way_to_meta() -> None:
    # Deliberately not the spec (which would show U+FFFD): a wrong header is the likelier bug.
    body = '<meta charset="windows-1252"><title>café</title>'.encode("cp1252")

    assert decode_html(body, "text/html; charset=utf-8") == (body.decode("cp1252"), "cp1252")


def test_utf8_page_with_one_bad_byte_keeps_its_other_accents() -> None:
    body = "<p>café naïve résumé</p>".encode() + b"<p>stray \xe9 byte</p>"

    text, encoding = decode_html(body, None)

    assert encoding == "utf-8"
    assert text == "<p>café naïve résumé</p><p>stray \ufffd byte</p>"


def test_meta_claiming_utf16_is_read_as_utf8() -> None:
    body = '<meta charset="utf-16"><title>café</title>'.encode()

    assert decode_html(body, None) == (body.decode(), "utf-8")


@pytest.mark.parametrize("label", ["utf-7", "base64", "unicode_escape", "no-such-charset"])
def test_dangerous_or_unknown_charset_labels_are_ignored(label: str) -> None:
    body = '<meta charset="utf-8"><title>caf\\xe9 é</title>'.encode()

    assert decode_html(body, f"text/html; charset={label}") == (body.decode(), "utf-8")


def test_xhtml_with_an_xml_declaration_is_decoded_by_it() -> None:
    body = '<?xml version="1.0" encoding="ISO-8859-1"?><html><title>café</title></html>'

    page = parse_html(body.encode("latin-1"), BASE, "application/xhtml+xml")

    assert page.title == "café"


def test_utf8_header_with_clean_bytes_skips_the_meta_scan_and_detection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("slow path used for a clean UTF-8 page")

    monkeypatch.setattr(parse.EncodingDetector, "find_declared_encoding", must_not_run)
    monkeypatch.setattr(parse, "_detect", must_not_run)

    assert decode_html("<p>café</p>".encode(), UTF8) == ("<p>café</p>", "utf-8")


@pytest.mark.skipif(chardet_module is None, reason="no charset detector installed")
def test_cyrillic_page_without_declaration_is_detected() -> None:
    body = (
        "<html><body><p>Привет! Это тестовая страница на русском языке, "
        "чтобы проверить определение кодировки без объявления.</p></body></html>"
    )

    assert decode_html(body.encode("cp1251"), None) == (body, "cp1251")


def test_empty_body_decodes_to_empty_text() -> None:
    assert decode_html(b"", None) == ("", "utf-8")


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


def test_decode_html_never_raises_on_binary_bytes() -> None:
    text, encoding = decode_html(random.Random(7).randbytes(4096), None)

    assert isinstance(text, str)
    assert encoding


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


# --- is_html ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/html", "TEXT/HTML; charset=utf-8", "application/xhtml+xml", " text/html ;q=1"],
)
def test_declared_html_types_are_html_whatever_the_body(content_type: str) -> None:
    assert is_html(content_type, b"not markup at all") is True


@pytest.mark.parametrize(
    "content_type", ["application/json", "image/png", "text/plain", "application/octet-stream"]
)
def test_other_declared_types_are_not_html_even_if_the_body_looks_like_it(
    content_type: str,
) -> None:
    assert is_html(content_type, b"<!DOCTYPE html><html>") is False


@pytest.mark.parametrize(
    "head",
    [
        b"<!DOCTYPE html>\n<html>",
        b"\n\n   <!doctype HTML PUBLIC>",
        b"<html lang='en'>",
        b"<HTML>",
        b"<html\n  lang=en>",
        b"<head>",
        b"<body class=x>",
        b"<p>hi",
        b"<b>bold",
        b"<!-- generated -->",
        b"\xef\xbb\xbf<html>",
    ],
)
def test_html_is_sniffed_when_the_type_is_missing_or_unknown(head: bytes) -> None:
    assert is_html(None, head) is True
    assert is_html("", head) is True
    assert is_html("*/*", head) is True


@pytest.mark.parametrize(
    "head",
    [b"", b"plain text", b"<?xml version='1.0'?><feed>", b"<bodyguard>", b"\x89PNG\r\n", b"{}"],
)
def test_non_html_is_not_sniffed_as_html(head: bytes) -> None:
    assert is_html(None, head) is False


def test_text_length_matches_the_collapsed_text_on_random_node_lists() -> None:
    # The length is counted without building the collapsed string (parse._measure_text);
    # check it against building it, on seeded random runs of ASCII whitespace and
    # multi-byte characters.
    rng = random.Random(20261122)
    alphabet = [" ", "\t", "\n", "\r", "\f", "  ", "a", "bc", "é", "中", "\u00a0"]
    for _ in range(5000):
        nodes = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
                 for _ in range(rng.randint(0, 6))]
        collapsed = re.sub(r"[ \t\n\r\f]+", " ", " ".join(nodes)).strip(" ")
        assert parse._measure_text(nodes)[0] == len(collapsed), nodes
