"""The PostgreSQL sink against a real PostgreSQL (fixture ``postgres_url``: an empty database on
the session's server): one row per URL, a replayed batch changes nothing, the newest outcome
wins whatever the order, and a kill -9 in the middle of a write leaves the whole batch or none
of it."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from common.sink.postgres import PostgresSink
from common.sink.reader import Entry
from devtools.services import LocalPostgres, PostgresService, ServicesUnavailable, postgres_service
from devtools.services.base import free_port
from tests.helpers import REPO_ROOT

TABLE = "crawl_results"
T0 = 1732230000000  # ms: 2024-11-21T23:00:00Z


def result(url: str, ms: int, seq: int = 0, *, links: int = 3, **fields: Any) -> Entry:
    """A ``results`` entry as the workers write it."""
    record = {"url": url, "final_url": url, "status": 200, "title": f"Title of {url}",
              "links": [f"{url}link/{i}" for i in range(links)], "links_count": links,
              "content_type": "text/html; charset=utf-8", "bytes": 4321, "truncated": False,
              "fetched_at": ms / 1000, "elapsed_ms": 12.5, "worker": "w-1", "queue":
              "url_queue_ttl", "depth": 0, "attempts": 1, "cached": False, "error": None}
    record.update(fields)
    return Entry("results", f"{ms}-{seq}", record)


def failure(url: str, ms: int, seq: int = 0, **fields: Any) -> Entry:
    """A ``failures`` entry (a confirmed dead letter)."""
    when = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    record = {"url": url, "outcome": "dead_letter", "reason": "max_retries", "attempts": 4,
              "last_status": 503, "last_error": "HTTP 503", "first_failure": when,
              "last_failure": when}
    record.update(fields)
    return Entry("failures", f"{ms}-{seq}", record)


def table_rows(url: str, table: str = TABLE) -> dict[str, dict[str, Any]]:
    """Every row by URL, with ``xmin`` (the transaction that last wrote it)."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        query = psycopg.sql.SQL("SELECT *, xmin::text AS xmin FROM {}").format(
            psycopg.sql.Identifier(table))
        return {row["url"]: row for row in conn.execute(query)}


@pytest.fixture
def sink(postgres_url: str):
    sink = PostgresSink(postgres_url, TABLE)
    try:
        yield sink
    finally:
        sink.close()


def test_results_and_failures_become_one_row_per_url(sink, postgres_url):
    entries = [result(f"https://a.test/{i}", T0 + i) for i in range(3)]
    entries += [failure(f"https://b.test/{i}", T0 + 10 + i) for i in range(2)]
    sink.write(entries)

    rows = table_rows(postgres_url)
    assert sorted(rows) == sorted(e.record["url"] for e in entries)
    page = rows["https://a.test/1"]
    assert (page["outcome"], page["stream"], page["stream_id"]) == ("result", "results",
                                                                   f"{T0 + 1}-0")
    assert (page["status"], page["title"]) == (200, "Title of https://a.test/1")
    assert page["fetched_at"] == datetime.fromtimestamp((T0 + 1) / 1000, UTC)
    assert page["record"] == entries[1].record
    dead = rows["https://b.test/0"]
    assert (dead["outcome"], dead["stream"], dead["status"], dead["title"]) == (
        "dead_letter", "failures", 503, None)
    assert dead["fetched_at"] == datetime.fromtimestamp((T0 + 10) / 1000, UTC)
    assert dead["record"]["reason"] == "max_retries"
    assert all(row["written_at"] is not None for row in rows.values())


def test_replaying_a_batch_writes_nothing_twice_and_changes_nothing(sink, postgres_url):
    first = [result(f"https://a.test/{i}", T0 + i) for i in range(50)]
    first += [failure(f"https://b.test/{i}", T0 + 100 + i) for i in range(10)]
    sink.write(first)
    before = table_rows(postgres_url)

    sink.write(first)  # a crash before XACK: the same batch again
    assert table_rows(postgres_url) == before  # same rows, same xmin and written_at

    second = [result(f"https://c.test/{i}", T0 + 200 + i) for i in range(5)]
    sink.write(first[-20:] + second)  # a replay overlapping the next batch
    after = table_rows(postgres_url)
    assert len(after) == 65
    assert {url: after[url] for url in before} == before


