"""Extraction rules through the real fleet: Producer -> RabbitMQ -> WorkerThread -> the results
stream, on a generated shop served by the loopback test site (rules and pages:
tests/work/test_extract.py, which checks the same values offline)."""

from __future__ import annotations

import pytest

from common.core.errors import ConfigError
from common.intake.producer import Producer
from common.work.processor import Processor
from tests.helpers import WorkerThread, results
from tests.work.test_extract import (
    SHOP_RULES,
    detail_html,
    expected_detail,
    expected_listing,
    listing_html,
)

HTML = {"Content-Type": "text/html; charset=utf-8"}


def _serve_shop(site) -> list[str]:
    site.route("/shop/", lambda _r: (200, HTML, listing_html().encode()))
    for n in (1, 2, 3):
        site.route(f"/shop/item/{n}", lambda _r, n=n: (200, HTML, detail_html(n).encode()))
    return [site.url("/shop/")] + [site.url(f"/shop/item/{n}") for n in (1, 2, 3)]


def test_the_fleet_records_extracted_data_for_matching_pages(settings, redis_client, site,
                                                              tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(SHOP_RULES)
    urls = _serve_shop(site) + [site.page_url(1)]  # /page/1 matches no rule
    with Producer(settings, redis_client) as producer:
        producer.submit(urls)
    fleet = settings.with_overrides(idle_exit_s=1.0, concurrency=4,
                                    extract_rules=f"@{rules}")
    with WorkerThread(fleet) as worker:
        assert worker.join(30) == 0
    records = {r["url"]: r for r in results(redis_client)}
    assert set(records) == set(urls)
    base = site.base_url.rstrip("/")
    assert records[site.url("/shop/")]["data"] == expected_listing(base)
    assert "data_errors" not in records[site.url("/shop/")]
    for n in (1, 2, 3):
        record = records[site.url(f"/shop/item/{n}")]
        data, errors = expected_detail(base, n)
        assert record["data"] == data
        assert record.get("data_errors", {}) == errors
        assert record["status"] == 200 and record["title"] is None  # no <title>: still a page
    assert "data" not in records[site.page_url(1)]


def test_a_bad_rules_file_stops_the_worker_at_start(settings, redis_client, tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text("- name: r\n  host: a.b\n  fields: {n: {css: p, type: money}}\n")
    with pytest.raises(ConfigError, match="rule 'r' field 'n': unknown type 'money'"):
        Processor(settings.with_overrides(extract_rules=f"@{rules}"), redis_client)


FOLLOW_RULES = r"""
- name: listing
  path: '^/shop/?$'
  fields: {heading: h1}
  follow: {css: [.products, .pagination], deny: '/cart', priority: true}
- name: detail
  path: '^/shop/item/\d+$'
  fields: {title: h1}
  follow: false
"""


def _serve_paged_shop(site) -> None:
    def listing(request):
        second = request.path.endswith("?page=2")
        products = ['<a href="item/5">five</a>'] if second else [
            '<a href="item/1">one</a>', '<a href="/shop/item/2">two</a>',
            '<a href="item/3">three</a>', '<a href="item/4" rel="nofollow">four</a>']
        more = "" if second else '<div class="pagination"><a href="?page=2">next</a></div>'
        html = (f"<html><body><nav><a href='/cart'>cart</a><a href='/about'>about</a></nav>"
                f"<h1>Page {2 if second else 1}</h1><div class='products'>"
                f"{''.join(products)}<a href='/cart?add=1'>buy</a></div>{more}</body></html>")
        return 200, HTML, html.encode()

    site.route("/shop/", listing)
    for n in range(1, 6):
        site.route(f"/shop/item/{n}", lambda _r, n=n: (200, HTML, (
            f"<html><body><h1>Item {n}</h1><a href='/shop/related/{n}'>related</a>"
            f"<a href='/shop/'>back</a></body></html>").encode()))


def test_crawl_mode_follows_only_what_the_follow_rules_allow(settings, redis_client, site,
                                                               tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(FOLLOW_RULES)
    _serve_paged_shop(site)
    fleet = settings.with_overrides(idle_exit_s=1.5, concurrency=4, crawl_enabled=True,
                                    crawl_max_depth=3, extract_rules=f"@{rules}")
    with Producer(fleet, redis_client) as producer:
        producer.submit([site.url("/shop/")])
    with WorkerThread(fleet) as worker:
        assert worker.join(60) == 0
    records = {r["url"]: r for r in results(redis_client)}
    expected = {site.url("/shop/"), site.url("/shop/?page=2")} | {
        site.url(f"/shop/item/{n}") for n in (1, 2, 3, 5)}
    assert set(records) == expected  # no nofollow item 4, cart, about, related, back links
    assert records[site.url("/shop/?page=2")]["data"] == {"heading": "Page 2"}
    assert records[site.url("/shop/item/5")]["data"] == {"title": "Item 5"}
    assert records[site.url("/shop/")]["followed"] == 4  # items 1-3 and page 2
    for n in (1, 2, 3, 5):  # the listing rule's priority: true
        assert records[site.url(f"/shop/item/{n}")]["queue"] == "priority_queue"
    assert "followed" not in records[site.url("/shop/item/1")]  # follow: false
    assert not site.requests_for("/cart") and not site.requests_for("/shop/related/")
