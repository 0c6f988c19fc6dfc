"""Asset records (stream ``assets``) through the sinks, against a real Redis and PostgreSQL:
each reaches the files sink and the PostgreSQL sink exactly once, also when a sink dies between
its write and its ack; the view ``page_assets`` links a page's row to its assets; an entry
without a url is logged and skipped with nothing after it lost; and the workers cap ``assets``
only while no sink is registered."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
import pytest
import redis
from psycopg.rows import dict_row

from common.sink.files import FileSink, job_dir, record_dir
from common.sink.postgres import PostgresSink
from common.sink.postgres_assets import asset_names
from common.sink.reader import Entry, SinkReader, parse_id, retire, run_sink
from common.store.keys import ASSETS_STREAM, RESULTS_STREAM, SINKS, sink_group
from common.store.results import ResultStore
from tests.sink.parts import lines, open_parts
from tests.sink.test_postgres import T0, TABLE, result

PAGE = "https://shop.test/p/{}"


def asset(n: int, page: str, **fields: Any) -> dict[str, Any]:
    """An asset record as the media worker writes it (design of issue 30)."""
    digest = f"{n:064x}"
    record = {"url": f"https://cdn.test/img/{n}.png", "final_url": f"https://cdn.test/i/{n}.png",
              "page": page, "kind": "image", "status": 200, "content_type": "image/png",
              "size": 5_000_000_000 + n, "sha256": digest,
              "key": f"sha256/{digest[:2]}/{digest[2:4]}/{digest}.png", "store": "s3://media",
              "stored": "new" if n % 2 else "existing", "resumed": 0, "elapsed_ms": 12,
              "fetched_at": T0 / 1000 + n, "worker": "w-1", "meta": {"alt": f"picture {n}"}}
    record.update(fields)
    return record


def page(n: int, **fields: Any) -> dict[str, Any]:
    return {"url": PAGE.format(n), "status": 200, "title": f"Page {n}", "fetched_at": T0 / 1000,
            **fields}


def xadd(client: redis.Redis, stream: str, record: dict[str, Any] | bytes) -> str:
    data = record if isinstance(record, bytes) else orjson.dumps(record)
    return client.xadd(stream, {"json": data}).decode()


def drain(client: redis.Redis, sink: Any, batch: int = 4) -> int:
    """Run ``sink`` until it found nothing new for half a second; its exit code."""
    reader = SinkReader(client, sink.name, batch=batch)
    return run_sink(reader, sink, threading.Event(), idle_exit_s=0.5)


def asset_rows(url: str, table: str = "assets") -> dict[str, dict[str, Any]]:
    """Every row of the assets table by URL, with ``xmin`` (the transaction that wrote it)."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        query = psycopg.sql.SQL("SELECT *, xmin::text AS xmin FROM {}").format(
            psycopg.sql.Identifier(table))
        return {row["url"]: row for row in conn.execute(query)}


def view(url: str, job: str = "", page_url: str | None = None) -> list[tuple[str, str]]:
    """(page_url, asset_url) pairs of ``page_assets`` for a job (one page's, if given)."""
    with psycopg.connect(url) as conn:
        return sorted(conn.execute(
            "SELECT page_url, asset_url FROM page_assets WHERE job = %s AND "
            "(%s::text IS NULL OR page_url = %s)", (job, page_url, page_url)).fetchall())


def test_one_read_takes_all_three_streams_and_retire_drops_the_assets_group(redis_client):
    reader = SinkReader(redis_client, "files", batch=2)
    reader.register()
    results = [xadd(redis_client, RESULTS_STREAM, page(n)) for n in range(3)]
    assets = [xadd(redis_client, ASSETS_STREAM, asset(n, PAGE.format(0))) for n in range(3)]

    first = next(reader.batches(threading.Event()))

    assert [(e.stream, e.id) for e in first] == (
        [(RESULTS_STREAM, i) for i in results[:2]] + [(ASSETS_STREAM, i) for i in assets[:2]])
    assert first[2].record == asset(0, PAGE.format(0))
    reader.ack(first)
    assert redis_client.xpending(ASSETS_STREAM, sink_group("files"))["pending"] == 0
    assert retire(redis_client, "files")
    assert redis_client.xinfo_groups(ASSETS_STREAM) == []


