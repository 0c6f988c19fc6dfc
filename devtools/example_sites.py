"""The three sites the examples in ``examples/`` crawl, served on loopback with deterministic
content (the tests compare what the fleet extracted against the tables here).

    .venv/bin/python -m devtools.example_sites docs [--port 8001]   # prints the base URL
    .venv/bin/python -m devtools.example_sites shop [--port 8002]
    .venv/bin/python -m devtools.example_sites news [--port 8003]

In code, :func:`example_site` gives a :class:`~devtools.testsite.TestSite` (the loopback test
site's server and request log) with the example's routes; use it as a context manager::

    with example_site("shop") as site:
        seed(site.url("/catalog?page=1"))

``docs``: a documentation site. ``/`` and 20 pages ``/docs/SECTION/SLUG.html`` in three
sections (:data:`DOCS`), each with a sidebar listing every page, an ``<h1>`` title, ``<h2>``
headings, body text, prev/next links, a footer and a cookie banner, and links to another host
(``localhost`` on the same port: a different host for the fleet's scope, one the request log
still sees) that a crawl must not follow.

``shop``: a paged shop. ``/catalog?page=1..3`` (10 products each, a "featured" product on
every page, a next link, cart and account links) and 30 product pages ``/p/SLUG``
(:data:`PRODUCTS`): name, SKU, price in one of several formats, three without a price, three
out of stock. ``/robots.txt`` disallows ``/cart`` and ``/account/``.

``news``: a news site read from its sitemap. ``/robots.txt`` names ``/sitemap.xml``, a sitemap
index of two article sitemaps (October and November, with ``lastmod``) and one of the three
section pages; 15 articles ``/articles/YYYY/MM/SLUG.html`` (:data:`ARTICLES`) with headline,
author, date, body and related links; ``/section/NAME`` pages list their articles.
"""

from __future__ import annotations

import argparse
import html
import logging
import math
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from devtools.testsite import RequestRecord, Response, TestSite

logger = logging.getLogger(__name__)

__all__ = ["ARTICLES", "DOCS", "PRODUCTS", "SITES", "article_html", "catalog_html", "doc_html",
           "example_site", "product_html"]

_HTML = {"Content-Type": "text/html; charset=utf-8"}
_XML = {"Content-Type": "application/xml; charset=utf-8"}
_TEXT = {"Content-Type": "text/plain; charset=utf-8"}

_WORDS = ("crawler queue worker broker message page link handler item pipeline host scope "
          "retry limit result stream sink setting command section record fetch parse index "
          "sitemap robots header status delay budget domain depth label request response "
          "selector markdown text title heading price product article author").split()


def _prose(seed: int, sentences: int = 3) -> str:
    """Deterministic filler: ``sentences`` sentences of 9 to 15 words, different per seed."""
    rng = random.Random(seed)
    return " ".join(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(9, 15))).capitalize()
                    + "." for _ in range(sentences))


def _page(title: str, body: str) -> bytes:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
            ).encode()


def _not_found() -> Response:
    return 404, _HTML, _page("Not found", "<h1>Not found</h1>")


# -- docs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DocPage:
    """One documentation page: its section, slug, title and the ``<h2>`` headings it has."""

    section: str
    slug: str
    title: str
    headings: tuple[str, ...]

    @property
    def path(self) -> str:
        return f"/docs/{self.section}/{self.slug}.html"


_DOC_SECTIONS = {
    "getting-started": ("Getting started", ["Installation", "Quick start", "Configuration",
                                            "Your first crawl"]),
    "guides": ("Guides", ["Writing handlers", "Following links", "Item pipelines",
                          "Rules files", "Sitemaps", "Rate limits", "Deployment", "Monitoring"]),
    "reference": ("Reference", ["Command line", "Settings", "The Page object", "The Router",
                                "Requests", "The results stream", "Redis keys", "Queues"]),
}


def _slug(title: str) -> str:
    return "-".join("".join(c for c in word if c.isalnum() or c == "-")
                    for word in title.lower().split())


