"""Bounded result records: every field capped and flagged, the whole record within
MAX_RECORD_BYTES, crawl mode still following every extracted link."""

from __future__ import annotations

import json
import logging
import random
from types import SimpleNamespace

import orjson
import pytest

from bench.record_cost import farm_page
from common.intake.producer import Producer
from common.store.results import encode
from common.work import record as rec
from common.work.parse import parse_html
from devtools.testsite import TestSite
from tests.helpers import WorkerThread, results

HTML = "text/html; charset=utf-8"
PAGE_URL = "http://127.0.0.2:8080/p/1.html"
MAX_BYTES = 65536
MAX_LINKS = 1000


def _response(url: str = PAGE_URL, body: bytes = b"", **fields) -> SimpleNamespace:
    values = {"final_url": url, "status": 200, "content_type": HTML, "body": body,
              "truncated": False, "elapsed_ms": 3.2, "redirects": 0, "skipped": None, "headers": {},
              "http_version": "1.1", "remote_ip": "127.0.0.1", "proxy": None, "tls_verified": None}
    values.update(fields)
    return SimpleNamespace(**values)


def _record(body: bytes, *, max_bytes: int = MAX_BYTES, max_links: int = MAX_LINKS,
            url: str = PAGE_URL, **response) -> tuple[dict, bytes]:
    """The worker's record of ``body``, built and bounded as the processor does: the record
    as stored (decoded) and its stored bytes."""
    record = rec.fetch_record(url, _response(url, body, **response), worker="w-1",
                              queue="url_queue_ttl", depth=0, attempts=1, cached=False)
    rec.add_page(record, parse_html(body, url, HTML), max_links)
    data = encode(rec.bound(record, max_bytes))
    return json.loads(data), data


def _hostile_html(*, links: int = 50_000, link_chars: int = 0) -> bytes:
    pad = "x" * link_chars
    anchors = "".join(f'<a href="/l/{i}/{pad}">{i}</a>' for i in range(links))
    return (f'<html lang="{"en-" * 2000}"><head><title>{"Title " * 17_000}</title>'
            f'<meta name="description" content="{"d" * 1_000_000}">'
            f'<link rel="canonical" href="/{"c" * 100_000}"></head>'
            f"<body><p>text</p>{anchors}</body></html>").encode()


# --- field caps -------------------------------------------------------------------------


def test_a_page_over_every_cap_is_capped_and_flagged_field_by_field():
    record, data = _record(_hostile_html())

    assert len(data) <= MAX_BYTES
    assert record["title"] == ("Title " * 17_000)[: rec.TITLE_MAX_CHARS]
    assert record["title_truncated"] is True
    assert record["description"] == "d" * rec.DESCRIPTION_MAX_CHARS
    assert record["description_truncated"] is True
    assert record["language"] == ("en-" * 2000)[: rec.LANGUAGE_MAX_CHARS]
    assert record["language_truncated"] is True
    assert record["canonical"] is None and record["canonical_truncated"] is True
    # parse keeps 10,000 links, the record the first RECORD_MAX_LINKS in document order
    assert record["links_count"] == 10_000 and record["links_truncated"] is True
    assert record["links"] == [f"http://127.0.0.2:8080/l/{i}/" for i in range(MAX_LINKS)]
    assert record["links_kept"] == MAX_LINKS
    assert "record_truncated" not in record  # the field caps were enough


def test_long_error_content_type_and_final_url_are_capped():
    record = rec.fetch_record(PAGE_URL, _response(
        "http://127.0.0.2/" + "r" * 5000, content_type="text/html; x=" + "y" * 70_000),
        worker="w", queue="q", depth=0, attempts=1, cached=False)
    record["error"] = "not_html: " + "e" * 5000

    rec.bound(record, MAX_BYTES)

    assert record["final_url"] is None and record["final_url_truncated"] is True
    assert len(record["content_type"]) == rec.CONTENT_TYPE_MAX_CHARS
    assert record["content_type_truncated"] is True
    assert record["error"] == ("not_html: " + "e" * 5000)[: rec.ERROR_MAX_CHARS]
    assert record["error_truncated"] is True
    assert record["url"] == PAGE_URL


def test_a_failure_record_cuts_a_huge_url():
    headers = {"reason": "invalid_url", "attempts": 0, "last_error": "too long"}
    record = rec.failure_record("http://x/" + "u" * 10_000, headers, worker="w", queue=None,
                                depth=None)
    assert len(record["url"]) == rec.URL_MAX_CHARS and record["url_truncated"] is True
    assert record["reason"] == "invalid_url" and record["outcome"] == "dead_letter"
    assert "url_truncated" not in rec.failure_record("http://x/", headers, worker="w",
                                                     queue=None, depth=None)


# --- the byte cap -----------------------------------------------------------------------


