"""The PostgreSQL sink and jobs, against a real PostgreSQL: one row per URL of each job run (the
key is (job, run, url)), and a table of the previous version (key url) migrated in place at
start, its rows kept as the default job's, once."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from common.sink.postgres import PostgresSink
from common.sink.reader import Entry
from tests.sink.test_postgres import T0, TABLE, failure, result

#: The table as the sink before jobs created it.
OLD_TABLE = """
CREATE TABLE {table} (
    url         TEXT PRIMARY KEY,
    outcome     TEXT NOT NULL CHECK (outcome IN ('result', 'dead_letter')),
    stream      TEXT NOT NULL,
    stream_id   TEXT NOT NULL,
    status      INTEGER,
    title       TEXT,
    fetched_at  TIMESTAMPTZ,
    record      JSONB NOT NULL,
    written_at  TIMESTAMPTZ NOT NULL DEFAULT now()
)"""


def of_job(entry: Entry, job: str, run: int) -> Entry:
    return Entry(entry.stream, entry.id, {**entry.record, "job": job, "run": run})


def rows_by_key(url: str, table: str = TABLE) -> dict[tuple[str, int, str], dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        query = sql.SQL("SELECT *, xmin::text AS xmin FROM {}").format(sql.Identifier(table))
        return {(row["job"], row["run"], row["url"]): row for row in conn.execute(query)}


def primary_key(url: str, table: str = TABLE) -> tuple[str, list[str]]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT c.conname::text, array_agg(a.attname::text ORDER BY k.n) "
            "FROM pg_constraint c, unnest(c.conkey) WITH ORDINALITY AS k(attnum, n), "
            "pg_attribute a WHERE c.conrelid = %s::regclass AND c.contype = 'p' "
            "AND a.attrelid = c.conrelid AND a.attnum = k.attnum GROUP BY c.conname",
            (table,)).fetchall()
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def sink(postgres_url: str):
    sink = PostgresSink(postgres_url, TABLE)
    try:
        yield sink
    finally:
        sink.close()


def test_the_same_url_in_two_jobs_two_runs_and_the_default_job_is_four_rows(sink, postgres_url):
    url = "https://shared.test/page"
    sink.write([result(url, T0), of_job(result(url, T0 + 1), "shop", 1),
                of_job(result(url, T0 + 2), "shop", 2), of_job(failure(url, T0 + 3), "news", 1)])

    rows = rows_by_key(postgres_url)
    assert sorted(rows) == [("", 0, url), ("news", 1, url), ("shop", 1, url), ("shop", 2, url)]
    assert rows[("", 0, url)]["stream_id"] == f"{T0}-0"
    assert "job" not in rows[("", 0, url)]["record"]
    assert (rows[("shop", 2, url)]["stream_id"], rows[("shop", 2, url)]["record"]["run"]) == (
        f"{T0 + 2}-0", 2)
    news = rows[("news", 1, url)]
    assert (news["outcome"], news["stream"], news["status"]) == ("dead_letter", "failures", 503)
    assert primary_key(postgres_url) == ("crawl_results_pkey", ["job", "run", "url"])


def test_a_newer_entry_replaces_only_its_own_runs_row_and_a_replay_changes_nothing(
        sink, postgres_url):
    url = "https://shared.test/page"
    first = [of_job(result(url, T0), "shop", 1), of_job(result(url, T0 + 1), "shop", 2)]
    sink.write(first)
    sink.write([of_job(failure(url, T0 + 10), "shop", 1)])  # run 1 dead-lettered it later
    rows = rows_by_key(postgres_url)
    assert rows[("shop", 1, url)]["outcome"] == "dead_letter"
    assert rows[("shop", 2, url)]["stream_id"] == f"{T0 + 1}-0"

    sink.write(first)  # a replay: both older than what is there, or the same
    assert rows_by_key(postgres_url) == rows


def test_job_fields_no_row_can_hold_are_skipped_and_logged(sink, postgres_url, caplog):
    sink.write([Entry("results", f"{T0}-0", {**result("https://a.test/1", T0).record,
                                              "job": 7, "run": 1}),
                of_job(result("https://a.test/2", T0 + 1), "shop", 2**40),
                of_job(result("https://a.test/3", T0 + 2), "shop", 3)])
    assert sorted(rows_by_key(postgres_url)) == [("shop", 3, "https://a.test/3")]
    assert f"{T0}-0 has job 7 run 1" in caplog.text
    assert f"{T0 + 1}-0 has job 'shop' run {2**40}" in caplog.text


def _old_table_with_rows(postgres_url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(postgres_url) as conn:
        conn.execute(sql.SQL(OLD_TABLE).format(table=sql.Identifier(TABLE)))
    with psycopg.connect(postgres_url, row_factory=dict_row) as conn:
        insert = sql.SQL("INSERT INTO {} (url, outcome, stream, stream_id, status, record) "
                         "VALUES (%s, 'result', 'results', %s, 200, %s)").format(
            sql.Identifier(TABLE))
        for n in range(5):
            conn.execute(insert, (f"https://old.test/{n}", f"{T0 + n}-0",
                                  psycopg.types.json.Jsonb({"url": f"https://old.test/{n}"})))
        return {row["url"]: row for row in conn.execute(
            sql.SQL("SELECT * FROM {}").format(sql.Identifier(TABLE)))}


def test_an_old_table_is_migrated_in_place_its_rows_kept_as_the_default_jobs(postgres_url,
                                                                            caplog):
    before = _old_table_with_rows(postgres_url)
    assert primary_key(postgres_url) == ("crawl_results_pkey", ["url"])

    sink = PostgresSink(postgres_url, TABLE)
    try:
        assert primary_key(postgres_url) == ("crawl_results_pkey", ["job", "run", "url"])
        rows = rows_by_key(postgres_url)
        assert sorted(rows) == [("", 0, url) for url in sorted(before)]
        for url, old in before.items():
            assert {k: rows[("", 0, url)][k] for k in old} == old
        assert "had the key ['url']; migrating it" in caplog.text
        # The default job's record of an old URL replaces the old row; a job's is a row more.
        sink.write([result("https://old.test/0", T0 + 100),
                    of_job(result("https://old.test/1", T0 + 101), "shop", 1)])
    finally:
        sink.close()
    after = rows_by_key(postgres_url)
    assert len(after) == 6
    assert after[("", 0, "https://old.test/0")]["stream_id"] == f"{T0 + 100}-0"
    assert after[("", 0, "https://old.test/1")]["stream_id"] == f"{T0 + 1}-0"
    assert after[("shop", 1, "https://old.test/1")]["stream_id"] == f"{T0 + 101}-0"

    caplog.clear()
    again = PostgresSink(postgres_url, TABLE)  # a second start: nothing to migrate
    again.close()
    assert "migrating" not in caplog.text
    assert rows_by_key(postgres_url) == after  # same xmin: no row rewritten


def test_two_sinks_starting_at_once_on_an_old_table_migrate_it_once(postgres_url, caplog):
    _old_table_with_rows(postgres_url)
    sinks: list[PostgresSink] = []
    errors: list[BaseException] = []

    def start(name: str) -> None:
        try:
            sinks.append(PostgresSink(postgres_url, TABLE, name=name))
        except BaseException as exc:  # noqa: BLE001 - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(f"postgres-{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for started in sinks:
        started.close()
    assert errors == [] and len(sinks) == 2
    assert caplog.text.count("migrating it") == 1
    assert primary_key(postgres_url) == ("crawl_results_pkey", ["job", "run", "url"])
    assert len(rows_by_key(postgres_url)) == 5