def test_asset_entries_reach_the_files_sink_once_even_when_it_dies_between_write_and_ack(
        redis_client, tmp_path):
    pages = [xadd(redis_client, RESULTS_STREAM, page(n)) for n in range(3)]
    jobbed = page(9, job="shop", run=2)
    pages.append(xadd(redis_client, RESULTS_STREAM, jobbed))
    records = [asset(n, PAGE.format(n % 3)) for n in range(10)]
    records.append(asset(10, jobbed["url"], job="shop", run=2))
    assets = [xadd(redis_client, ASSETS_STREAM, r) for r in records]
    sink = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    reader = SinkReader(redis_client, sink.name, batch=4)
    reader.register()
    first = next(reader.batches(threading.Event()))
    sink.write(first)
    del sink, reader  # killed after the fsync, before the XACK: the batch stays pending
    assert redis_client.xpending(ASSETS_STREAM, sink_group("files"))["pending"] == 4

    restarted = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    assert restarted.high[ASSETS_STREAM] == parse_id(assets[3])
    assert drain(redis_client, restarted) == 0

    assert restarted.skipped == 8  # the replay: 4 pages and 4 assets written before
    got = [(line["stream"], line["id"]) for line in lines(tmp_path)]
    assert sorted(got) == sorted([(RESULTS_STREAM, i) for i in pages[:3]]
                                 + [(ASSETS_STREAM, i) for i in assets[:10]])
    assert [line for line in lines(tmp_path) if line["stream"] == ASSETS_STREAM] == [
        {"stream": ASSETS_STREAM, "id": i, **r} for i, r in zip(assets[:10], records[:10],
                                                                  strict=True)]
    shop = job_dir(tmp_path, "shop", 2)
    assert record_dir(tmp_path, records[10]) == shop  # an asset lands beside its page
    assert [(line["stream"], line["url"]) for line in lines(shop)] == [
        (RESULTS_STREAM, jobbed["url"]), (ASSETS_STREAM, records[10]["url"])]
    assert open_parts(tmp_path) == []
    assert redis_client.xlen(ASSETS_STREAM) == redis_client.xlen(RESULTS_STREAM) == 0


def test_asset_entries_reach_postgres_once_even_when_it_dies_between_write_and_ack(
        redis_client, postgres_url):
    records = [asset(n, PAGE.format(n % 3)) for n in range(10)]
    ids = [xadd(redis_client, ASSETS_STREAM, r) for r in records]
    sink = PostgresSink(postgres_url, TABLE)
    reader = SinkReader(redis_client, sink.name, batch=4)
    reader.register()
    sink.write(next(reader.batches(threading.Event())))
    sink.close()  # the process is gone: its connection closed, nothing acknowledged
    del reader
    before = asset_rows(postgres_url)
    assert sorted(before) == sorted(r["url"] for r in records[:4])

    assert drain(redis_client, PostgresSink(postgres_url, TABLE)) == 0

    rows = asset_rows(postgres_url)
    assert sorted(rows) == sorted(r["url"] for r in records)  # each exactly once
    assert {url: rows[url] for url in before} == before  # the replay changed no row
    assert {url: row["stream_id"] for url, row in rows.items()} == {
        r["url"]: i for r, i in zip(records, ids, strict=True)}
    row, record = rows[records[7]["url"]], records[7]
    assert (row["job"], row["run"], row["page_url"], row["kind"], row["status"]) == (
        "", 0, PAGE.format(1), "image", 200)
    assert (row["content_type"], row["size"], row["sha256"], row["key"], row["store"]) == (
        "image/png", 5_000_000_007, record["sha256"], record["key"], "s3://media")
    assert row["stored"] == "new" and rows[records[6]["url"]]["stored"] == "existing"
    assert row["fetched_at"] == datetime.fromtimestamp(record["fetched_at"], UTC)
    assert row["record"] == record and row["written_at"] is not None
    assert redis_client.xlen(ASSETS_STREAM) == 0


def test_an_older_or_replayed_asset_entry_never_replaces_a_newer_one(postgres_url):
    sink = PostgresSink(postgres_url, TABLE)
    try:
        url = asset(1, PAGE.format(1))["url"]
        sink.write([Entry(ASSETS_STREAM, f"{T0 + 5}-0", asset(1, PAGE.format(1), size=5)),
                    Entry(ASSETS_STREAM, f"{T0 + 9}-0", asset(1, PAGE.format(1), size=9))])
        assert asset_rows(postgres_url)[url]["size"] == 9  # one URL twice: the newest kept
        before = asset_rows(postgres_url)
        sink.write([Entry(ASSETS_STREAM, f"{T0 + 9}-0", asset(1, PAGE.format(1), size=9)),
                    Entry(ASSETS_STREAM, f"{T0 + 7}-0", asset(1, PAGE.format(1), size=7))])
        assert asset_rows(postgres_url) == before
        sink.write([Entry(ASSETS_STREAM, f"{T0 + 10}-0", asset(1, PAGE.format(1), size=10))])
        assert asset_rows(postgres_url)[url]["size"] == 10
    finally:
        sink.close()