#: Every documentation page in reading order (prev/next follow this order).
DOCS: tuple[DocPage, ...] = tuple(
    DocPage(section, _slug(title), title,
            (f"Why {title.lower()} matters", f"{title} step by step", "See also"))
    for section, (_name, titles) in _DOC_SECTIONS.items() for title in titles
)

#: The index page's heading.
DOCS_HOME_TITLE = "Acme Crawler documentation"


def _docs_chrome(base_external: str, main: str, title: str) -> bytes:
    sidebar = []
    for section, (name, _titles) in _DOC_SECTIONS.items():
        links = "".join(f'<li><a href="{p.path}">{html.escape(p.title)}</a></li>'
                        for p in DOCS if p.section == section)
        sidebar.append(f"<h3>{html.escape(name)}</h3>\n<ul>{links}</ul>")
    body = (
        '<header class="topbar"><a href="/">Acme Docs</a> '
        f'<a href="{base_external}/blog/">Blog</a> '
        f'<a href="{base_external}/github/acme">Source code</a></header>\n'
        f'<nav class="sidebar">\n{chr(10).join(sidebar)}\n</nav>\n'
        f"<main>\n{main}\n</main>\n"
        '<footer><p>Copyright 2026 Acme Corp. All rights reserved.</p>'
        f'<p><a href="{base_external}/legal/privacy">Privacy</a></p>'
        '<div class="cookie-banner">This site uses cookies to remember your preferences. '
        '<a href="#accept">Accept all cookies</a></div></footer>'
    )
    return _page(f"{title} · Acme Docs", body)


def docs_home_html(base_external: str) -> bytes:
    cards = "".join(
        f'<section><h2>{html.escape(name)}</h2><p>{_prose(i, 2)}</p>'
        f'<p><a href="/docs/{section}/{_slug(titles[0])}.html">Start with '
        f"{html.escape(titles[0])}</a></p></section>"
        for i, (section, (name, titles)) in enumerate(_DOC_SECTIONS.items()))
    main = (f"<article><h1>{DOCS_HOME_TITLE}</h1>\n<p>{_prose(99, 4)}</p>\n{cards}\n"
            f"<p>News about releases is on <a href=\"{base_external}/blog/\">the blog</a>."
            "</p></article>")
    return _docs_chrome(base_external, main, "Home")


def doc_html(n: int, base_external: str) -> bytes:
    """The HTML of ``DOCS[n]``."""
    page = DOCS[n]
    parts = [f"<h1>{html.escape(page.title)}</h1>", f"<p>{_prose(n, 4)}</p>"]
    for h, heading in enumerate(page.headings):
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(f"<p>{_prose(n * 10 + h, 3)}</p>")
        if h == 1:
            parts.append(f"<pre><code>acme crawl --section {page.section} "
                         f"--page {page.slug}</code></pre>")
        if h == 2:
            parts.append(f'<p>The upstream project documents this in <a href="{base_external}'
                         f'/upstream/{page.slug}">its own manual</a>; the '
                         f'<a href="{DOCS[(n + 3) % len(DOCS)].path}">'
                         f"{html.escape(DOCS[(n + 3) % len(DOCS)].title)}</a> page goes on from "
                         "here.</p>")
    pager = []
    if n > 0:
        pager.append(f'<a class="prev" rel="prev" href="{DOCS[n - 1].path}">Previous: '
                     f"{html.escape(DOCS[n - 1].title)}</a>")
    if n + 1 < len(DOCS):
        pager.append(f'<a class="next" rel="next" href="{DOCS[n + 1].path}">Next: '
                     f"{html.escape(DOCS[n + 1].title)}</a>")
    main = (f'<article>\n{chr(10).join(parts)}\n</article>\n'
            f'<nav class="pager">{" ".join(pager)}</nav>')
    return _docs_chrome(base_external, main, page.title)


def _install_docs(site: TestSite) -> None:
    def external() -> str:  # same server, another host name: out of the crawl's scope
        return f"http://localhost:{site.port}"

    site.route("/", lambda _r: (200, _HTML, docs_home_html(external())))
    site.route("/robots.txt", lambda _r: (200, _TEXT, b"User-agent: *\nAllow: /\n"))
    for n, page in enumerate(DOCS):
        site.route(page.path, lambda _r, n=n: (200, _HTML, doc_html(n, external())))


