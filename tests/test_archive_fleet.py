"""ARCHIVE=warc through the real fleet: worker processes on RabbitMQ and Redis crawl the loopback
test site with extraction rules; every WARC file passes ``warcio check``, ``warcio index``
lists every page's response, the re-parse tool gives every result's ``data`` back byte for
byte, and a worker killed with kill -9 leaves nothing behind that the next one does not mend."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import redis
from warcio.archiveiterator import ArchiveIterator

from common.core.config import Settings
from common.core.urls import canonicalize
from common.intake.producer import Producer
from tests.helpers import REPO_ROOT, TEST_ENV, output_of, start_worker_process, wait_for
from tests.work.test_extract import SHOP_RULES, detail_html, listing_html

WARCIO = str(Path(sys.executable).parent / "warcio")
HTML = {"Content-Type": "text/html; charset=utf-8"}


def _stored(client: redis.Redis, stream: str = "results") -> list[dict]:
    """Each record of ``stream`` as orjson reads the bytes the worker stored."""
    return [orjson.loads(fields[b"json"]) for _id, fields in client.xrange(stream)]


def _seed(settings: Settings, client: redis.Redis, urls: list[str]) -> list[str]:
    with Producer(settings, client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()
    return [canonicalize(url) for url in urls]


def _workers(settings: Settings, env: dict[str, str], count: int, *args: str) -> list:
    return [start_worker_process(settings, "--concurrency", "4", *args, env=env)
            for _ in range(count)]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def _response_at(directory: Path, ref: dict) -> tuple[str, str, int]:
    """(type, target URI, status) of the record a result's reference names, read alone."""
    with open(directory / ref["file"], "rb") as stream:
        stream.seek(ref["offset"])
        records = ArchiveIterator(stream)
        record = next(iter(records))
        record.content_stream().read()
        records.read_to_end(record)
        assert records.get_record_length() == ref["length"]
        return (record.rec_type, record.rec_headers.get_header("WARC-Target-URI"),
                int(record.http_headers.get_statuscode()))


def _warcio(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WARCIO, *args], capture_output=True, text=True, timeout=120)


def _serve_shop(site) -> list[str]:
    site.route("/shop/", lambda _r: (200, HTML, listing_html().encode()))
    for n in (1, 2, 3):
        site.route(f"/shop/item/{n}", lambda _r, n=n: (200, HTML, detail_html(n).encode()))
    site.route("/shop/item/30", lambda _r: (200, {**HTML, "Content-Encoding": "gzip"},
                                            gzip.compress(detail_html(3).encode())))
    site.route("/go/2", lambda _r: (302, {"Location": "/shop/item/2"}, b""))
    return [site.url("/shop/"), site.url("/shop/item/30"), site.url("/go/2")] + \
        [site.url(f"/shop/item/{n}") for n in (1, 3)] + \
        [site.page_url(n) for n in range(1, 13)]


