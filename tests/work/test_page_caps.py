"""What a page builds is capped (common/work/parse.py bound_body, MAX_PAGE_TAGS): a page over
a cap is parsed up to the cap and says so, and its cost stays bounded."""

from __future__ import annotations

import subprocess
import sys
import time

from common.work import parse
from common.work.parse import bound_body, parse_html

BASE = "https://example.com/p/1.html"


def test_a_page_under_the_tag_cap_is_parsed_whole_and_not_marked() -> None:
    body = b"<html><body>" + b"<p>a</p>" * 100 + b"<a href=/x>x</a></body></html>"
    page = parse_html(body, BASE, max_tags=1_000)
    assert page.cut is None
    assert page.links == ("https://example.com/x",)


def test_a_page_over_the_tag_cap_is_cut_at_the_cap_and_says_tags() -> None:
    body = (b"<html><body><a href=/first>1</a>" + b"<p>a" * 5_000
            + b"<a href=/after-the-cap>2</a></body></html>")
    page = parse_html(body, BASE, max_tags=1_000)
    assert page.cut == "tags"
    assert page.links == ("https://example.com/first",)
    cut, why = bound_body(body, 1_000)
    assert why == "tags"
    assert cut.count(b"<") == 1_000
    assert body.startswith(cut) and body[len(cut):len(cut) + 1] == b"<"


def test_exactly_the_cap_is_not_a_cut() -> None:
    body = b"<p>" * 10
    assert bound_body(body, 10) == (body, None)
    assert bound_body(body, 9)[1] == "tags"


def test_an_attribute_flood_in_one_long_tag_is_cut_before_the_tag() -> None:
    flood = b"<p " + b" ".join(b"a%d" % i for i in range(60_000)) + b">"
    body = b"<html><body><a href=/kept>k</a>" + b"x" * parse.LONG_TAG_SCAN_BYTES + flood
    started = time.process_time()
    page = parse_html(body, BASE)
    assert time.process_time() - started < 2  # uncut: libxml2 needs minutes for 60,000
    assert page.cut == "long_tag"
    assert page.links == ("https://example.com/kept",)


def test_a_long_data_uri_is_not_mistaken_for_an_attribute_flood() -> None:
    image = b"<img src='data:image/png;base64," + b"QUJD" * 20_000 + b"'>"
    body = b"<html><body>" + image + b"<a href=/after>a</a>" + b" " * 40_000 + b"</body></html>"
    page = parse_html(body, BASE)
    assert page.cut is None
    assert page.links == ("https://example.com/after",)


def test_ten_mib_of_tiny_elements_parse_under_a_tenth_of_the_memory_they_took_uncapped() -> None:
    # Uncapped, this body built 5 million nodes and took the process from 67 to 877 MB.
    code = (
        "import resource, sys\n"
        "from common.work.parse import parse_html\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "body = b'<html><body>' + b'<p>a' * (10 * 1024 * 1024 // 4)\n"
        "page = parse_html(body, 'https://example.com/', max_tags=100_000)\n"
        "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(page.cut, grew // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out[0] == "tags"
    assert int(out[1]) < 80, f"parsing grew the process by {out[1]} MB"