# -- shop --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Product:
    """One product: ``price_cents`` None means the page shows no price."""

    number: int
    name: str
    sku: str
    price_cents: int | None
    in_stock: bool

    @property
    def path(self) -> str:
        return f"/p/{_slug(self.name)}-{self.number}"

    @property
    def price_text(self) -> str | None:
        """The price as the page shows it: one of four formats, by product number."""
        if self.price_cents is None:
            return None
        euros = f"{self.price_cents // 100:,}.{self.price_cents % 100:02d}"
        return (f"€{euros}", f"{euros} EUR", f"EUR {euros}",
                f"€ {euros.replace(',', ' ')}")[self.number % 4]


_ADJECTIVES = ("Copper", "Linen", "Walnut", "Enamel", "Cast-iron", "Glass")
_NOUNS = ("kettle", "apron", "cutting board", "mug", "skillet")
#: Products whose page shows "Price on request" (the pipeline drops them) and out of stock.
NO_PRICE = frozenset({5, 17, 26})
OUT_OF_STOCK = frozenset({8, 21, 29})
PRODUCTS_PER_PAGE = 10

#: Every product, numbered from 1.
PRODUCTS: tuple[Product, ...] = tuple(
    Product(n, f"{_ADJECTIVES[(n - 1) % 6]} {_NOUNS[(n - 1) // 6]}", f"ACM-{1000 + n}",
            None if n in NO_PRICE else (n * 1337) % 9000 + 199 + (120000 if n % 7 == 0 else 0),
            n not in OUT_OF_STOCK)
    for n in range(1, 31)
)
CATALOG_PAGES = math.ceil(len(PRODUCTS) / PRODUCTS_PER_PAGE)
#: The product every catalog page features in its sidebar.
FEATURED = PRODUCTS[0]


def catalog_html(page_number: int) -> bytes:
    first = (page_number - 1) * PRODUCTS_PER_PAGE
    cards = "".join(
        f'<li class="card"><a class="product" href="{p.path}">{html.escape(p.name)}</a> '
        f'<span class="teaser">{html.escape(p.price_text or "Price on request")}</span></li>'
        for p in PRODUCTS[first:first + PRODUCTS_PER_PAGE])
    pager = ['<a class="first" href="/catalog?page=1">First</a>']
    if page_number < CATALOG_PAGES:
        pager.append(f'<a class="next" href="/catalog?page={page_number + 1}">Next page</a>')
    body = (
        '<header><a href="/">Acme Home Goods</a> <a href="/cart">Cart (0)</a> '
        '<a href="/account/login">Sign in</a></header>\n'
        f"<h1>Catalog, page {page_number} of {CATALOG_PAGES}</h1>\n"
        f'<ul class="products">{cards}</ul>\n'
        f'<aside class="featured"><h2>Featured</h2><a class="product" href="{FEATURED.path}">'
        f"{html.escape(FEATURED.name)}</a></aside>\n"
        f'<nav class="pager">{" ".join(pager)}</nav>'
    )
    return _page(f"Catalog page {page_number}", body)


def product_html(product: Product) -> bytes:
    price = (f'<span class="price">{html.escape(product.price_text)}</span>'
             if product.price_text else '<span class="on-request">Price on request</span>')
    stock = ('<p class="stock in-stock">In stock</p>' if product.in_stock
             else '<p class="stock out-of-stock">Out of stock</p>')
    related = PRODUCTS[product.number % len(PRODUCTS)]
    body = (
        '<header><a href="/">Acme Home Goods</a> <a href="/cart">Cart (0)</a></header>\n'
        '<nav class="breadcrumb"><a href="/catalog?page=1">Catalog</a></nav>\n'
        f'<div class="product"><h1 class="name">{html.escape(product.name)}</h1>\n'
        f'<p>SKU: <span class="sku">{product.sku}</span></p>\n<p>{price}</p>\n{stock}\n'
        f'<p class="description">{_prose(product.number, 2)}</p>\n'
        f'<form action="/cart" method="post"><button>Add to cart</button></form></div>\n'
        f'<aside>You may also like <a class="related" href="{related.path}">'
        f"{html.escape(related.name)}</a></aside>"
    )
    return _page(product.name, body)


