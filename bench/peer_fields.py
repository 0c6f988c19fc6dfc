"""What both peers (bench/peer_spider.py, scrapy-redis; bench/crawlee_peer.py, Crawlee) record
per page, written once on parsel's Selector, which Scrapy and Crawlee's ParselCrawler share:
the fleet's record (title, description, canonical, language, absolute de-duplicated links
without fragments, links_count, text_length) and, for the extract phase, the fields the fleet's
rules extract (bench/extract_rounds.py's FARM_RULES), read the way a user of either writes
them. Bench venv only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from parsel import Selector

# Text nodes under <body>, outside script/style/noscript/template, as the fleet counts them.
TEXT_XPATH = ("//body//text()[not(ancestor::script) and not(ancestor::style) "
              "and not(ancestor::noscript) and not(ancestor::template)]")

UrlJoin = Callable[[str], str]


def page_record(sel: Selector, url: str, status: int, urljoin: UrlJoin,
                extract: bool) -> dict[str, Any]:
    links: list[str] = []
    seen: set[str] = set()
    for href in sel.xpath("//a/@href").getall():
        link = urljoin(href.strip()).partition("#")[0]
        if link.startswith(("http://", "https://")) and link not in seen:
            seen.add(link)
            links.append(link)
    text = " ".join(" ".join(sel.xpath(TEXT_XPATH).getall()).split())
    return {
        "url": url,
        "status": status,
        "title": (sel.xpath("//title/text()").get() or "").strip() or None,
        "description": sel.xpath("//meta[@name='description']/@content").get(),
        "canonical": sel.xpath("//link[@rel='canonical']/@href").get(),
        "language": sel.xpath("/html/@lang").get(),
        "links": links,
        "links_count": len(links),
        "text_length": len(text),
        **({"data": farm_data(sel, urljoin)} if extract else {}),
    }


def farm_data(sel: Selector, urljoin: UrlJoin) -> dict[str, Any]:
    """Five fields and one list of items, numbers converted, URLs made absolute."""
    description = sel.css("meta[name=description]::attr(content)").get()
    canonical = sel.css("link[rel=canonical]::attr(href)").get()
    return {
        "heading": _text(sel.css("h1 ::text").getall()),
        "lang": sel.xpath("/html/@lang").get(),
        "page": _int(description, r"Page (\d+) of"),
        "site": _int(description, r"farm site (\d+)"),
        "canonical": _url(urljoin, canonical),
        "sections": [{"label": _text(li.css("a ::text").getall()),
                      "href": _url(urljoin, li.css("a::attr(href)").get())}
                     for li in sel.css("nav.n li")],
    }


def _int(text: str | None, pattern: str) -> int | None:
    found = re.search(pattern, text or "")
    return int(found.group(1)) if found else None


def _text(parts: list[str]) -> str | None:
    return " ".join("".join(parts).split()) or None


def _url(urljoin: UrlJoin, href: str | None) -> str | None:
    return urljoin(href.strip()).partition("#")[0] if href else None
