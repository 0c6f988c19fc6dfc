"""Measure the cost of :func:`common.work.parse.parse_html` on a typical page.

Builds a ~30 KB UTF-8 page with ~100 links (absolute, root-relative, dot-relative,
protocol-relative, fragments, mailto:/javascript:, duplicates) plus inline script and style,
then prints mean microseconds per call over ``--iterations`` calls, next to BeautifulSoup
with the lxml tree builder doing only title + link extraction.

Run from the repository root: ``python -m bench.parse_cost`` or ``python bench/parse_cost.py``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urljoin

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bs4 import BeautifulSoup  # noqa: E402

from common.work.parse import parse_html  # noqa: E402

BASE_URL = "https://example.com/articles/2024/some-page.html?ref=home"
CONTENT_TYPE = "text/html; charset=utf-8"
TARGET_PAGE_BYTES = 30_000
LINK_COUNT = 100
_WORDS = (
    "the quick brown fox jumps over lazy dog scraping fleet worker queue redis rabbit "
    "message page link text content café naïve résumé"
).split()


def make_page(seed: int = 1) -> bytes:
    """Return a ~30 KB UTF-8 HTML page with ``LINK_COUNT`` links of mixed shapes."""
    rng = random.Random(seed)

    def words(count: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(count))

    shapes = (
        "https://other{i}.example.org/path/{i}?q={i}",
        "/section/{i}",
        "../up/{i}.html",
        "page{i}.html#frag",
        "//cdn.example.net/asset/{i}",
        "#top",
        "mailto:someone{i}@example.com",
        "/section/{j}",  # duplicate of an earlier root-relative link
        "https://example.com/articles/{i}",
        "javascript:void(0)",
    )
    hrefs = [shapes[i % len(shapes)].format(i=i, j=i - 6) for i in range(LINK_COUNT)]
    parts = [
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
        "<title>Example page title</title>\n",
        '<meta name="description" content="A page about things.">\n',
        '<link rel="canonical" href="/articles/example">\n',
        *(f'<meta property="og:x{i}" content="v{i}">\n' for i in range(8)),
        "<style>\n" + "body { margin: 0; padding: 0 }\n.c { color: red }\n" * 40 + "</style>\n",
        "<script>\n" + "var x = 1; function f(a) { return a + 1 }\n" * 40 + "</script>\n",
        "</head>\n<body>\n<nav><ul>\n",
        *(f'  <li><a href="{href}">Link {i}</a></li>\n' for i, href in enumerate(hrefs[:30])),
        "</ul></nav>\n<main>\n",
    ]
    for href in hrefs[30:]:
        parts.append(f'<p>{words(25)} <a href="{href}">{words(3)}</a> {words(20)}</p>\n')
    size = sum(len(part.encode()) for part in parts)
    while size < TARGET_PAGE_BYTES - 200:
        paragraph = f"<p>\n  {words(40)}\n</p>\n"
        parts.append(paragraph)
        size += len(paragraph.encode())
    parts.append("</main>\n<footer>Footer &copy; 2024</footer>\n<script>track();</script>\n")
    parts.append("</body>\n</html>\n")
    return "".join(parts).encode()


def soup_title_and_links(body: bytes) -> tuple[str | None, list[str]]:
    """The BeautifulSoup baseline: title plus resolved, de-duplicated http(s) links."""
    soup = BeautifulSoup(body, "lxml")
    title = soup.title.get_text(" ", strip=True) if soup.title else None
    seen: set[str] = set()
    links: list[str] = []
    for anchor in soup.find_all("a", href=True):
        url = urljoin(BASE_URL, anchor["href"].strip()).partition("#")[0]
        if url.startswith(("http://", "https://")) and url not in seen:
            seen.add(url)
            links.append(url)
    return title, links


def mean_us(call: Callable[[], object], iterations: int) -> float:
    """Mean wall-clock microseconds per call, after a short warm-up."""
    for _ in range(min(50, iterations)):
        call()
    start_ns = time.perf_counter_ns()
    for _ in range(iterations):
        call()
    return (time.perf_counter_ns() - start_ns) / iterations / 1_000


def _no_hook(_root: object, _base: str) -> None:
    """A tree hook that reads nothing: the page a rule or handler reads goes to libxml2."""


def main(argv: list[str] | None = None) -> None:
    """Print the page's shape and the mean cost of each parser."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--soup-iterations", type=int, default=None, help="default: same")
    args = parser.parse_args(argv)

    body = make_page()
    page = parse_html(body, BASE_URL, CONTENT_TYPE)
    _, soup_links = soup_title_and_links(body)
    print(
        f"page: {len(body)} bytes, {body.count(b'<a ')} <a> tags, {len(page.links)} unique "
        f"http(s) links, {page.text_length} chars of visible text"
    )
    if sorted(soup_links) != sorted(page.links):
        print("warning: parse_html and the BeautifulSoup baseline disagree on links")

    parse_us = mean_us(lambda: parse_html(body, BASE_URL, CONTENT_TYPE), args.iterations)
    print(f"parse_html (all fields, lexbor):       {parse_us:8.1f} us/call")
    tree_us = mean_us(lambda: parse_html(body, BASE_URL, CONTENT_TYPE, on_tree=_no_hook),
                      args.iterations)
    print(f"parse_html with a tree hook (libxml2): {tree_us:8.1f} us/call")
    soup_iterations = args.soup_iterations or args.iterations
    soup_us = mean_us(lambda: soup_title_and_links(body), soup_iterations)
    print(f"BeautifulSoup(lxml) title + links:     {soup_us:8.1f} us/call")
    print(f"ratio: {soup_us / parse_us:.1f}x")


if __name__ == "__main__":
    main()