def test_a_newer_outcome_replaces_an_older_one_and_an_older_one_never_a_newer(sink,
                                                                              postgres_url):
    url = "https://a.test/page"
    sink.write([result(url, T0)])
    sink.write([failure(url, T0 + 1000)])  # later dead-lettered (a recrawl failed)
    assert table_rows(postgres_url)[url]["outcome"] == "dead_letter"

    before = table_rows(postgres_url)
    sink.write([result(url, T0)])  # the old result replayed
    assert table_rows(postgres_url) == before

    sink.write([result(url, T0 + 2000, title="Recrawled")])
    row = table_rows(postgres_url)[url]
    assert (row["outcome"], row["title"], row["stream_id"]) == ("result", "Recrawled",
                                                               f"{T0 + 2000}-0")
    sink.write([failure(url, T0 + 1000), result(url, T0)])  # both older, in one batch
    assert table_rows(postgres_url)[url]["stream_id"] == f"{T0 + 2000}-0"


def test_stream_ids_compare_as_numbers_not_text(sink, postgres_url):
    sink.write([result("https://a.test/ms", 9), result("https://a.test/seq", 5, 2)])
    sink.write([result("https://a.test/ms", 10, title="newer"),
                result("https://a.test/seq", 5, 10, title="newer")])
    rows = table_rows(postgres_url)
    assert rows["https://a.test/ms"]["stream_id"] == "10-0"
    assert rows["https://a.test/seq"]["stream_id"] == "5-10"
    sink.write([result("https://a.test/ms", 9), result("https://a.test/seq", 5, 2)])
    assert table_rows(postgres_url) == rows


def test_one_url_twice_in_a_batch_keeps_the_newest_and_a_tie_goes_to_the_result(sink,
                                                                                postgres_url):
    sink.write([result("https://a.test/1", T0 + 5), failure("https://a.test/1", T0 + 9),
                result("https://a.test/1", T0 + 1)])
    assert table_rows(postgres_url)["https://a.test/1"]["stream_id"] == f"{T0 + 9}-0"
    # Same id in both streams: the result wins, whichever comes first.
    sink.write([failure("https://a.test/2", T0), result("https://a.test/2", T0)])
    sink.write([result("https://a.test/3", T0)])
    sink.write([failure("https://a.test/3", T0)])
    rows = table_rows(postgres_url)
    assert rows["https://a.test/2"]["outcome"] == rows["https://a.test/3"]["outcome"] == "result"


def test_the_table_is_created_when_missing_and_shared_by_a_second_sink(postgres_url):
    table = "Crawl_Results_2"  # quoted as an identifier: the case is kept
    first = PostgresSink(postgres_url, table)
    second = PostgresSink(postgres_url, table, name="postgres-2")
    try:
        first.write([result("https://a.test/1", T0)])
        second.write([result("https://a.test/1", T0), result("https://a.test/2", T0 + 1)])
    finally:
        first.close()
        second.close()
        second.close()  # twice is fine
    assert sorted(table_rows(postgres_url, table)) == ["https://a.test/1", "https://a.test/2"]


def test_a_lost_connection_raises_and_the_next_write_reconnects(sink, postgres_url):
    sink.write([result("https://a.test/1", T0)])
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name = 'scrape-fleet sink:postgres'").fetchone()
    assert killed == (1,)
    batch = [result("https://a.test/2", T0 + 1), result("https://a.test/3", T0 + 2)]
    with pytest.raises(psycopg.OperationalError):
        sink.write(batch)
    assert sorted(table_rows(postgres_url)) == ["https://a.test/1"]
    sink.write(batch)  # what the sink runner does: the same batch again
    assert len(table_rows(postgres_url)) == 3


