"""Scrape a news site from its sitemap: articles by a rule, section pages by default.

Seeded with ``scrape-fleet sitemap http://SITE/``: robots.txt names the sitemap index, whose
article sitemaps list every article (with ``lastmod``; ``--since`` keeps the newer ones).
The rules file (examples/news/rules.yml, EXTRACT_RULES) sends article pages to ``article`` and
reads headline, author and date declaratively; the handler adds the body as plain text
(``page.main_text``: no menus, related links or newsletter box) and follows the related
articles, which the fleet drops as already seen when the sitemap had them.

Run it: examples/news/README.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scrape_fleet import Page, Request, Router

router = Router()


@router.handler("article")
def article(page: Page) -> Iterator[Request | dict[str, Any]]:
    """An article page (the rules file's ``handler: article``)."""
    fields = page.data or {}
    yield {
        "kind": "article",
        "url": page.url,
        "headline": fields.get("headline"),
        "author": fields.get("author"),
        "published": fields.get("published"),
        "body": page.main_text,
    }
    yield page.follow(page.css("aside.related a::attr(href)").getall())


@router.default
def section(page: Page) -> dict[str, Any]:
    """Any other page the sitemap lists: a section front with its article links."""
    return {"kind": "section", "url": page.url, "name": page.css("h1::text").get(),
            "articles": len(page.css("ul.articles a"))}