def test_a_crawl_archives_every_page_and_reparse_gives_back_each_results_data(
        settings, redis_client, site, tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text(SHOP_RULES)
    archive_dir = tmp_path / "archive"
    urls = _seed(settings, redis_client, _serve_shop(site) + [site.url("/status/404")])
    env = {"ARCHIVE": "warc", "ARCHIVE_DIR": str(archive_dir), "EXTRACT_RULES": f"@{rules}"}
    workers = _workers(settings, env, 2, "--idle-exit", "2")
    try:
        for worker in workers:
            assert worker.wait(timeout=90) == 0, output_of(worker)[-3000:]
    finally:
        for worker in workers:
            _stop(worker)

    results = {r["url"]: r for r in _stored(redis_client)}
    failures = {r["url"]: r for r in _stored(redis_client, "failures")}
    assert set(results) | set(failures) == set(urls)
    assert not list(archive_dir.glob("*.open"))  # both workers closed and renamed theirs
    files = sorted(archive_dir.glob("*.warc.gz"))
    named = {r["archive"]["file"] for r in [*results.values(), *failures.values()]}
    assert named == {path.name for path in files}
    checked = _warcio("check", *map(str, files))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    index = [json.loads(line) for line in _warcio("index", "-f", "warc-type,warc-target-uri",
                                                  *map(str, files)).stdout.splitlines()]
    responded = {entry["warc-target-uri"] for entry in index if entry["warc-type"] == "response"}
    assert {r["final_url"] for r in results.values()} | {site.url("/go/2")} <= responded

    missing = failures[site.url("/status/404")]  # a dead-lettered 404 points at its response
    assert _response_at(archive_dir, missing["archive"])[1:] == (site.url("/status/404"), 404)
    for record in results.values():
        assert _response_at(archive_dir, record["archive"]) == (
            "response", record["final_url"], record["status"])
    assert results[site.url("/go/2")]["data"]["sku"] == "SKU-0002"
    assert results[site.url("/shop/item/30")]["data"]["title"] == "Green Pot"  # gzip on the wire

    out = tmp_path / "again.jsonl"
    again = subprocess.run([sys.executable, "reparse.py", str(archive_dir), "-o", str(out)],
                           cwd=REPO_ROOT, env={**os.environ, **TEST_ENV, **env},
                           capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stderr
    by_ref = {}
    for line in out.read_bytes().splitlines():
        record = orjson.loads(line)
        by_ref[(record["archive"]["file"], record["archive"]["offset"])] = record
    for url, result in {**results, **failures}.items():
        reparsed = by_ref[(result["archive"]["file"], result["archive"]["offset"])]
        assert reparsed["url"] == url
        if url in results:  # the bytes of data and data_errors, as the worker stored them
            for key in ("data", "data_errors"):
                assert orjson.dumps(reparsed.get(key)) == orjson.dumps(result.get(key)), url
    assert sum("data" in r for r in results.values()) == 5  # the shop's five pages


@pytest.mark.slow
def test_a_worker_killed_mid_crawl_leaves_a_file_the_next_worker_mends(
        settings, redis_client, site, tmp_path):
    archive_dir = tmp_path / "archive"
    env = {"ARCHIVE": "warc", "ARCHIVE_DIR": str(archive_dir)}
    urls = _seed(settings, redis_client, [site.url(f"/slow/0.3?w={i}") for i in range(24)])
    doomed = _workers(settings, env, 1)[0]
    try:
        assert wait_for(lambda: redis_client.xlen("results") >= 6, 30), output_of(doomed)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
    finally:
        _stop(doomed)
    orphans = list(archive_dir.glob("*.warc.gz.open"))
    assert len(orphans) == 1
    # As if the kill had come in the middle of a write: half a record at the end.
    partial = gzip.compress(b"WARC/1.1\r\nWARC-Type: response\r\n" + b"x" * 4000)
    with open(orphans[0], "ab") as handle:
        handle.write(partial[: len(partial) // 2])

    finisher = _workers(settings, env, 1, "--idle-exit", "2")[0]
    try:
        assert finisher.wait(timeout=90) == 0, output_of(finisher)[-3000:]
    finally:
        _stop(finisher)
    assert "left open by a stopped worker" in output_of(finisher)

    results = _stored(redis_client)
    assert sorted(r["url"] for r in results) == sorted(urls)  # each URL exactly once
    assert not list(archive_dir.glob("*.open"))
    recovered = archive_dir / orphans[0].name.removesuffix(".open")
    assert any(r["archive"]["file"] == recovered.name for r in results)
    for record in results:  # every reference names a whole response record of its URL
        assert _response_at(archive_dir, record["archive"]) == ("response", record["url"], 200)
    checked = _warcio("check", *map(str, sorted(archive_dir.glob("*.warc.gz"))))
    assert checked.returncode == 0, checked.stdout + checked.stderr
