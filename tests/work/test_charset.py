"""Unit tests for common.work.charset: sniffing HTML, the order of trust between charsets,
label quirks, detection and fallbacks."""

from __future__ import annotations

import random

import pytest
from bs4.dammit import chardet_module

from common.work import charset, parse
from common.work.charset import decode_html, is_html
from common.work.parse import parse_html

BASE = "https://example.com/dir/page.html"
UTF8 = "text/html; charset=utf-8"


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

    # bs4's detector (the BOM check, the <meta> prescan and the guess) is not even imported.
    monkeypatch.setattr(charset, "_detector", must_not_run)

    assert decode_html("<p>café</p>".encode(), UTF8) == ("<p>café</p>", "utf-8")


def test_every_byte_order_mark_bs4_finds_starts_with_a_byte_the_bom_check_looks_for() -> None:
    # Bodies not starting with one of those bytes skip bs4's BOM check: they must have no BOM.
    detector = charset._detector()
    tails = [bytes([a, b, c]) for a in b"\x00\xfe\xff\xef\xbb\xbfA" for b in b"\x00\xfe\xff\xbfA"
             for c in b"\x00\xfe\xffA"]
    starts = {first for first in range(256) for tail in tails
              if detector.strip_byte_order_mark(bytes([first]) + tail)[1] is not None}

    assert {bytes([first]) for first in starts} == charset._BOM_FIRST_BYTES


@pytest.mark.skipif(chardet_module is None, reason="no charset detector installed")
def test_cyrillic_page_without_declaration_is_detected() -> None:
    body = (
        "<html><body><p>Привет! Это тестовая страница на русском языке, "
        "чтобы проверить определение кодировки без объявления.</p></body></html>"
    )

    assert decode_html(body.encode("cp1251"), None) == (body, "cp1251")


def test_empty_body_decodes_to_empty_text() -> None:
    assert decode_html(b"", None) == ("", "utf-8")


def test_decode_html_never_raises_on_binary_bytes() -> None:
    text, encoding = decode_html(random.Random(7).randbytes(4096), None)

    assert isinstance(text, str)
    assert encoding


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


def test_is_html_is_still_importable_from_parse() -> None:
    # common/work/processor.py imports it from there.
    assert parse.is_html is is_html
