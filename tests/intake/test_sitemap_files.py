"""Sitemap files alone: formats told by content, caps, hostile input, dates (no services).

The same files end to end, fetched from a loopback site and submitted to the Producer, are in
tests/intake/test_sitemaps.py.
"""

from __future__ import annotations

import gzip
import resource

import pytest

from common.intake import sitemap_files
from common.intake.sitemap_files import (
    MAX_TEXT_LINE_BYTES,
    MAX_URLS_PER_SITEMAP,
    SitemapError,
    parse_date,
    parse_sitemap,
)
from tests.intake.sitemap_bodies import MB, NS, billion_laughs, gzip_bomb, index, urlset

BASE = "http://127.0.0.1:9/maps/sitemap.xml"

# -- formats ----------------------------------------------------------------------------------

RSS = ('<rss version="2.0"><channel><title>T</title><item><link>http://127.0.0.1:9/r/1</link>'
       '</item></channel></rss>')
RDF = ('<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" '
       'xmlns="http://purl.org/rss/1.0/"><channel rdf:about="http://127.0.0.1:9/"/>'
       '<item rdf:about="http://127.0.0.1:9/r/1"><title>1</title></item></rdf:RDF>')
ATOM = ('<feed xmlns="http://www.w3.org/2005/Atom"><entry><link href="/r/1"/></entry></feed>')


@pytest.mark.parametrize(("body", "kind"), [
    (urlset("http://127.0.0.1:9/r/1"), "urlset"),
    (b"\xef\xbb\xbf" + urlset("http://127.0.0.1:9/r/1"), "urlset"),
    (urlset("http://127.0.0.1:9/r/1").decode().encode("utf-16"), "urlset"),
    (gzip.compress(urlset("http://127.0.0.1:9/r/1")), "urlset"),
    (RSS.encode(), "rss"),
    (RDF.encode(), "rss"),
    (ATOM.encode(), "atom"),
    (b"http://127.0.0.1:9/r/1\n", "text"),
    (b"\n\r\n\xef\xbb\xbfhttp://127.0.0.1:9/r/1", "text"),
    (gzip.compress(b"http://127.0.0.1:9/r/1"), "text"),
], ids=["urlset", "utf-8-bom", "utf-16", "gzip", "rss2", "rss1", "atom", "text",
        "text-after-blank-lines", "gzip-text"])
def test_the_format_is_told_by_content_and_gives_the_page(body, kind):
    sitemap = parse_sitemap(body, BASE)

    assert (sitemap.kind, [e.url for e in sitemap.pages]) == (kind, ["http://127.0.0.1:9/r/1"])
    assert sitemap.children == [] and not sitemap.truncated


def test_an_index_gives_children_with_dates_and_relative_links_resolved():
    sitemap = parse_sitemap(index(("/a.xml", "2024-05-01"), "b.xml"), BASE)

    assert sitemap.kind == "index" and sitemap.pages == []
    assert [(c.url, c.lastmod and c.lastmod.isoformat()) for c in sitemap.children] == [
        ("http://127.0.0.1:9/a.xml", "2024-05-01T00:00:00+00:00"),
        ("http://127.0.0.1:9/maps/b.xml", None)]


