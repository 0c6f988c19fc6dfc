"""The files sink and jobs: a job's records in SINK_DIR/jobs/{name}/run-{n}/, the default job's
where they always were, job fields no job can have in jobs/_invalid (never a path outside the
directory), a crash between two folders' writes replayed exactly once, and a bounded number of
open parts."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from common.jobs.spec import NAME
from common.sink import files
from common.sink.files import FileSink, job_dir, record_dir
from common.sink.reader import Entry, SinkReader, run_sink
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM
from common.store.results import ResultStore
from tests.helpers import REPO_ROOT
from tests.sink.parts import lines, open_parts

MS = 1700000000000


def entry(n: int, job: str | None = None, run: int | None = None,
          stream: str = "results") -> Entry:
    record: dict[str, Any] = {"url": f"https://example.test/{job}/{run}/{n}", "n": n}
    if job is not None:
        record.update(job=job, run=run)
    return Entry(stream, f"{MS + n}-0", record)


def every_file(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_the_sinks_job_name_rule_is_the_job_files():
    assert files.JOB_NAME.pattern == NAME.pattern


def test_each_jobs_run_gets_its_own_folder_and_the_default_job_keeps_the_sink_directory(
        tmp_path):
    sink = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    owners = [None, ("shop", 1), ("news", 1), ("shop", 2)]
    batch = [entry(n, *(owners[n % 4] or (None, None))) for n in range(40)]
    batch.append(entry(40, "shop", 1, stream="failures"))
    sink.write(batch[:17])
    sink.write(batch[17:])
    sink.close()

    assert open_parts(tmp_path) == []
    for owner in owners:
        folder = tmp_path if owner is None else tmp_path / "jobs" / owner[0] / f"run-{owner[1]}"
        expected = [(e.stream, e.id, e.record) for e in batch
                    if (e.record.get("job"), e.record.get("run")) == (owner or (None, None))]
        got = [(line.pop("stream"), line.pop("id"), line) for line in lines(folder)]
        assert got == expected, owner
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir()) == ["news", "shop"]
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["jobs"]


@pytest.mark.parametrize(("job", "run"), [
    ("../x", 1), ("../../escaped", 1), ("/tmp/abs", 1), ("a/b", 1), ("..", 1), ("", 1),
    ("Shop", 1), ("shop\x00", 1), ("x" * 64, 1), (7, 1), (["shop"], 1), ("shop", 0),
    ("shop", -1), ("shop", "1"), ("shop", True), ("shop", 1.0), ("shop", None),
    ("shop", "../../x")])
def test_job_fields_no_job_can_have_go_to_the_invalid_folder_and_never_outside(tmp_path, job,
                                                                              run, caplog):
    root = tmp_path / "sink"
    sink = FileSink(root, rotate_bytes=10**9, rotate_s=3600)
    bad = Entry("results", f"{MS}-0", {"url": "https://example.test/x", "job": job, "run": run})

    sink.write([bad, entry(1, "shop", 1)])
    sink.close()

    assert [p.name for p in tmp_path.iterdir()] == ["sink"]
    assert {p.name for p in (root / "jobs").iterdir()} == {"_invalid", "shop"}
    [line] = lines(root / "jobs" / "_invalid")
    assert (line["job"], line["run"]) == (job, run)
    assert [line["n"] for line in lines(root / "jobs" / "shop" / "run-1")] == [1]
    assert all(f.startswith(("jobs/_invalid/", "jobs/shop/run-1/")) for f in every_file(root))
    assert "with job fields no job can have" in caplog.text


def test_where_a_record_goes_and_what_job_dir_refuses(tmp_path):
    assert record_dir(tmp_path, {"url": "u"}) == tmp_path
    assert record_dir(tmp_path, {"url": "u", "job": "default", "run": 3}) == tmp_path
    assert record_dir(tmp_path, {"job": "a-b_1", "run": 12}) == tmp_path / "jobs/a-b_1/run-12"
    assert job_dir(tmp_path, "shop") == tmp_path / "jobs/shop"
    for job, run in (("../x", 1), ("shop", 0), ("shop", "2")):
        with pytest.raises(ValueError):
            job_dir(tmp_path, job, run)


def test_at_most_max_open_parts_stay_open_and_nothing_is_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_OPEN_PARTS", 3)
    sink = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    for run in range(1, 8):
        sink.write([entry(run * 10 + k, "shop", run) for k in range(2)])
        assert len(list(tmp_path.rglob(".part-*"))) <= 3
    sink.close()
    assert list(tmp_path.rglob(".part-*")) == []
    for run in range(1, 8):
        assert [line["n"] for line in lines(tmp_path / "jobs/shop" / f"run-{run}")] == [
            run * 10, run * 10 + 1]


def test_a_failed_write_over_two_folders_leaves_nothing_in_either(tmp_path, monkeypatch):
    sink = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    sink.write([entry(1, "shop", 1), entry(2)])
    sizes = {p: p.stat().st_size for p in tmp_path.rglob(".part-*")}
    calls = []
    real_fsync = os.fsync

    def fsync_fails_on_the_second(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_fails_on_the_second)
    with pytest.raises(OSError):
        sink.write([entry(3, "shop", 1), entry(4), entry(5, "news", 1)])
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert {p: p.stat().st_size for p in sizes} == sizes
    assert all(p.stat().st_size == 0 for p in (tmp_path / "jobs/news").rglob(".part-*"))

    sink.write([entry(3, "shop", 1), entry(4), entry(5, "news", 1)])  # the runner retries
    sink.close()
    assert [line["n"] for line in lines(tmp_path)] == [2, 4]
    assert [line["n"] for line in lines(tmp_path / "jobs/shop/run-1")] == [1, 3]
    assert [line["n"] for line in lines(tmp_path / "jobs/news/run-1")] == [5]


#: Writes batch 1, then dies (SIGKILL) in batch 2 after the shop folder's member went in and
#: before the news folder's: the process is gone, the page cache keeps what was written.
CRASH_BETWEEN_FOLDERS = r"""
import os, signal, sys
from common.sink.files import FileSink
from common.sink.reader import Entry
directory = sys.argv[1]
def entry(n, job):
    return Entry("results", f"{1700000000000 + n}-0",
                 {"url": f"https://example.test/{n}", "n": n, "job": job, "run": 1})