def _install_shop(site: TestSite) -> None:
    def catalog(record: RequestRecord) -> Response:
        raw = parse_qs(urlsplit(record.path).query).get("page", ["1"])[0]
        if not raw.isdigit() or not 1 <= int(raw) <= CATALOG_PAGES:
            return _not_found()
        return 200, _HTML, catalog_html(int(raw))

    site.route("/", lambda _r: (200, _HTML, _page("Acme Home Goods", (
        '<h1>Acme Home Goods</h1><p><a href="/catalog?page=1">Browse the catalog</a></p>'))))
    site.route("/robots.txt", lambda _r: (200, _TEXT,
                                          b"User-agent: *\nDisallow: /cart\nDisallow: /account/\n"))
    site.route("/catalog", catalog)
    for product in PRODUCTS:
        site.route(product.path, lambda _r, p=product: (200, _HTML, product_html(p)))


# -- news --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Article:
    """One news article; ``published`` and ``lastmod`` are ISO 8601 UTC strings."""

    number: int
    section: str
    headline: str
    author: str
    published: str
    lastmod: str

    @property
    def path(self) -> str:
        return f"/articles/{self.published[:4]}/{self.published[5:7]}/{_slug(self.headline)}.html"

    @property
    def paragraphs(self) -> tuple[str, ...]:
        return tuple(_prose(self.number * 5 + i, 3) for i in range(4))


NEWS_SECTIONS = ("world", "science", "culture")
_HEADLINES = (
    "Harbour reopens after storm repairs", "New comet visible before dawn this week",
    "City library extends opening hours", "Rail strike ends with a late agreement",
    "Researchers map the ocean floor off the coast", "Festival lineup announced for spring",
    "Bridge inspection finds no structural damage", "Vaccine trial reaches its final phase",
    "Orchestra returns to the restored concert hall", "Wind farm begins supplying the grid",
    "Ancient shipwreck found in shallow water", "Museum opens a gallery of modern prints",
    "Flood defences tested ahead of winter", "Telescope captures a distant galaxy merger",
    "Poetry prize goes to a first-time author",
)
_AUTHORS = ("Mara Lind", "Tomás Reyes", "Ada Okafor", "Jonas Weber", "Priya Nair")

#: Every article: 1-7 published in October 2026, 8-15 in November.
ARTICLES: tuple[Article, ...] = tuple(
    Article(n, NEWS_SECTIONS[(n - 1) % 3], _HEADLINES[n - 1], _AUTHORS[(n - 1) % 5],
            f"2026-{10 if n <= 7 else 11:02d}-{(n * 3) % 28 + 1:02d}T0{n % 10}:30:00Z",
            f"2026-{10 if n <= 7 else 11:02d}-{(n * 3) % 28 + 1:02d}T1{n % 10}:00:00Z")
    for n in range(1, 16)
)
NEWSLETTER = "Get the morning briefing in your inbox: subscribe to our newsletter."


def article_html(article: Article) -> bytes:
    related = [ARTICLES[(article.number + k) % len(ARTICLES)] for k in (1, 2)]
    paragraphs = "\n".join(f"<p>{p}</p>" for p in article.paragraphs)
    day = article.published[:10]
    body = (
        '<header><a href="/">The Daily Loop</a> '
        + " ".join(f'<a href="/section/{s}">{s.title()}</a>' for s in NEWS_SECTIONS)
        + "</header>\n<main><article>\n"
        f'<h1 class="headline">{html.escape(article.headline)}</h1>\n'
        f'<p class="byline">By <span class="author">{html.escape(article.author)}</span>, '
        f'<time datetime="{article.published}">{day}</time></p>\n'
        f'<div class="body">\n{paragraphs}\n</div>\n</article>\n'
        '<aside class="related"><h2>Related</h2><ul>'
        + "".join(f'<li><a href="{r.path}">{html.escape(r.headline)}</a></li>' for r in related)
        + "</ul></aside></main>\n"
        f'<footer><p class="newsletter">{NEWSLETTER}</p><p>The Daily Loop, 2026</p></footer>'
    )
    return _page(f"{article.headline} | The Daily Loop", body)