def test_gzip_members_in_a_row_and_trailing_zero_padding_make_one_file():
    body = (gzip.compress(b"http://127.0.0.1:9/a\n") + gzip.compress(b"http://127.0.0.1:9/b\n")
            + b"\0" * 512)

    assert [e.url for e in parse_sitemap(body, BASE).pages] == [
        "http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]


def test_text_lines_too_long_or_not_urls_are_skipped_and_counted():
    long_line = b"http://127.0.0.1:9/" + b"x" * (MAX_TEXT_LINE_BYTES + 1024 * 1024)
    body = b"\n".join([b"http://127.0.0.1:9/a", long_line, b"mailto:x@example.org",
                       b"http://127.0.0.1:9/b"])

    sitemap = parse_sitemap(body, BASE)

    assert [e.url for e in sitemap.pages] == ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"]
    assert sitemap.skipped == 2


@pytest.mark.parametrize(("body", "message"), [
    (b"   \n", "empty sitemap"),
    (b"<html><body>404</body></html>", "not a sitemap or feed"),
    (urlset("http://127.0.0.1:9/a")[:-20], "malformed XML"),
    (b"not a url\nnor this\n", "not a sitemap: neither XML nor lines"),
    (gzip.compress(urlset("http://127.0.0.1:9/a"))[:-12], "gzip data ends early"),
    (b"\x1f\x8bnot gzip at all", "not valid gzip data"),
], ids=["empty", "html", "truncated-xml", "prose", "truncated-gzip", "bad-gzip"])
def test_what_is_no_sitemap_is_an_error(body, message):
    with pytest.raises(SitemapError, match=message):
        parse_sitemap(body, BASE)


# -- caps and hostile input -------------------------------------------------------------------


@pytest.mark.parametrize(("levels", "padding", "message"), [
    (10, 0, "DOCTYPE declares entities"),
    # Past the byte pre-check, libxml2's own amplification limit stops the full bomb ...
    (10, 3 * MB, "entity amplification"),
    # ... and a small one, under that limit, is refused by the check on the parsed DTD.
    (3, 3 * MB, "DOCTYPE declares entities"),
], ids=["doctype-first", "doctype-after-3mb", "small-doctype-after-3mb"])
def test_billion_laughs_is_refused_without_expanding(levels, padding, message):
    doc = billion_laughs(levels)
    if padding:
        doc = doc.replace(b"?>\n", b"?>\n" + b" " * padding, 1)
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    with pytest.raises(SitemapError, match=message) as caught:
        parse_sitemap(doc, "http://127.0.0.1:9/sitemap.xml")

    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
    assert grown_mb < 64, f"peak memory grew by {grown_mb:.0f} MB: entities were expanded?"
    assert "lollol" not in str(caught.value)


def test_an_external_dtd_is_never_loaded_so_its_entities_stay_unexpanded():
    doc = (f'<?xml version="1.0"?><!DOCTYPE urlset SYSTEM "http://127.0.0.1:9/evil.dtd">'
           f'<urlset xmlns="{NS}"><url><loc>http://127.0.0.1:9/x</loc></url></urlset>')

    assert [e.url for e in parse_sitemap(doc.encode(), BASE).pages] == ["http://127.0.0.1:9/x"]


@pytest.mark.parametrize("xml", [False, True], ids=["zeros", "xml"])
def test_a_gzip_bomb_is_refused_at_50_mb(xml):
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    with pytest.raises(SitemapError, match="the protocol's 50 MB limit"):
        parse_sitemap(gzip_bomb(60, xml=xml), BASE)

    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
    assert grown_mb < 40, f"peak memory grew by {grown_mb:.0f} MB: the bomb was held?"


@pytest.mark.parametrize("kind", ["xml", "text"])
def test_one_file_gives_at_most_50000_urls(kind):
    urls = [f"http://127.0.0.1:9/u/{i}" for i in range(MAX_URLS_PER_SITEMAP + 5)]
    body = urlset(*urls) if kind == "xml" else "\n".join(urls).encode()

    sitemap = parse_sitemap(body, "http://127.0.0.1:9/sitemap")

    assert len(sitemap.pages) == MAX_URLS_PER_SITEMAP and sitemap.truncated
    assert sitemap.pages[-1].url == urls[MAX_URLS_PER_SITEMAP - 1]


def test_a_flood_of_tiny_elements_is_refused_at_the_element_cap(monkeypatch):
    monkeypatch.setattr(sitemap_files, "MAX_XML_ELEMENTS", 10_000)
    body = urlset("http://127.0.0.1:9/a").replace(b"</url>", b"<x>" + b"<a/>" * 20_000
                                                   + b"</x></url>")

    with pytest.raises(SitemapError, match="more than 10000 XML elements"):
        parse_sitemap(body, "http://127.0.0.1:9/sitemap.xml")


def test_a_file_of_countless_empty_gzip_members_is_refused():
    with pytest.raises(SitemapError, match="gzip members"):
        parse_sitemap(gzip.compress(b"") * 1_000_000, "http://127.0.0.1:9/sitemap.xml.gz")


# -- dates ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [
    ("2024", "2024-01-01T00:00:00+00:00"),
    ("2024-05", "2024-05-01T00:00:00+00:00"),
    ("2024-05-02", "2024-05-02T00:00:00+00:00"),
    ("2024-05-02T10:30Z", "2024-05-02T10:30:00+00:00"),
    ("2024-05-02T10:30:15.5+02:00", "2024-05-02T10:30:15.500000+02:00"),
    ("Thu, 02 May 2024 10:30:00 GMT", "2024-05-02T10:30:00+00:00"),
    ("2024-13", None),
    ("soon", None),
    ("", None),
    (None, None),
])
def test_sitemap_and_feed_dates_are_read_as_aware_datetimes(raw, expected):
    value = parse_date(raw)

    assert (value.isoformat() if value else None) == expected