def test_links_are_dropped_from_the_end_until_the_record_fits_and_no_more():
    # 1,000 links of ~2,000 characters: 2 MB of links against a 64 KB record.
    record, data = _record(_hostile_html(links=1000, link_chars=1990))

    kept = record["links_kept"]
    assert len(data) <= MAX_BYTES and record["record_truncated"] is True
    assert 20 < kept < 40 and len(record["links"]) == kept and record["links_count"] == 1000
    assert record["links"][-1].startswith(f"http://127.0.0.2:8080/l/{kept - 1}/")
    # One more link would not have fitted.
    page_links = parse_html(_hostile_html(links=1000, link_chars=1990), PAGE_URL, HTML).links
    record["links"].append(page_links[kept])
    assert len(encode(record)) > MAX_BYTES
    # The text fields were not touched beyond their own caps.
    assert len(record["description"]) == rec.DESCRIPTION_MAX_CHARS


@pytest.mark.parametrize("max_bytes", [760, 1500, 4096, 9000, 20_000, 65_536])
def test_a_small_cap_shortens_the_longest_text_fields_and_is_never_exceeded(max_bytes):
    record, data = _record(_hostile_html(links=3000), max_bytes=max_bytes)

    assert len(data) <= max_bytes
    assert orjson.loads(data) == record  # valid JSON, nothing cut inside it
    if max_bytes < 20_000:  # links go first, as many as needed
        assert record["record_truncated"] is True and record["links_count"] == 3000
        assert 0 <= record["links_kept"] == len(record["links"]) < 3000
    if max_bytes < 4096:  # then the text fields: their caps alone sum to over 3 KB
        assert record["links"] == []
        assert len(record.get("description") or "") < rec.DESCRIPTION_MAX_CHARS
        assert record["description_truncated"] is True
    assert record["url"] == PAGE_URL and record["status"] == 200


def test_escaped_and_multibyte_text_is_measured_in_bytes_not_characters():
    # A control character takes 6 bytes in JSON (\u0001), CJK 3, an emoji 4, a quote 2.
    for max_bytes in (1000, 3000, 8000, 30_000, 65_536):
        record = rec.fetch_record(PAGE_URL, _response(), worker="w", queue="q", depth=0,
                                  attempts=1, cached=False)
        record.update(title="\x01\"é日😀" * 300, description="日" * 3000,
                      links=[f"http://127.0.0.2/日本/{i}?q=\"\x02{i}" for i in range(2000)],
                      links_count=2000)
        data = encode(rec.bound(record, max_bytes))
        assert len(data) <= max_bytes, max_bytes
        assert orjson.loads(data) == orjson.loads(orjson.dumps(record))


def test_random_caps_and_pages_never_exceed_the_cap():
    rng = random.Random(7)
    for _ in range(25):
        body = _hostile_html(links=rng.randint(0, 3000), link_chars=rng.randint(0, 300))
        max_bytes = rng.randint(800, 80_000)
        record, data = _record(body, max_bytes=max_bytes, max_links=rng.randint(0, 2000))
        assert len(data) <= max_bytes, (max_bytes, len(data))
        assert len(record["links"]) == record.get("links_kept", record["links_count"])


def test_a_cap_below_the_smallest_record_is_logged_and_the_record_still_stored(caplog):
    with caplog.at_level(logging.WARNING, logger="common.work.record"):
        record, data = _record(_hostile_html(links=10), max_bytes=101)
        _record(_hostile_html(links=10), max_bytes=101)
    assert record["url"] == PAGE_URL and record["record_truncated"] is True
    assert record["title"] is None and record["links"] == []
    assert orjson.loads(data) == record
    assert caplog.text.count("below the smallest record") == 1  # once, not per page


# --- normal pages -----------------------------------------------------------------------


def test_a_farm_page_record_is_unchanged_but_for_links_count():
    url, body = farm_page()
    response = _response(url, body)
    page = parse_html(body, url, HTML)
    before = rec.fetch_record(url, response, worker="w-1", queue="url_queue_ttl", depth=0, attempts=1,
                              cached=False)
    before.update(page.to_dict())
    del before["canonical_truncated"]  # to_dict's, not a record field when false
    del before["cut"]  # the record's parse_cut, there only when the page was cut

    after, data = _record(body, url=url)
    for volatile in ("fetched_at",):
        before.pop(volatile), after.pop(volatile)

    assert after == {**before, "links_count": len(page.links)}
    assert 90 <= len(page.links) <= 100 and len(data) < 5000


def test_bound_keeps_the_links_encoded_once_as_a_fragment():
    url, body = farm_page()
    record = rec.fetch_record(url, _response(url, body), worker="w", queue="q", depth=0,
                              attempts=1, cached=False)
    page = parse_html(body, url, HTML)
    rec.add_page(record, page, MAX_LINKS)
    plain = orjson.dumps(record)

    rec.bound(record, MAX_BYTES)

    assert isinstance(record["links"], orjson.Fragment)
    assert encode(record) == plain


