"""Crawl a documentation site and keep each page as Markdown.

One handler for every page: it follows every link it finds and records the page's title,
section, headings and main content as Markdown (``page.markdown``: the sidebar, footer and
cookie banner left out). The fleet decides which links are crawled: only those on the page's
own host (CRAWL_ALLOWED_DOMAINS is empty), each URL once, within CRAWL_MAX_DEPTH.

Run it: examples/docs/README.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from scrape_fleet import Page, Request, Router

router = Router()


@router.default
def doc_page(page: Page) -> Iterator[Request | dict[str, Any]]:
    """Any page of the site: follow its links, record its content."""
    # Sidebar, prev/next, links in the text and off-site links alike: the fleet's scope and
    # dedupe keep what belongs to this crawl.
    yield page.follow(page.css("a::attr(href)").getall())
    parts = urlsplit(page.url).path.strip("/").split("/")  # docs/SECTION/PAGE.html
    yield {
        "url": page.url,
        "title": page.css("main h1::text").get(),
        "section": parts[1] if len(parts) == 3 else None,
        "headings": page.css("main h2::text").getall(),
        "markdown": page.markdown,
    }
