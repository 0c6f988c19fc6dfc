"""The three stages through the real fleet: a catalogue crawled (HTTP worker), its product
images and PDF manuals referenced by a rule's ``media:`` (scrape), downloaded by a download
worker into moto's S3 server (download), recorded in ``assets``; nginx serves it all on
loopback (devtools/media_site.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError

from common.core.config import Settings
from common.intake.producer import Producer
from common.jobs.registry import JobRegistry
from common.jobs.spec import parse_job
from common.media.store import open_store
from common.store.keys import ASSETS_STREAM
from devtools.media_site import MediaSite
from tests.helpers import WorkerThread, output_of, results, start_worker_process, wait_for

RULES = """
- name: product
  path: '^/catalogue/p\\d+\\.html$'
  fields: {title: h1}
  media:
    - {css: "img.product::attr(src)", kind: image, types: [image/*]}
    - {css: "a.manual::attr(href)", kind: document, types: [application/pdf]}
"""


@pytest.fixture
def media_site(tmp_path: Path):
    with MediaSite(tmp_path, products=6, large_bytes=40 * 2**20) as site:
        yield site


def assets(client) -> list[dict]:
    return [json.loads(fields[b"json"]) for _id, fields in client.xrange(ASSETS_STREAM)]


def _fleet(settings: Settings, tmp_path: Path, bucket: str, s3_env: dict[str, str],
           **more) -> Settings:
    """The fleet's settings for a crawl storing into ``bucket`` of the loopback S3 server (never
    AWS: S3_ENDPOINT_URL is always the test server's)."""
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    return settings.with_overrides(extract_rules=f"@{rules}", media_store=f"s3://{bucket}/shop",
                                   s3_endpoint_url=s3_env["S3_ENDPOINT_URL"],
                                   idle_exit_s=3.0, concurrency=4, **more)


def _parts_up(server, bucket: str) -> bool:
    """Whether a multipart upload into ``bucket`` has a part up (not before it exists)."""
    try:
        return any(upload["parts"] for upload in server.pending_uploads(bucket))
    except ClientError as exc:  # NoSuchBucket: the worker has not created it yet
        return exc.response["Error"]["Code"] != "NoSuchBucket" and False


def test_a_catalogue_crawl_stores_every_referenced_asset_once_by_hash(
        settings, redis_client, media_site, tmp_path, s3_env, s3_bucket):
    fleet = _fleet(settings, tmp_path, s3_bucket, s3_env)
    with Producer(settings, redis_client) as producer:
        producer.submit(media_site.pages())
    with WorkerThread(fleet) as pages, WorkerThread(fleet.with_overrides(
            media_worker=True, cache_ttl_s=0)) as downloads:
        assert pages.join(90) == 0 and downloads.join(90) == 0

    expected = media_site.assets()  # url -> (sha256, size, type)
    pages_by_url = {r["url"]: r for r in results(redis_client)}
    assert set(pages_by_url) == set(media_site.pages())
    referenced = Counter(url for r in pages_by_url.values() for url in r["assets"])
    assert set(referenced) == set(expected)
    assert referenced[media_site.url("/images/shared.png")] == 2  # two pages, one request

    records = assets(redis_client)
    by_url = Counter(r["url"] for r in records)
    assert by_url == Counter(dict.fromkeys(expected, 1)), "one asset record per asset URL"
    store = open_store(fleet)
    for record in records:
        sha, size, media_type = expected[record["url"]]
        assert (record["sha256"], record["size"], record["content_type"]) == (sha, size,
                                                                              media_type)
        body = store.read(record["key"])
        assert hashlib.sha256(body).hexdigest() == sha and len(body) == size
        assert record["page"] in pages_by_url and record["url"] in pages_by_url[
            record["page"]]["assets"]
    # The same bytes behind two URLs: two records, one object.
    keys = {r["url"]: r["key"] for r in records}
    assert keys[media_site.url("/images/copy/p3.png")] == keys[media_site.url("/images/p2-0.png")]
    assert sorted(r["stored"] for r in records).count("existing") == 1
    stored = store.keys("")
    assert len(stored) == len({sha for sha, _size, _type in expected.values()})
    assert all(k.startswith("shop/") for k in stored)


def test_a_download_worker_killed_mid_upload_loses_nothing_and_leaves_no_half_object(
        settings, redis_client, media_site, tmp_path, s3_env, s3_bucket, s3_server):
    """A 40 MiB asset uploaded in 5 MiB parts: the worker is killed with -9 once the first
    part is up; another download worker takes the redelivery and stores it whole, once."""
    fleet = _fleet(settings, tmp_path, s3_bucket, s3_env)
    large = media_site.url("/big/large.bin")
    with Producer(settings, redis_client) as producer:
        producer.submit([large], extra={"media": {"kind": "file", "page": "http://x.test/"}})
    env = {**s3_env, "MEDIA_STORE": f"s3://{s3_bucket}", "MEDIA_MULTIPART_BYTES": "5MiB",
           "MEDIA_MAX_BYTES": "*=100MB", "MEDIA_TYPES": "*"}
    store = open_store(fleet.with_overrides(media_store=f"s3://{s3_bucket}"))
    first = start_worker_process(settings, "--media", "--idle-exit", "30", env=env)
    try:
        assert wait_for(lambda: _parts_up(s3_server, s3_bucket), 60, 0.02), output_of(first)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert store.keys("") == [], "a killed upload leaves no object"
        second = start_worker_process(settings, "--media", "--idle-exit", "3", env=env)
        try:
            assert second.wait(120) == 0, output_of(second)
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        if first.poll() is None:
            first.kill()
    records = assets(redis_client)
    assert [r["url"] for r in records] == [large]
    sha = hashlib.sha256(media_site.file("/big/large.bin").read_bytes()).hexdigest()
    assert records[0]["sha256"] == sha and records[0]["size"] == 40 * 2**20
    assert len(store.keys("")) == 1
    assert hashlib.sha256(store.read(records[0]["key"])).hexdigest() == sha


def test_a_two_gigabyte_asset_is_refused_by_its_cap_without_filling_memory_or_disk(
        settings, redis_client, media_site, tmp_path, s3_env, s3_bucket):
    spool = tmp_path / "spool"
    spool.mkdir()
    fleet = _fleet(settings, tmp_path, s3_bucket, s3_env, media_spool_dir=str(spool),
                   media_worker=True, cache_ttl_s=0)
    huge = media_site.url("/big/huge.mp4")
    offset = media_site.log_offset()
    with Producer(settings, redis_client) as producer:
        producer.submit([huge], extra={"media": {"kind": "video", "page": "http://x.test/"}})
    with WorkerThread(fleet) as worker:
        assert worker.join(60) == 0
    failures = [json.loads(f[b"json"]) for _id, f in redis_client.xrange("failures")]
    assert [(f["url"], f["reason"]) for f in failures] == [(huge, "fetch_too_large")]
    assert assets(redis_client) == [] and list(spool.iterdir()) == []
    assert wait_for(lambda: any(path.endswith("huge.mp4") for path, _s, _b in
                                media_site.requests(offset)), 10)
    sent = [b for path, _status, b in media_site.requests(offset) if path.endswith("huge.mp4")]
    assert sent and max(sent) < 16 * 2**20, sent  # what fit in socket buffers, not 2 GB


def test_a_media_request_the_worker_cannot_read_is_dead_lettered_with_its_reason(
        settings, redis_client, media_site, tmp_path, s3_env, s3_bucket):
    fleet = _fleet(settings, tmp_path, s3_bucket, s3_env, media_worker=True, cache_ttl_s=0)
    png, pdf = media_site.url("/images/p0-0.png"), media_site.url("/manuals/p0.pdf")
    with Producer(settings, redis_client) as producer:  # a PDF asked for as an image
        producer.submit([pdf], extra={"media": {"kind": "image", "page": "http://x.test/"}})
        producer.submit([png], extra={"media": {"kind": "sound", "page": "http://x.test/"}})
    with WorkerThread(fleet) as worker:
        assert worker.join(60) == 0
    failures = {f["url"]: f for f in (json.loads(e[b"json"]) for _i, e in
                                      redis_client.xrange("failures"))}
    assert failures[pdf]["reason"] == "fetch_type_refused"
    assert failures[png]["reason"] == "bad_message" and "media.kind" in failures[png]["last_error"]
    assert assets(redis_client) == []


def test_a_worker_started_with_a_bad_media_store_exits_2_naming_it(settings, tmp_path):
    proc = start_worker_process(settings, "--media", env={"MEDIA_STORE": "s3://"})
    try:
        assert proc.wait(30) == 2
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert "MEDIA_STORE" in output_of(proc)


def test_a_site_is_not_hit_harder_because_it_also_serves_images(
        settings, redis_client, media_site, tmp_path, s3_env, s3_bucket):
    """RATE_LIMIT 4/second for the site: its pages (an HTTP worker) and their assets (a
    download worker, running at the same time) share one limit on the wire."""
    fleet = _fleet(settings, tmp_path, s3_bucket, s3_env, rate_limit=(4, 1000))
    offset = media_site.log_offset()
    with Producer(settings, redis_client) as producer:
        producer.submit(media_site.pages())
    with WorkerThread(fleet) as pages, WorkerThread(fleet.with_overrides(
            media_worker=True, cache_ttl_s=0)) as downloads:
        assert pages.join(120) == 0 and downloads.join(120) == 0
    expected = media_site.assets()
    wanted = len(expected) + len(media_site.pages())  # nginx logs a request once it is done
    assert wait_for(lambda: len(media_site.timed_requests(offset)) >= wanted, 10)
    logged = media_site.timed_requests(offset)
    assert Counter(path for _at, path, _status, _sent in logged if path.startswith(
        ("/images/", "/manuals/"))) == Counter(dict.fromkeys(
            (urlsplit(url).path for url in expected), 1))
    times = sorted(at for at, _path, _status, _sent in logged)
    # nginx logs when a response ends: allow it 100 ms of jitter against the limit's 1 s.
    busiest = max(sum(1 for t in times if start <= t < start + 0.9) for start in times)
    assert busiest <= 4, (busiest, logged)
    kinds = [("asset" if path.startswith(("/images/", "/manuals/")) else "page")
             for _at, path, _status, _sent in sorted(logged)]
    first_asset = kinds.index("asset")
    assert "page" in kinds[first_asset:], "pages and assets took turns, not one after the other"
    assert len(assets(redis_client)) == len(expected)


def test_a_jobs_media_keeps_its_quota_and_prefix_and_every_asset_ends_once(
        settings, redis_client, media_site, tmp_path, s3_env, s3_bucket):
    """A job whose run may store half the catalogue's image bytes under ``shop/``: the assets
    past the quota are dead-lettered ``media_quota``, the rest stored under the prefix, each
    URL ends once, and the run's counters add up (known = results + assets + failed)."""
    images = {url: size for url, (_sha, size, mime) in media_site.assets().items()
              if mime.startswith("image/")}
    quota = sum(images.values()) // 2
    registry = JobRegistry(redis_client)
    registry.submit(parse_job({
        "name": "shop", "seeds": {"urls": media_site.pages()},
        "rules": [{"name": "product", "path": r"^/catalogue/p\d+\.html$",
                   "media": {"css": "img.product::attr(src)", "types": ["image/*"]}}],
        "media": {"quota": str(quota), "prefix": "shop/"}}))
    run = registry.start_run("shop")
    with Producer(settings, redis_client) as producer:
        producer.submit(media_site.pages(), job=run)
    fleet = settings.with_overrides(media_store=f"s3://{s3_bucket}", idle_exit_s=3.0,
                                    s3_endpoint_url=s3_env["S3_ENDPOINT_URL"], concurrency=2)
    with WorkerThread(fleet) as pages, WorkerThread(fleet.with_overrides(
            media_worker=True, cache_ttl_s=0)) as downloads:
        assert pages.join(90) == 0 and downloads.join(90) == 0
    records = assets(redis_client)
    refused = [json.loads(f[b"json"]) for _id, f in redis_client.xrange("failures")]
    assert {r["reason"] for r in refused} <= {"media_quota"}
    assert Counter([r["url"] for r in records] + [f["url"] for f in refused]) == Counter(
        dict.fromkeys(images, 1))
    assert refused and records, "some within the quota, some past it"
    assert sum(r["size"] for r in records) <= quota  # each download counts, stored or not
    assert all(r["key"].startswith("shop/") and (r["job"], r["run"]) == ("shop", run.run)
               for r in records)
    counters = registry.counters(run)
    assert counters["known"] == counters.get("results", 0) + counters.get(
        "assets", 0) + counters.get("failed", 0), counters
    assert counters["assets"] == len(records) and counters["results"] == len(media_site.pages())


HANDLERS = '''
from scrape_fleet import Router

router = Router()


@router.default
def product(page):
    yield {"title": page.css("h1::text").get()}
    yield page.download(page.css("img.product::attr(src)").getall(), kind="image",
                        meta={"product": page.url})
    yield page.download(page.css("a.manual::attr(href)").get(), kind="document",
                        types="application/pdf")
'''


def test_a_handlers_downloads_are_stored_with_their_meta(
        settings, redis_client, media_site, tmp_path, s3_env, s3_bucket, monkeypatch):
    (tmp_path / "shop_handlers.py").write_text(HANDLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    fleet = settings.with_overrides(media_store=f"s3://{s3_bucket}", idle_exit_s=3.0,
                                    s3_endpoint_url=s3_env["S3_ENDPOINT_URL"], concurrency=2,
                                    handlers="shop_handlers:router")
    with Producer(settings, redis_client) as producer:
        producer.submit(media_site.pages())
    with WorkerThread(fleet) as pages, WorkerThread(fleet.with_overrides(
            media_worker=True, cache_ttl_s=0)) as downloads:
        assert pages.join(90) == 0 and downloads.join(90) == 0
    records = {r["url"]: r for r in assets(redis_client)}
    assert set(records) == set(media_site.assets())
    for url, record in records.items():
        assert record["sha256"] == media_site.assets()[url][0]
        if record["kind"] == "image":
            assert record["meta"]["product"] in media_site.pages()
        else:
            assert record["content_type"] == "application/pdf" and "meta" not in record
    pages_by_url = {r["url"]: r for r in results(redis_client)}
    assert sorted(r["items"][0]["title"] for r in pages_by_url.values()) == [
        f"Product {i}" for i in range(len(media_site.pages()))]
    assert {url for r in pages_by_url.values() for url in r["assets"]} == set(records)


def test_a_request_naming_a_tool_runs_it_only_when_media_tools_allows_it(
        settings, redis_client, media_site, tmp_path, s3_env, s3_bucket):
    clip = os.urandom(200_000)
    (media_site.root / "video").mkdir()
    (media_site.root / "video" / "clip.mp4").write_bytes(clip)
    (media_site.root / "video" / "other.mp4").write_bytes(clip[::-1])
    by_tool = {media_site.url("/video/clip.mp4"): "yt-dlp",
               media_site.url("/video/other.mp4"): "gallery-dl"}
    with Producer(settings, redis_client) as producer:
        for url, tool in by_tool.items():
            producer.submit([url], extra={"media": {"kind": "video", "tool": tool,
                                                    "page": "http://x.test/"}})
    fleet = _fleet(settings, tmp_path, s3_bucket, s3_env, media_worker=True, cache_ttl_s=0,
                   media_tools=("yt-dlp",))
    with WorkerThread(fleet) as worker:
        assert worker.join(90) == 0
    [record] = assets(redis_client)
    assert (record["url"], record["sha256"], record["content_type"]) == (
        media_site.url("/video/clip.mp4"), hashlib.sha256(clip).hexdigest(), "video/mp4")
    [refused] = [json.loads(f[b"json"]) for _id, f in redis_client.xrange("failures")]
    assert (refused["url"], refused["reason"]) == (media_site.url("/video/other.mp4"),
                                                   "fetch_tool_refused")
