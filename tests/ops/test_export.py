from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time

import pytest

from common.ops.export import (
    CSV_COLUMNS,
    Exporter,
    csv_row,
    id_before,
    jsonl_line,
    parse_stream_id,
    read_entries,
    since_to_stream_id,
)
from common.sink.files import FileSink
from common.sink.reader import Entry
from common.store.keys import RESULTS_STREAM, sink_group
from common.store.results import ResultStore, encode
from tests.helpers import REPO_ROOT, TEST_ENV, wait_for

TRICKY_TITLE = 'Comma, "quotes" and\na newline\r\nand CRLF; ünïcødé'


def page(n: int, **fields) -> dict:
    record = {
        "url": f"http://127.0.0.1:9/p/{n}", "final_url": f"http://127.0.0.1:9/p/{n}",
        "status": 200, "title": f"Page {n}", "description": None, "canonical": None,
        "language": "en", "links": [f"http://127.0.0.1:9/p/{n + 1}"], "text_length": 10 * n,
        "content_hash": f"{n:032x}", "fetched_at": 1714564800.5 + n, "elapsed_ms": 12.5,
        "worker": "w-1", "queue": "url_queue_ttl", "depth": 0, "attempts": 1, "cached": False,
        "error": None,
    }
    record.update(fields)
    return record


def store_at(client, ids_and_records: list[tuple[str, dict]]) -> None:
    """XADD with explicit ids, the way ResultStore.record stores a record."""
    for entry_id, record in ids_and_records:
        client.xadd(RESULTS_STREAM, {"json": encode(record)}, id=entry_id)


def jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


# -- pure functions: no Redis -----------------------------------------------------------------

def test_since_accepts_epoch_seconds_and_iso_times_and_rounds_up_to_the_next_millisecond():
    assert since_to_stream_id("1714564800") == "1714564800000-0"
    assert since_to_stream_id("1714564800.1234") == "1714564800124-0"
    assert since_to_stream_id("2024-05-01T12:00:00Z") == "1714564800000-0"
    assert since_to_stream_id("2024-05-01T14:00:00+02:00") == "1714564800000-0"
    assert since_to_stream_id("2024-05-01 12:00:00") == "1714564800000-0"  # naive = UTC
    assert since_to_stream_id("2024-05-01") == "1714521600000-0"
    assert since_to_stream_id("2024-05-01T12:00:00.000001Z") == "1714564800001-0"


@pytest.mark.parametrize("text", ["yesterday", "", "nan", "inf", "-5", "1969-12-31T23:59:59Z",
                                  "2024-13-01"])
def test_since_rejects_what_is_not_a_time_after_1970(text):
    with pytest.raises(ValueError):
        since_to_stream_id(text)


def test_stream_ids_are_checked_and_the_cursor_before_a_start_is_exclusive():
    assert parse_stream_id("1714564800000-3") == "1714564800000-3"
    assert parse_stream_id("1714564800000") == "1714564800000"
    assert parse_stream_id("-") == "-"
    for bad in ("abc", "1-2-3", "12-", "-5", "1-99999999999999999999"):
        with pytest.raises(ValueError):
            parse_stream_id(bad)
    assert id_before("5-3") == "5-2"
    assert id_before("5-0") == "4-18446744073709551615"
    assert id_before("5") == "4-18446744073709551615"
    assert id_before("0-0") == id_before("-") == "0-0"


def test_a_jsonl_line_is_the_stored_record_with_its_stream_id_first():
    record = page(1, title=TRICKY_TITLE)
    line = jsonl_line("7-0", record)
    assert "\n" not in line
    assert list(json.loads(line)) == ["id", *record]
    assert json.loads(line) == {"id": "7-0", **record}