def test_page_assets_shows_a_pages_assets_once_both_rows_exist_and_never_across_jobs(
        postgres_url):
    sink = PostgresSink(postgres_url, TABLE)
    try:
        a, b, c = (PAGE.format(n) for n in "abc")
        sink.write([result(a, T0), result(b, T0 + 1), result(a, T0 + 2, job="shop", run=1),
                    Entry(ASSETS_STREAM, f"{T0 + 3}-0", asset(1, a)),
                    Entry(ASSETS_STREAM, f"{T0 + 4}-0", asset(2, a)),
                    Entry(ASSETS_STREAM, f"{T0 + 5}-0", asset(3, b)),
                    Entry(ASSETS_STREAM, f"{T0 + 6}-0", asset(4, c)),  # its page comes later
                    Entry(ASSETS_STREAM, f"{T0 + 7}-0", asset(5, a, job="shop", run=1))])
        img = "https://cdn.test/img/{}.png"

        assert view(postgres_url, page_url=a) == [(a, img.format(1)), (a, img.format(2))]
        assert view(postgres_url) == [(a, img.format(1)), (a, img.format(2)), (b, img.format(3))]
        assert view(postgres_url, "shop") == [(a, img.format(5))]
        sink.write([result(c, T0 + 8)])
        assert view(postgres_url, page_url=c) == [(c, img.format(4))]
        with psycopg.connect(postgres_url) as conn:
            [(status, title, size)] = conn.execute(
                "SELECT page_status, title, size FROM page_assets WHERE asset_url = %s",
                (img.format(3),)).fetchall()
            indexed = {r[0] for r in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'assets'")}
        assert (status, title, size) == (200, f"Title of {b}", 5_000_000_003)
        assert any("(sha256)" in d for d in indexed)
        assert any("(page_url, job, run)" in d for d in indexed)
    finally:
        sink.close()


def test_a_results_table_of_another_name_gets_assets_of_its_own_name(postgres_url):
    assert asset_names(TABLE) == ("assets", "page_assets")
    assert asset_names("shop_pages") == ("shop_pages_assets", "shop_pages_page_assets")
    with pytest.raises(ValueError, match="too long"):
        asset_names("x" * 60)
    sink = PostgresSink(postgres_url, "shop_pages")
    try:
        sink.write([result(PAGE.format(1), T0),
                    Entry(ASSETS_STREAM, f"{T0 + 1}-0", asset(1, PAGE.format(1)))])
    finally:
        sink.close()
    assert list(asset_rows(postgres_url, "shop_pages_assets")) == [asset(1, PAGE.format(1))["url"]]
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM shop_pages_page_assets").fetchone() == (1,)
        assert conn.execute("SELECT to_regclass('assets')").fetchone() == (None,)


def test_an_asset_entry_without_url_is_logged_and_skipped_and_nothing_after_it_is_lost(
        redis_client, postgres_url, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    files = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    postgres = PostgresSink(postgres_url, TABLE)
    for sink in (files, postgres):
        SinkReader(redis_client, sink.name).register()
    good = [asset(n, PAGE.format(n)) for n in range(6)]
    no_url = {k: v for k, v in asset(99, PAGE.format(0)).items() if k != "url"}
    ids = [xadd(redis_client, ASSETS_STREAM, r) for r in good[:3]]
    bad_id = xadd(redis_client, ASSETS_STREAM, no_url)
    broken_id = xadd(redis_client, ASSETS_STREAM, b"{not json")
    ids += [xadd(redis_client, ASSETS_STREAM, r) for r in good[3:]]

    assert drain(redis_client, postgres, batch=2) == 0
    assert drain(redis_client, files, batch=2) == 0

    assert sorted(asset_rows(postgres_url)) == sorted(r["url"] for r in good)
    assert f"skipping assets entry {bad_id}: assets entry {bad_id} has no url" in caplog.text
    assert f"assets entry {broken_id} has no JSON record" in caplog.text
    # The files sink keeps every JSON record as it came (it needs no url); not the broken one.
    assert [line["id"] for line in lines(tmp_path)] == [*ids[:3], bad_id, *ids[3:]]
    for name in (files.name, postgres.name):
        assert redis_client.xpending(ASSETS_STREAM, sink_group(name))["pending"] == 0
    assert redis_client.xlen(ASSETS_STREAM) == 0  # both acknowledged all: trimmed


def test_workers_cap_the_assets_stream_only_while_no_sink_is_registered(redis_client,
                                                                        small_stream_nodes):
    store = ResultStore(redis_client, maxlen=5)
    for n in range(30):
        store.record(asset(n, PAGE.format(n)), stream=ASSETS_STREAM)
    assert redis_client.xlen(ASSETS_STREAM) <= 5 + small_stream_nodes

    SinkReader(redis_client, "files").register()
    assert redis_client.smembers(SINKS) == {b"files"}
    before = redis_client.xlen(ASSETS_STREAM)
    for n in range(30, 60):
        store.record(asset(n, PAGE.format(n)), stream=ASSETS_STREAM)
    assert redis_client.xlen(ASSETS_STREAM) == before + 30  # the sink trims it, not MAXLEN
