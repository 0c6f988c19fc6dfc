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