def test_a_csv_row_has_the_fixed_columns_with_links_counted_and_empty_nones():
    row = dict(zip(CSV_COLUMNS, csv_row("7-0", page(3, cached=True, links=["a", "b"])),
                   strict=True))
    assert row["id"] == "7-0" and row["status"] == "200" and row["title"] == "Page 3"
    assert row["links_count"] == "2" and row["cached"] == "true" and row["error"] == ""
    assert row["description"] == "" and row["elapsed_ms"] == "12.5"
    assert dict(zip(CSV_COLUMNS, csv_row("8-0", {"url": "u", "links_count": 9}),
                    strict=True))["links_count"] == "9"
    assert set(dict(zip(CSV_COLUMNS, csv_row("9-0", {}), strict=True)).values()) == {"9-0", ""}


def test_csv_escapes_commas_quotes_and_newlines_so_the_csv_module_reads_them_back():
    out = io.StringIO(newline="")
    exporter = Exporter(out, "csv")
    exporter.write_all([("1-0", page(1, title=TRICKY_TITLE, error="x,y")), ("2-0", page(2))])
    rows = list(csv.DictReader(io.StringIO(out.getvalue(), newline="")))
    assert exporter.count == 2 and exporter.last_id == "2-0"
    assert [r["id"] for r in rows] == ["1-0", "2-0"]
    assert rows[0]["title"] == TRICKY_TITLE and rows[0]["error"] == "x,y"


@pytest.mark.parametrize("title", ['=HYPERLINK("http://127.0.0.1:9/","click")', "+1+1",
                                   "-2+3", "@SUM(A1)", "\tindent", "\rreturn"])
def test_a_text_that_a_spreadsheet_would_run_as_a_formula_is_defused(title):
    row = dict(zip(CSV_COLUMNS, csv_row("1-0", page(1, title=title, status=-1)), strict=True))
    assert row["title"] == "'" + title
    assert row["status"] == "-1"  # numbers are numbers, whatever their sign


def test_ordinary_text_and_json_lines_are_written_as_they_are():
    row = dict(zip(CSV_COLUMNS, csv_row("1-0", page(1, title="Page - one = 1")), strict=True))
    assert row["title"] == "Page - one = 1"
    out = io.StringIO()
    Exporter(out, "jsonl").write_all([("1-0", page(1, title="=1+1"))])
    assert json.loads(out.getvalue())["title"] == "=1+1"


def test_an_empty_csv_export_still_has_its_header_and_an_empty_jsonl_export_is_empty():
    out = io.StringIO()
    Exporter(out, "csv")
    assert out.getvalue() == ",".join(CSV_COLUMNS) + "\n"
    out = io.StringIO()
    Exporter(out, "jsonl").write_all([])
    assert out.getvalue() == ""


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="xml"):
        Exporter(io.StringIO(), "xml")


def _run_export(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **TEST_ENV, **(env or {})}
    return subprocess.run([sys.executable, "export.py", *args], cwd=REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_a_bad_since_exits_2_naming_the_option_and_the_value():
    result = _run_export("--since", "yesterday")
    assert result.returncode == 2
    assert "argument --since" in result.stderr and "'yesterday'" in result.stderr
    assert result.stdout == ""


def test_a_bad_from_and_from_with_since_exit_2():
    assert _run_export("--from", "12-x").returncode == 2
    both = _run_export("--from", "1-0", "--since", "1714564800")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_unreachable_redis_exits_3():
    result = _run_export(env={"REDIS_URL": "redis://127.0.0.1:1/0", "CONNECT_RETRY_S": "0"})
    assert result.returncode == 3
    assert "Redis" in result.stderr


# -- against Redis --------------------------------------------------------------------------

def test_jsonl_export_round_trips_every_recorded_result(settings, redis_client, run_cli):
    store = ResultStore(redis_client, settings.results_maxlen)
    records = [page(i, title=TRICKY_TITLE if i == 2 else f"Page {i}") for i in range(5)]
    for record in records:
        store.record(record)
    ids = [entry_id.decode() for entry_id, _ in redis_client.xrange(RESULTS_STREAM)]

    result = run_cli("export.py")

    assert result.returncode == 0, result.stderr
    exported = jsonl(result.stdout)
    assert [line.pop("id") for line in exported] == ids
    assert exported == records
    assert f"last id {ids[-1]}" in result.stderr


def test_csv_export_has_a_header_and_one_row_per_record(redis_client, run_cli):
    store_at(redis_client, [("1000-0", page(0, title=TRICKY_TITLE)), ("2000-0", page(1))])

    result = run_cli("export.py", "--format", "csv")

    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(io.StringIO(result.stdout, newline="")))
    assert rows[0] == list(CSV_COLUMNS)
    assert [row[0] for row in rows[1:]] == ["1000-0", "2000-0"]
    # run_cli reads stdout as text with universal newlines, which turns the \r\n inside the
    # quoted title into \n; the --output test below checks the bytes are kept exactly.
    assert rows[1][CSV_COLUMNS.index("title")] == TRICKY_TITLE.replace("\r\n", "\n")
    assert rows[2][CSV_COLUMNS.index("links_count")] == "1"