def test_connection_errors_raise_and_never_show_the_password(postgres_url, caplog):
    caplog.set_level(logging.DEBUG)
    secret = "s3cret-Pa55word"
    unreachable = f"postgresql://fleet:{secret}@127.0.0.1:{free_port()}/fleet"
    with pytest.raises(psycopg.OperationalError) as refused:
        PostgresSink(unreachable, TABLE)
    wrong = postgres_url.replace("://fleet:", f"://fleet:{secret}x", 1)
    with pytest.raises(psycopg.OperationalError) as denied:
        PostgresSink(wrong, TABLE)
    sink = PostgresSink(postgres_url, TABLE)
    sink.close()
    password = postgres_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    for text in (str(refused.value), str(denied.value), caplog.text, repr(sink)):
        assert secret not in text and password not in text
    assert "***" in repr(sink)


def test_a_record_with_nul_characters_is_stored_and_one_without_url_is_skipped(sink,
                                                                               postgres_url,
                                                                               caplog):
    sink.write([result("https://a.test/nul", T0, title="bad\x00title", error="x\x00y"),
                Entry("results", f"{T0 + 1}-0", {"status": 200})])
    rows = table_rows(postgres_url)
    assert list(rows) == ["https://a.test/nul"]
    assert rows["https://a.test/nul"]["title"] == "bad\ufffdtitle"
    assert rows["https://a.test/nul"]["record"]["error"] == "x\ufffdy"
    assert f"{T0 + 1}-0 has no url" in caplog.text


# -- kill -9 in the middle of a write ---------------------------------------------------------