def section_html(section: str) -> bytes:
    items = "".join(f'<li><a href="{a.path}">{html.escape(a.headline)}</a></li>'
                    for a in ARTICLES if a.section == section)
    return _page(f"{section.title()} | The Daily Loop",
                 f'<h1>{section.title()}</h1>\n<ul class="articles">{items}</ul>')


def _urlset(base_url: str, entries: list[tuple[str, str | None]]) -> bytes:
    urls = "".join(f"<url><loc>{base_url}{path}</loc>"
                   + (f"<lastmod>{lastmod}</lastmod>" if lastmod else "") + "</url>\n"
                   for path, lastmod in entries)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n{urls}</urlset>\n'
            ).encode()


#: The article sitemaps: path -> the articles they list.
NEWS_SITEMAPS = {
    "/sitemaps/articles-2026-10.xml": tuple(a for a in ARTICLES if a.published[5:7] == "10"),
    "/sitemaps/articles-2026-11.xml": tuple(a for a in ARTICLES if a.published[5:7] == "11"),
}


def _install_news(site: TestSite) -> None:
    def robots(_record: RequestRecord) -> Response:
        return 200, _TEXT, (f"User-agent: *\nDisallow: /admin/\n\n"
                            f"Sitemap: {site.base_url}/sitemap.xml\n").encode()

    def index(_record: RequestRecord) -> Response:
        children = [*NEWS_SITEMAPS, "/sitemaps/sections.xml"]
        entries = "".join(f"<sitemap><loc>{site.base_url}{path}</loc></sitemap>\n"
                          for path in children)
        return 200, _XML, ('<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex '
                           f'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n{entries}'
                           "</sitemapindex>\n").encode()

    site.route("/robots.txt", robots)
    site.route("/sitemap.xml", index)
    for path, articles in NEWS_SITEMAPS.items():
        site.route(path, lambda _r, a=articles: (
            200, _XML, _urlset(site.base_url, [(x.path, x.lastmod) for x in a])))
    site.route("/sitemaps/sections.xml", lambda _r: (
        200, _XML, _urlset(site.base_url, [(f"/section/{s}", None) for s in NEWS_SECTIONS])))
    site.route("/", lambda _r: (200, _HTML, _page("The Daily Loop", "".join(
        f'<p><a href="/section/{s}">{s.title()}</a></p>' for s in NEWS_SECTIONS))))
    for section in NEWS_SECTIONS:
        site.route(f"/section/{section}", lambda _r, s=section: (200, _HTML, section_html(s)))
    for article in ARTICLES:
        site.route(article.path, lambda _r, a=article: (200, _HTML, article_html(a)))


# -- serving -----------------------------------------------------------------------------------

#: Example name -> the function that adds its routes to a site.
SITES: dict[str, Callable[[TestSite], None]] = {
    "docs": _install_docs, "shop": _install_shop, "news": _install_news}


def example_site(name: str, host: str = "127.0.0.1", port: int = 0) -> TestSite:
    """A (not yet started) loopback site serving example ``name``; ``with`` starts and stops
    it. Paths the example does not define answer 404."""
    if name not in SITES:
        raise ValueError(f"unknown example site {name!r}; one of {', '.join(SITES)}")
    site = TestSite(host, port, pages=1, links_per_page=0)
    site.route("/page/1", lambda _r: _not_found())  # the test site's own page: not here
    SITES[name](site)
    return site


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.example_sites NAME``: serve one example site until ^C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(SITES))
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with example_site(args.name, args.host, args.port) as site:
        print(f"{args.name} example site at {site.base_url}/ (Ctrl-C stops it)", flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