def test_from_is_inclusive_and_since_starts_at_the_first_entry_at_or_after_the_time(
        redis_client, run_cli):
    store_at(redis_client, [("1000-0", page(0)), ("2000-0", page(1)), ("2000-1", page(2)),
                            ("3000-0", page(3))])

    def ids(*args: str) -> list[str]:
        result = run_cli("export.py", *args)
        assert result.returncode == 0, result.stderr
        return [line["id"] for line in jsonl(result.stdout)]

    assert ids("--from", "2000-1") == ["2000-1", "3000-0"]
    assert ids("--from", "2000") == ["2000-0", "2000-1", "3000-0"]
    assert ids("--since", "1970-01-01T00:00:02Z") == ["2000-0", "2000-1", "3000-0"]
    assert ids("--since", "2.001") == ["3000-0"]
    assert ids("--since", "4") == []
    assert ids("--limit", "2") == ["1000-0", "2000-0"]


def test_output_writes_the_file_and_nothing_on_stdout(redis_client, run_cli, tmp_path):
    store_at(redis_client, [("1000-0", page(0, title=TRICKY_TITLE)), ("2000-0", page(1))])
    target = tmp_path / "results.csv"

    result = run_cli("export.py", "--format", "csv", "--output", str(target))

    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    with target.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["id"] for r in rows] == ["1000-0", "2000-0"]
    assert rows[0]["title"] == TRICKY_TITLE


def test_output_into_a_missing_directory_exits_2(redis_client, run_cli, tmp_path):
    result = run_cli("export.py", "--output", str(tmp_path / "nope" / "out.jsonl"))
    assert result.returncode == 2
    assert "no such directory" in result.stderr


def test_reading_pages_through_the_stream_in_batches(settings, redis_client):
    store_at(redis_client, [(f"{n}-0", page(n)) for n in range(1, 8)])
    store = ResultStore(redis_client, settings.results_maxlen)

    entries = list(read_entries(store, "3-0", batch=2))

    assert [entry_id for entry_id, _ in entries] == ["3-0", "4-0", "5-0", "6-0", "7-0"]
    assert entries[0][1] == page(3)


def test_follow_reads_the_backlog_then_waits_for_new_entries(settings, redis_client):
    store_at(redis_client, [("1000-0", page(0))])
    store = ResultStore(redis_client, settings.results_maxlen)
    waits: list[int] = []

    def add_one_while_waiting() -> None:
        waits.append(1)
        if len(waits) == 2:
            store.record(page(1))

    entries = read_entries(store, "1000-0", follow=True, block_ms=100,
                           before_block=add_one_while_waiting)
    first, second = next(entries), next(entries)

    assert first == ("1000-0", page(0))
    assert second[1] == page(1) and len(waits) == 2


def test_follow_from_a_start_with_no_backlog_gets_entries_at_the_start_itself(settings,
                                                                              redis_client):
    store = ResultStore(redis_client, settings.results_maxlen)
    entries = read_entries(store, "5000-0", follow=True, block_ms=100,
                           before_block=lambda: store_at(redis_client, [("5000-0", page(5))]))
    assert next(entries) == ("5000-0", page(5))


