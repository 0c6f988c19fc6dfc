"""``export --job NAME [--run N]``: exactly one job's records (one run, or every run in order)
from the stream, from the files sink's job folders through Redis, and from the folders alone;
without --job, the default job's (the records without a job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from common.ops.export import of_job, parse_job
from common.sink.files import FileSink
from common.sink.reader import Entry
from common.store.keys import RESULTS_STREAM, sink_group
from tests.helpers import REPO_ROOT, TEST_ENV
from tests.ops.test_export import jsonl, page, store_at

#: Whose record each stream id is: interleaved, two jobs (one with two runs) and the default.
OWNERS = [None, ("shop", 1), ("news", 1), ("shop", 2), None, ("shop", 1), ("news", 1),
          ("shop", 2), ("shop", 1), None]


def records() -> list[tuple[str, dict]]:
    out = []
    for n, owner in enumerate(OWNERS):
        record = page(n)
        if owner is not None:
            record.update(job=owner[0], run=owner[1])
        out.append((f"{1000 * (n + 1)}-0", record))
    return out


def ids_of(owner_job: str | None, owner_run: int | None = None) -> list[str]:
    """The ids of the selection, in stream order."""
    return [entry_id for entry_id, record in records()
            if (record.get("job") == owner_job
                and (owner_run is None or record.get("run") == owner_run))]


def _run_export(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **TEST_ENV, **(env or {})}
    return subprocess.run([sys.executable, "export.py", *args], cwd=REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _sink_wrote_everything(client, directory) -> None:
    """What a files sink leaves: every record in its folders, acknowledged through its group,
    and the stream trimmed past them."""
    written = records()
    store_at(client, written)
    sink = FileSink(directory, rotate_bytes=600, rotate_s=3600, name="files")
    for start in range(0, len(written), 3):
        sink.write([Entry(RESULTS_STREAM, entry_id, record)
                    for entry_id, record in written[start:start + 3]])
    sink.close()
    client.xgroup_create(RESULTS_STREAM, sink_group("files"), id=written[-1][0])
    client.xtrim(RESULTS_STREAM, minid="9999999999999-0")


# -- no Redis ----------------------------------------------------------------------------------

def test_of_job_selects_one_jobs_records_one_run_or_every_run_or_the_default_jobs():
    entries = records()
    assert [i for i, _r in of_job(entries)] == ids_of(None)
    assert [i for i, _r in of_job(entries, "shop")] == ids_of("shop")
    assert [i for i, _r in of_job(entries, "shop", 2)] == ids_of("shop", 2)
    assert [i for i, _r in of_job(entries, "nobody")] == []
    odd = [("1-0", {"job": "shop", "run": True}), ("2-0", {"job": "default"})]
    assert [i for i, _r in of_job(odd, "shop", 1)] == []
    assert [i for i, _r in of_job(odd)] == ["2-0"]


def test_a_job_name_is_checked_and_default_means_the_records_without_a_job():
    assert parse_job("shop-2") == "shop-2"
    assert parse_job("default") is None
    for bad in ("../x", "Shop", "", "a/b"):
        with pytest.raises(ValueError):
            parse_job(bad)


def test_a_bad_job_or_a_run_without_a_job_exits_2():
    bad = _run_export("--job", "../etc")
    assert bad.returncode == 2 and "argument --job" in bad.stderr and "'../etc'" in bad.stderr
    alone = _run_export("--run", "2")
    assert alone.returncode == 2 and "argument --run: needs --job" in alone.stderr
    zero = _run_export("--job", "shop", "--run", "0")
    assert zero.returncode == 2 and "argument --run" in zero.stderr


def test_files_only_exports_one_jobs_folders_without_redis(tmp_path):
    sink = FileSink(tmp_path, rotate_bytes=600, rotate_s=3600, name="files")
    sink.write([Entry(RESULTS_STREAM, entry_id, record) for entry_id, record in records()])
    sink.close()
    nowhere = {"REDIS_URL": "redis://127.0.0.1:1/0"}
    for args, expected in ((["--job", "shop"], ids_of("shop", 1) + ids_of("shop", 2)),
                           (["--job", "shop", "--run", "2"], ids_of("shop", 2)),
                           (["--job", "news"], ids_of("news")), ([], ids_of(None)),
                           (["--job", "nobody"], [])):
        result = _run_export("--files-only", "--sink-dir", str(tmp_path), *args, env=nowhere)
        assert result.returncode == 0, result.stderr
        assert [line["id"] for line in jsonl(result.stdout)] == expected, args


# -- against Redis ---------------------------------------------------------------------------

def test_export_job_reads_exactly_that_jobs_records_from_the_stream(redis_client, run_cli):
    store_at(redis_client, records())

    shop = run_cli("export.py", "--job", "shop")
    run2 = run_cli("export.py", "--job", "shop", "--run", "2")
    default = run_cli("export.py")
    news = run_cli("export.py", "--job", "news", "--format", "csv")

    for result in (shop, run2, default, news):
        assert result.returncode == 0, result.stderr
    assert [line["id"] for line in jsonl(shop.stdout)] == ids_of("shop")
    assert [line["id"] for line in jsonl(run2.stdout)] == ids_of("shop", 2)
    assert all((line["job"], line["run"]) == ("shop", 2) for line in jsonl(run2.stdout))
    assert [line["id"] for line in jsonl(default.stdout)] == ids_of(None)
    assert all("job" not in line for line in jsonl(default.stdout))
    assert [row.split(",")[0] for row in news.stdout.splitlines()[1:]] == ids_of("news")
    assert "; job shop, every run" in shop.stderr and "; job shop, run 2" in run2.stderr
    assert "the default job's records" in default.stderr


def test_export_job_reads_the_jobs_folders_of_a_files_sink_where_the_stream_is_trimmed(
        redis_client, run_cli, tmp_path):
    _sink_wrote_everything(redis_client, tmp_path)
    assert redis_client.xlen(RESULTS_STREAM) == 0
    env = {"SINK_DIR": str(tmp_path)}

    shop = run_cli("export.py", "--job", "shop", env=env)
    run1 = run_cli("export.py", "--job", "shop", "--run", "1", "--limit", "2", env=env)
    default = run_cli("export.py", env=env)

    for result in (shop, run1, default):
        assert result.returncode == 0, result.stderr
        assert f"from the files sink's parts in {tmp_path}, once the sink" in result.stderr
    # Every run's records, run after run; each as it was recorded.
    expected = dict(records())
    got = jsonl(shop.stdout)
    assert [line["id"] for line in got] == ids_of("shop", 1) + ids_of("shop", 2)
    assert [{k: v for k, v in line.items() if k != "id"} for line in got] == [
        expected[line["id"]] for line in got]
    assert [line["id"] for line in jsonl(run1.stdout)] == ids_of("shop", 1)[:2]
    assert [line["id"] for line in jsonl(default.stdout)] == ids_of(None)


def test_sink_dir_holding_only_a_jobs_parts_is_still_read(redis_client, run_cli, tmp_path):
    written = [(entry_id, record) for entry_id, record in records() if record.get("job")]
    store_at(redis_client, written)
    sink = FileSink(tmp_path, rotate_bytes=1 << 20, rotate_s=3600, name="files")
    sink.write([Entry(RESULTS_STREAM, entry_id, record) for entry_id, record in written])
    sink.close()
    redis_client.xgroup_create(RESULTS_STREAM, sink_group("files"), id=written[-1][0])
    redis_client.xtrim(RESULTS_STREAM, minid="9999999999999-0")

    result = run_cli("export.py", "--job", "news", env={"SINK_DIR": str(tmp_path)})

    assert result.returncode == 0, result.stderr
    assert "from the files sink's parts" in result.stderr
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == ids_of("news")