#: Writes the batches of a JSON file with PostgresSink, printing "committed N" after each;
#: "in_transaction" SIGKILLs itself right after the upsert ran inside the transaction (printing
#: how many rows it saw there, uncommitted), "after_commit" once every write returned.
CHILD = r"""
import json, os, signal, sys
import psycopg
from psycopg import sql
from common.sink.postgres import PostgresSink
from common.sink.reader import Entry

url, table, path, mode = sys.argv[1:5]
batches = [[Entry(*item) for item in batch] for batch in json.loads(open(path).read())]
sink = PostgresSink(url, table)
if mode == "in_transaction":
    execute = psycopg.Cursor.execute

    def execute_then_die(self, query, params=None, **kwargs):
        done = execute(self, query, params, **kwargs)
        text = query.as_string(self.connection) if hasattr(query, "as_string") else str(query)
        if text.lstrip().startswith("INSERT INTO"):
            count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
            seen = execute(self.connection.cursor(), count).fetchone()[0]
            print("in transaction, uncommitted rows:", seen, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    psycopg.Cursor.execute = execute_then_die
for batch in batches:
    sink.write(batch)
    print("committed", len(batch), flush=True)
if mode == "after_commit":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _batches_file(tmp_path: Path, batches: list[list[Entry]]) -> Path:
    path = tmp_path / "batches.json"
    path.write_text(json.dumps([[[e.stream, e.id, e.record] for e in b] for b in batches]))
    return path


def _child(url: str, path: Path, mode: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, url, TABLE, str(path), mode],
                            cwd=REPO_ROOT, text=True, stdin=subprocess.DEVNULL, **popen)


def _farm_batch(start: int, size: int, ms: int) -> list[Entry]:
    """Farm-like page results (100 links, ~5 KB of JSON each), one URL per entry."""
    return [result(f"https://farm{i % 7}.test/section/page-{i}.html", ms + i, links=100,
                   description="A page of the farm. " * 8) for i in range(start, start + size)]


@pytest.mark.parametrize("mode", ["in_transaction", "after_commit"])
def test_kill_9_in_a_write_leaves_the_whole_batch_or_nothing(postgres_url, tmp_path, mode):
    batch = [result(f"https://a.test/{i}", T0 + i) for i in range(300)]
    batch += [failure(f"https://b.test/{i}", T0 + 1000 + i) for i in range(100)]
    child = _child(postgres_url, _batches_file(tmp_path, [batch]), mode,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, (out, err)
    rows = table_rows(postgres_url)
    if mode == "in_transaction":
        assert "in transaction, uncommitted rows: 400" in out, (out, err)
        assert rows == {}
    else:
        assert "committed 400" in out and len(rows) == 400

    PostgresSink(postgres_url, TABLE).write(batch)  # the runner replays the unacked batch
    rows = table_rows(postgres_url)
    assert sorted(rows) == sorted(e.record["url"] for e in batch)  # each URL exactly once
    assert {url: row["stream_id"] for url, row in rows.items()} == {
        e.record["url"]: e.id for e in batch}


def test_kill_9_at_random_moments_leaves_only_whole_batches(postgres_url, tmp_path):
    size = 200
    batches = [_farm_batch(k * size, size, T0) for k in range(15)]
    path = _batches_file(tmp_path, batches)
    rng = random.Random(2911)
    for _ in range(3):
        child = _child(postgres_url, path, "run", stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL)
        assert child.stdout is not None
        child.stdout.readline()  # one batch committed: the rest are in flight
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=60)
        rows = table_rows(postgres_url)
        counts = [sum(e.record["url"] in rows for e in batch) for batch in batches]
        assert set(counts) <= {0, size}, counts  # each batch all there or not at all
        assert counts == sorted(counts, reverse=True), counts  # committed in order

    sink = PostgresSink(postgres_url, TABLE)
    try:
        for batch in batches:
            sink.write(batch)
    finally:
        sink.close()
    rows = table_rows(postgres_url)
    assert len(rows) == 15 * size


def test_throughput_keeps_up_with_the_fleet(sink, postgres_url):
    """~5 KB records with 100 links, batches of 500: the fleet makes ~700 pages/s."""
    batches = [_farm_batch(k * 500, 500, T0) for k in range(8)]
    assert 4000 < len(json.dumps(batches[0][0].record)) < 7000
    started = time.perf_counter()
    for batch in batches:
        sink.write(batch)
    rate = 8 * 500 / (time.perf_counter() - started)
    print(f"postgres sink: {rate:.0f} rows/s")
    assert len(table_rows(postgres_url)) == 4000
    assert rate >= 700, f"{rate:.0f} rows/s"


# -- where the server comes from ----------------------------------------------------------------


def test_the_session_server_is_on_loopback_and_a_local_one_never_runs_as_root(
        postgres: PostgresService):
    assert psycopg.conninfo.conninfo_to_dict(postgres.url)["host"] in ("127.0.0.1", "localhost")
    if postgres.local is None:
        pytest.skip(f"PostgreSQL from {postgres.source}")
    assert postgres.local.running and postgres.local._proc is not None
    owner = Path(f"/proc/{postgres.local._proc.pid}").stat().st_uid
    assert owner != 0 and (os.geteuid() == 0 or owner == os.geteuid())


def test_postgres_url_from_the_environment_is_used_as_is_and_checked(postgres):
    with postgres_service({"POSTGRES_URL": postgres.url}) as found:
        assert (found.url, found.source, found.local) == (postgres.url, "env", None)
    secret = "n0t-the-Password"
    wrong = f"postgresql://fleet:{secret}@127.0.0.1:{free_port()}/fleet"
    with pytest.raises(ServicesUnavailable) as refused, postgres_service({"POSTGRES_URL": wrong}):
        pass
    assert secret not in str(refused.value)


def test_a_local_server_stops_cleanly_and_leaves_nothing_behind(postgres):
    if postgres.local is None:
        pytest.skip(f"PostgreSQL from {postgres.source}")
    with LocalPostgres() as server:
        directory, pid = server.dir, server._proc.pid if server._proc else 0
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT current_setting('fsync')").fetchone() == ("on",)
        assert directory is not None and directory.is_dir()
    assert not server.running and not directory.exists()
    assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.url, connect_timeout=2)