def test_follow_cli_exports_records_added_after_it_started(settings, redis_client, tmp_path):
    redis_time_ms = int(redis_client.time()[0]) * 1000
    target = tmp_path / "live.jsonl"
    env = {**os.environ, **TEST_ENV, "REDIS_URL": settings.redis_url,
           "RABBITMQ_URL": settings.rabbitmq_url}
    proc = subprocess.Popen(
        [sys.executable, "export.py", "--follow", "--since", str(redis_time_ms // 1000),
         "--limit", "2", "--output", str(target)],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        store = ResultStore(redis_client, settings.results_maxlen)
        store.record(page(1))
        assert wait_for(lambda: target.exists() and target.read_text().count("\n") == 1)
        store.record(page(2))
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [line["url"] for line in jsonl(target.read_text())] == [page(1)["url"],
                                                                     page(2)["url"]]


# -- where the records come from: the files sink's parts (SINK_DIR) or the stream -------------

def _sink_wrote(client, directory, ids_and_records: list[tuple[str, dict]]) -> None:
    """What a files sink leaves: the records in its parts, acknowledged through its group
    (delivered up to the last, nothing pending), and the stream trimmed past them."""
    store_at(client, ids_and_records)
    sink = FileSink(directory, rotate_bytes=1 << 20, rotate_s=3600, name="files")
    sink.write([Entry(RESULTS_STREAM, entry_id, record) for entry_id, record in ids_and_records])
    sink.close()
    client.xgroup_create(RESULTS_STREAM, sink_group("files"), id=ids_and_records[-1][0])
    client.xtrim(RESULTS_STREAM, minid="9999999999999-0")


def test_export_reads_the_sinks_parts_in_sink_dir_where_the_stream_is_trimmed(
        redis_client, run_cli, tmp_path):
    written = [("1000-0", page(0)), ("2000-0", page(1))]
    _sink_wrote(redis_client, tmp_path, written)
    assert redis_client.xlen(RESULTS_STREAM) == 0

    result = run_cli("export.py", env={"SINK_DIR": str(tmp_path)})

    assert result.returncode == 0, result.stderr
    assert f"export: from the files sink's parts in {tmp_path}, once the sink" in result.stderr
    assert [line["id"] for line in jsonl(result.stdout)] == ["1000-0", "2000-0"]
    from_stream = run_cli("export.py")  # SINK_DIR unset: the trimmed stream
    assert from_stream.stdout == "" and "from the Redis stream `results`" in from_stream.stderr


def test_export_falls_back_to_the_stream_when_no_files_sink_reads_it_and_says_so(
        redis_client, run_cli, tmp_path):
    sink = FileSink(tmp_path, rotate_bytes=1 << 20, rotate_s=3600, name="files")
    sink.write([Entry(RESULTS_STREAM, "500-0", page(9))])  # an old run's part
    sink.close()
    store_at(redis_client, [("1000-0", page(0))])

    result = run_cli("export.py", env={"SINK_DIR": str(tmp_path)})

    assert result.returncode == 0, result.stderr
    assert "from the Redis stream `results`: no sink named 'files' reads it" in result.stderr
    assert [line["id"] for line in jsonl(result.stdout)] == ["1000-0"]


def test_files_only_reads_the_parts_without_any_redis(tmp_path):
    sink = FileSink(tmp_path, rotate_bytes=1 << 20, rotate_s=3600, name="files")
    sink.write([Entry(RESULTS_STREAM, f"{n}000-0", page(n)) for n in (1, 2, 3)])
    sink.close()
    began = time.monotonic()
    result = _run_export("--files-only", "--since", "2", "--sink-dir", str(tmp_path),
                         env={"REDIS_URL": "redis://127.0.0.1:1/0"})  # nothing listens there
    assert result.returncode == 0 and time.monotonic() - began < 10, result.stderr
    assert "alone, without Redis" in result.stderr
    assert [line["id"] for line in jsonl(result.stdout)] == ["2000-0", "3000-0"]