sink = FileSink(directory, rotate_bytes=10**9, rotate_s=3600)
sink.write([entry(1, "shop"), entry(2, "news")])
original = FileSink._append
def append_then_die(self, fd, data):
    original(self, fd, data)
    os.kill(os.getpid(), signal.SIGKILL)
FileSink._append = append_then_die
sink.write([entry(3, "shop"), entry(4, "news")])
"""


def test_a_crash_between_two_folders_writes_is_replayed_into_the_missing_one_only(tmp_path):
    child = subprocess.run([sys.executable, "-c", CRASH_BETWEEN_FOLDERS, str(tmp_path)],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert child.returncode == -9, child.stderr

    restarted = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    assert restarted.high == {"results": (MS + 3, 0)}
    replay = [Entry("results", f"{MS + n}-0", {"url": f"https://example.test/{n}", "n": n,
                                              "job": job, "run": 1})
              for n, job in ((3, "shop"), (4, "news"))]
    restarted.write(replay)  # the batch was never acknowledged: it comes again, whole
    assert restarted.skipped == 1
    restarted.close()
    assert [line["n"] for line in lines(tmp_path / "jobs/shop/run-1")] == [1, 3]
    assert [line["n"] for line in lines(tmp_path / "jobs/news/run-1")] == [2, 4]


def test_interleaved_records_of_two_jobs_and_the_default_job_in_the_streams_land_apart(
        redis_client, tmp_path):
    store = ResultStore(redis_client, 1_000_000)
    owners = [None, ("shop", 1), ("news", 3), ("shop", 1), None, ("news", 3), ("shop", 2)]
    written: dict[Any, list[tuple[str, str]]] = {}
    for n in range(70):
        owner = owners[n % len(owners)]
        record: dict[str, Any] = {"url": f"https://example.test/{n}", "n": n}
        if owner is not None:
            record.update(job=owner[0], run=owner[1])
        stream = FAILURES_STREAM if n % 10 == 9 else RESULTS_STREAM
        if stream == FAILURES_STREAM:
            record["outcome"] = "dead_letter"
        store.record(record, stream=stream)
        written.setdefault(owner, []).append((stream, n))
    sink = FileSink(tmp_path, rotate_bytes=2000, rotate_s=3600)
    reader = SinkReader(redis_client, sink.name, batch=8)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(
        run_sink(reader, sink, threading.Event(), idle_exit_s=1.0)))
    thread.start()
    thread.join(60)

    assert codes == [0]
    assert redis_client.xlen(RESULTS_STREAM) == redis_client.xlen(FAILURES_STREAM) == 0
    for owner, expected in written.items():
        folder = tmp_path if owner is None else job_dir(tmp_path, *owner)
        got = [(line["stream"], line["n"]) for line in lines(folder)]
        assert sorted(got, key=lambda g: g[1]) == expected, owner
        assert all((line.get("job"), line.get("run")) == (owner or (None, None))
                   for line in lines(folder))
    assert all(name.endswith(".jsonl.gz") for name in every_file(tmp_path))  # all finalized


def test_no_part_is_rotated_before_the_first_write_after_a_recovery(tmp_path):
    first = FileSink(tmp_path, rotate_bytes=50, rotate_s=3600)
    first.write([entry(1, "shop", 1), entry(2)])
    del first  # kill -9 before the ack: both parts hold an unacknowledged batch

    second = FileSink(tmp_path, rotate_bytes=50, rotate_s=3600)
    # Both parts are past rotate_bytes, but the replay may come first: they stay open, so a
    # crash now still finds their ids at the next start.
    second.write([entry(1, "shop", 1), entry(2), entry(3, "shop", 1)])
    assert second.skipped == 2
    assert len(list(tmp_path.rglob(".part-*"))) == 2
    assert list(tmp_path.rglob("results-*")) == []
    second.idle()  # everything written is acknowledged now
    assert list(tmp_path.rglob(".part-*")) == []
    assert [line["n"] for line in lines(tmp_path / "jobs/shop/run-1")] == [1, 3]
    assert [line["n"] for line in lines(tmp_path)] == [2]
