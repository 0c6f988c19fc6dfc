"""The HTML of the farm's pages: deterministic pages sized and linked like a typical site's.

Page ``n`` of a site always gives the same bytes (its random generator is seeded with the
site and page); links mix absolute, root-relative and relative forms, a few point to other farm
sites and some carry a fragment. :mod:`bench.farm` writes the pages and serves them.
"""

from __future__ import annotations

import html
import random
from dataclasses import dataclass

TARGET_PAGE_BYTES = 30_000
LINKS_PER_PAGE = 100
LANGS = ("en", "fr", "de", "es", "it")
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no "
    "crawler fleet queue broker worker redis rabbit page link site farm static nginx loopback "
    "café naïve résumé über straße déjà vu"
).split()



@dataclass(frozen=True)
class Site:
    """One farm site: pages at http://host:port/p/{n}.html."""

    index: int
    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def page_url(self, n: int) -> str:
        return f"{self.base_url}/p/{n}.html"


def page_html(site: Site, n: int, pages: int, sites: list[Site], pool: list[str]) -> str:
    """The HTML of page ``n`` of ``site``: deterministic, about TARGET_PAGE_BYTES bytes."""
    rng = random.Random(site.index * 1_000_003 + n)
    lang = LANGS[site.index % len(LANGS)]

    def href(i: int) -> str:
        m = rng.randint(1, pages)
        kind = i % 10
        if kind < 3:
            return site.page_url(m)
        if kind < 6:
            return f"/p/{m}.html"
        if kind < 8:
            return f"{m}.html"
        if kind == 8:
            other = sites[rng.randrange(len(sites))]
            return other.page_url(m)
        return f"/p/{m}.html#section-{i}"

    hrefs = [href(i) for i in range(LINKS_PER_PAGE)]
    title = f"Site {site.index} page {n}: {' '.join(rng.choice(_WORDS) for _ in range(5))}"
    parts = [
        f'<!DOCTYPE html>\n<html lang="{lang}">\n<head>\n<meta charset="utf-8">\n',
        f"<title>{html.escape(title)}</title>\n",
        f'<meta name="description" content="Page {n} of {pages} on farm site {site.index}.">\n',
        f'<link rel="canonical" href="{site.page_url(n)}">\n',
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        "<style>\n" + "body { margin: 0 auto; max-width: 60em }\n.n a { padding: 0 .5em }\n" * 12
        + "</style>\n",
        "<script>\n" + "window.dataLayer = window.dataLayer || []; dataLayer.push({p: 1});\n" * 8
        + "</script>\n",
        '</head>\n<body>\n<nav class="n"><ul>\n',
        *(f'<li><a href="{html.escape(h)}">Section {i}</a></li>\n'
          for i, h in enumerate(hrefs[:20])),
        f'</ul></nav>\n<main>\n<h1 id="top">{html.escape(title)}</h1>\n',
    ]
    for i, h in enumerate(hrefs[20:], start=20):
        text = pool[rng.randrange(len(pool))]
        cut = len(text) // 2
        parts.append(f'<p>{text[:cut]} <a href="{html.escape(h)}">link {i}</a> {text[cut:]}</p>\n')
    size = sum(len(p.encode()) for p in parts) + 120
    while size < TARGET_PAGE_BYTES:
        paragraph = f"<p>{pool[rng.randrange(len(pool))]}</p>\n"
        parts.append(paragraph)
        size += len(paragraph.encode())
    parts.append("</main>\n<footer><p>Static farm &copy; bench</p></footer>\n</body>\n</html>\n")
    return "".join(parts)


def paragraph_pool(count: int = 512, words: int = 30) -> list[str]:
    rng = random.Random(0)
    return [html.escape(" ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + ".")
            for _ in range(count)]