# --- the worker ---------------------------------------------------------------------------


@pytest.fixture
def record_site():
    with TestSite("127.0.0.14", pages=40, links_per_page=2) as site:
        yield site


def _run(settings, redis_client, urls, **overrides):
    worker_settings = settings.with_overrides(idle_exit_s=1.5, concurrency=4, **overrides)
    with Producer(worker_settings, redis_client) as producer:
        producer.submit(urls)
    with WorkerThread(worker_settings) as worker:
        assert worker.join(120) == 0
    return {r["url"]: r for r in results(redis_client)}


def test_crawl_mode_follows_the_links_beyond_the_records_cap(settings, redis_client,
                                                            record_site):
    targets = list(range(2, 22))  # 20 links, the record keeps 3
    record_site.route("/page/1", lambda _r: (200, {"Content-Type": "text/html"}, "".join(
        f'<a href="/page/{n}">{n}</a>' for n in targets).encode()))

    records = _run(settings, redis_client, [record_site.page_url(1)], crawl_enabled=True,
                   crawl_max_depth=1, record_max_links=3)

    seed = records[record_site.page_url(1)]
    assert seed["links"] == [record_site.page_url(n) for n in targets[:3]]
    assert seed["links_count"] == 20 and seed["links_kept"] == 3 and seed["followed"] == 20
    assert set(records) == {record_site.page_url(n) for n in [1, *targets]}
    assert all(record_site.count(f"/page/{n}") == 1 for n in targets)


def test_stored_records_respect_the_byte_cap_for_every_hostile_page(settings, redis_client,
                                                                    record_site):
    pages = {"/hostile": _hostile_html(), "/long-links": _hostile_html(links=1000,
                                                                      link_chars=1990)}
    for path, body in pages.items():
        record_site.route(path, lambda _r, body=body: (200, {"Content-Type": HTML}, body))
    urls = [record_site.url(path) for path in pages] + [record_site.page_url(3)]

    records = _run(settings, redis_client, urls)
    stored = [fields[b"json"] for _id, fields in redis_client.xrange("results")]

    assert len(stored) == 3 and all(len(data) <= settings.max_record_bytes for data in stored)
    hostile = records[record_site.url("/hostile")]
    assert hostile["title_truncated"] and hostile["description_truncated"]
    assert hostile["canonical_truncated"] and hostile["links_kept"] == settings.record_max_links
    long_links = records[record_site.url("/long-links")]
    assert long_links["record_truncated"] is True and long_links["links_kept"] < 40
    normal = records[record_site.page_url(3)]
    assert normal["title"] == "Page 3" and normal["links_count"] == len(normal["links"])
    assert not any(key.endswith("_truncated") and value for key, value in normal.items())
    assert "links_kept" not in normal and "record_truncated" not in normal


def test_a_failure_record_of_a_url_with_a_lone_surrogate_is_encodable():
    import orjson

    from common.work.record import failure_record

    record = failure_record("http://x.test/\ud800", {"reason": "invalid_url",
                                                    "last_error": "bad \udfff"},
                            worker="w", queue=None, depth=None)
    assert record["url"] == "http://x.test/\\ud800"
    assert orjson.loads(orjson.dumps(record))["last_error"] == "bad \\udfff"


def test_a_huge_redirected_from_is_dropped_and_flagged_like_the_other_url_fields():
    record = {"url": "http://a/", "redirected_from": "http://b/" + "x" * 2_000_000}
    rec.bound(record, 65536)
    assert record["redirected_from"] is None and record["redirected_from_truncated"] is True
    assert len(orjson.dumps(record)) <= 65536


def test_a_redirected_from_that_is_not_a_string_is_dropped():
    record = {"url": "http://a/", "redirected_from": {"nested": ["x" * 100]}}
    rec.bound(record, 65536)
    assert record["redirected_from"] is None and record["redirected_from_truncated"] is True


def test_a_redirected_from_with_a_lone_surrogate_is_kept_escaped():
    record = {"url": "http://a/", "redirected_from": "http://b/\ud800"}
    rec.bound(record, 65536)
    assert record["redirected_from"] == "http://b/\\ud800"
    assert "redirected_from_truncated" not in record


def test_a_handler_s_items_over_the_record_cap_are_dropped_whole_before_the_rules_data():
    record = {"url": "https://s.test/p", "status": 200, "data": {"title": "kept"},
              "items": [{"n": i, "text": "x" * 500} for i in range(200)], "handler": "p"}
    rec.bound(record, 8192)
    assert record["items"] is None and record["items_truncated"] and record["record_truncated"]
    assert record["data"] == {"title": "kept"} and "data_truncated" not in record
    assert len(orjson.dumps(record)) <= 8192
