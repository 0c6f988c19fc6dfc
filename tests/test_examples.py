"""The three projects in examples/ through the real fleet: their sites (devtools/example_sites.py)
on loopback, RabbitMQ and Redis from the session fixtures, two ``worker.py`` processes with
``HANDLERS=examples.NAME.handlers:router``, seeds through the producer path (a seed URL; the
news site's sitemap through ``sitemap_producer.py``), and the results stream read back: exact
items, the handler each page ran, and every in-scope page fetched exactly once.

The expected values come from the sites' tables (product prices as numbers, page titles and
headings, article fields), not from running the handlers."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from common.broker import topology
from common.core.config import Settings
from common.core.urls import canonicalize
from common.intake.producer import Producer
from common.store.keys import deferred_key
from devtools import example_sites
from devtools.example_sites import ARTICLES, DOCS, FEATURED, PRODUCTS, example_site
from devtools.testsite import TestSite
from tests.helpers import REPO_ROOT, output_of, own_channel, results, start_worker_process, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKERS = 2


@contextmanager
def two_workers(settings: Settings, handlers: str,
                env: dict[str, str] | None = None) -> Iterator[list[subprocess.Popen]]:
    """``WORKERS`` worker processes running ``handlers``, both consuming before this yields;
    on the way out any still running are killed (a test stops them with :func:`stop`)."""
    procs = [start_worker_process(settings, "--concurrency", "2",
                                  env={"HANDLERS": handlers, "WORKER_ID": f"{handlers}-{i}",
                                       **(env or {})})
             for i in range(WORKERS)]
    try:
        with own_channel(settings) as channel:
            ready = wait_for(lambda: channel.queue_declare(
                queue=topology.NORMAL_QUEUE, passive=True).method.consumer_count >= WORKERS, 60)
        assert ready, [output_of(p)[-3000:] for p in procs]
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def crawl_until(settings: Settings, redis_client: Any, procs: list[subprocess.Popen],
                urls: set[str], timeout_s: float = 30) -> dict[str, dict[str, Any]]:
    """Wait for a result for each of ``urls``, stop the workers (SIGTERM: they finish what
    they hold and exit 0), check nothing is left to crawl, and return the records by URL,
    each URL recorded exactly once."""
    done = wait_for(lambda: urls <= {r["url"] for r in results(redis_client)}, timeout_s,
                    step_s=0.1)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(60) == 0, output_of(proc)[-3000:]
    logs = "\n".join(output_of(p)[-2000:] for p in procs)
    missing = urls - {r["url"] for r in results(redis_client)}
    seen = [{k: r.get(k) for k in ("url", "handler", "handler_followed", "data_errors")}
            for r in results(redis_client)]
    assert done and not missing, f"no result for {sorted(missing)}\n{seen}\n{logs}"
    with own_channel(settings) as channel:  # nothing queued that the test did not expect
        for queue in (topology.NORMAL_QUEUE, topology.PRIORITY_QUEUE, topology.FAILED_QUEUE):
            assert channel.queue_declare(queue=queue, passive=True).method.message_count == 0
    assert redis_client.zcard(deferred_key()) == 0
    records = results(redis_client)
    per_url = Counter(r["url"] for r in records)
    assert set(per_url) == urls, f"unexpected pages {sorted(set(per_url) - urls)}"
    assert all(n == 1 for n in per_url.values()), per_url.most_common(3)
    assert len({r["worker"] for r in records}) == WORKERS  # both workers took pages
    return {r["url"]: r for r in records}


def fetched_once(site: TestSite, paths: list[str]) -> None:
    """Each of ``paths`` requested exactly once, and nothing else but robots.txt."""
    asked = Counter(r.path for r in site.log if r.path != "/robots.txt")
    assert asked == Counter(paths), (asked - Counter(paths), Counter(paths) - asked)


# -- docs --------------------------------------------------------------------------------------

def test_the_docs_example_records_every_page_as_markdown_and_stays_on_the_site(
        settings, redis_client):
    with example_site("docs") as site, \
            two_workers(settings, "examples.docs.handlers:router") as procs:
        with Producer(settings, redis_client) as producer:
            assert producer.submit([site.url("/")]).new == 1
        paths = ["/", *(page.path for page in DOCS)]
        records = crawl_until(settings, redis_client, procs,
                              {canonicalize(site.url(p)) for p in paths})
        fetched_once(site, paths)
        # The off-site links (another host name for the same server) were never fetched.
        assert not [r for r in site.log if r.host.startswith("localhost")]

    home = records[canonicalize(site.url("/"))]
    assert home["depth"] == 0 and home["handler"] == "default"
    assert home["handler_followed"] == len(DOCS)  # the sidebar; nothing off-site
    [item] = home["items"]
    assert item["title"] == example_sites.DOCS_HOME_TITLE and item["section"] is None
    assert item["headings"] == ["Getting started", "Guides", "Reference"]
    for page in DOCS:
        url = canonicalize(site.url(page.path))
        record = records[url]
        assert record["handler"] == "default" and record["depth"] == 1
        assert record["handler_followed"] == 0  # every link was seen, or off-site
        assert "data_errors" not in record and "dropped" not in record
        [item] = record["items"]
        markdown = item.pop("markdown")
        assert item == {"url": url, "title": page.title, "section": page.section,
                        "headings": list(page.headings)}
        assert markdown.startswith(f"# {page.title}\n"), markdown[:200]
        assert all(f"## {heading}" in markdown for heading in page.headings)
        for boilerplate in ("All rights reserved", "cookies", "Acme Docs"):
            assert boilerplate not in markdown


# -- shop --------------------------------------------------------------------------------------

def test_the_shop_example_scrapes_every_product_through_its_label_and_drops_the_unpriced(
        settings, redis_client):
    with example_site("shop") as site, two_workers(
            settings, "examples.shop.handlers:router", {"CRAWL_MAX_DEPTH": "5"}) as procs:
        with Producer(settings, redis_client) as producer:
            assert producer.submit([site.url("/catalog?page=1")]).new == 1
        listings = [f"/catalog?page={n}" for n in range(1, example_sites.CATALOG_PAGES + 1)]
        paths = [*listings, *(p.path for p in PRODUCTS)]
        records = crawl_until(settings, redis_client, procs,
                              {canonicalize(site.url(p)) for p in paths})
        fetched_once(site, paths)  # the featured product once; no cart, account or home page

    for n, path in enumerate(listings, start=1):
        url = canonicalize(site.url(path))
        record = records[url]
        on_page = PRODUCTS[(n - 1) * 10:n * 10]
        assert record["handler"] == "default" and record["depth"] == n - 1
        assert record["items"] == [{"kind": "listing", "url": url,
                                    "products": len({*on_page, FEATURED})}]
        # New follows: this page's products (the featured one only from page 1), and the next.
        assert record["handler_followed"] == len(on_page) + (n < len(listings))
    priced = dropped = 0
    for product in PRODUCTS:
        url = canonicalize(site.url(product.path))
        record = records[url]
        assert record["handler"] == "product", record  # by the listing's label alone
        listing = canonicalize(site.url(f"/catalog?page={(product.number - 1) // 10 + 1}"))
        if product.price_cents is None:
            assert record["items"] == []
            assert record["dropped"] == [{"reason": "no price", "by": "normalise_price"}]
            dropped += 1
            continue
        assert "dropped" not in record
        assert record["items"] == [{
            "kind": "product", "url": url, "sku": product.sku, "name": product.name,
            "price": product.price_cents / 100, "currency": "EUR",
            "in_stock": product.in_stock, "listing": listing}]
        priced += 1
    assert (priced, dropped) == (27, 3)


# -- news --------------------------------------------------------------------------------------

def test_the_news_example_scrapes_every_article_its_sitemap_lists(settings, redis_client,
                                                                   run_cli):
    rules = f"@{REPO_ROOT / 'examples' / 'news' / 'rules.yml'}"
    with example_site("news") as site, two_workers(
            settings, "examples.news.handlers:router", {"EXTRACT_RULES": rules}) as procs:
        seeded = run_cli("sitemap_producer.py", site.url("/"), "--json")
        assert seeded.returncode == 0, seeded.stderr
        summary = json.loads(seeded.stdout)
        assert (summary["sitemaps"], summary["new"]) == (4, len(ARTICLES) + 3), summary
        sections = [f"/section/{s}" for s in example_sites.NEWS_SECTIONS]
        pages = [*(a.path for a in ARTICLES), *sections]
        records = crawl_until(settings, redis_client, procs,
                              {canonicalize(site.url(p)) for p in pages})
        fetched_once(site, ["/sitemap.xml", *example_sites.NEWS_SITEMAPS,
                            "/sitemaps/sections.xml", *pages])

    for article in ARTICLES:
        url = canonicalize(site.url(article.path))
        record = records[url]
        assert record["handler"] == "article"  # the rules file's handler: article
        fields = {"headline": article.headline, "author": article.author,
                  "published": article.published}
        assert record["data"] == fields
        assert record["handler_followed"] == 0  # the related articles: in the sitemap already
        [item] = record["items"]
        body = item.pop("body")
        assert item == {"kind": "article", "url": url, **fields}
        assert body.startswith(article.headline + "\n")
        assert all(paragraph in body for paragraph in article.paragraphs)
        assert example_sites.NEWSLETTER not in body and "Related" not in body
    for name in example_sites.NEWS_SECTIONS:
        url = canonicalize(site.url(f"/section/{name}"))
        assert records[url]["handler"] == "default"
        assert records[url]["items"] == [{"kind": "section", "url": url, "name": name.title(),
                                          "articles": 5}]
