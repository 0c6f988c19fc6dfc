"""The media bench's own bookkeeping (bench/media_cost.py): its site's files and their hashes,
the record and store checks, the per-MiB floor, the process-tree CPU, and one tiny run through
a real download worker into a directory store. No figure is a target: the run's numbers are
the bench's output, the test checks only that they are there and its checks hold."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.media_cost import (
    Asset,
    check_records,
    check_stored,
    floor_cpu_ms_per_mib,
    measure,
    parse_args,
    site_config,
    summary,
    tree_cpu_s,
    write_docroot,
)
from common.core.config import load_settings
from common.media.store import open_store
from tests.helpers import wait_for


def test_the_docroot_holds_each_file_with_its_own_bytes_and_the_hash_it_must_record(tmp_path):
    assets = write_docroot(tmp_path, assets=3, size_kb=4, big=2, big_mb=1)
    assert [a.path for a in assets] == ["/a/0.jpg", "/a/1.jpg", "/a/2.jpg", "/v/0.mp4",
                                        "/v/1.mp4"]
    for asset in assets:
        body = (tmp_path / asset.path.lstrip("/")).read_bytes()
        assert (len(body), hashlib.sha256(body).hexdigest()) == (asset.size, asset.sha256)
    assert len({a.sha256 for a in assets}) == 5, "each file its own object"
    assert [(a.kind, a.media_type) for a in assets[2:4]] == [("image", "image/jpeg"),
                                                             ("video", "video/mp4")]
    assert "Allow: /" in (tmp_path / "robots.txt").read_text()
    assert "image/jpeg jpg;" in site_config() and "video/mp4 mp4;" in site_config()


def _asset(n: int) -> Asset:
    return Asset(f"/a/{n}.jpg", 10 + n, f"{n:064x}", "image/jpeg", "image")


def test_check_records_counts_missing_repeated_and_wrong_records():
    expected = {f"http://h/a/{n}.jpg": _asset(n) for n in range(4)}

    def record(n: int, **changes: object) -> dict[str, object]:
        a = _asset(n)
        return {"url": f"http://h{a.path}", "sha256": a.sha256, "size": a.size, "status": 200,
                "content_type": a.media_type, "stored": "new", **changes}

    found = check_records([record(0), record(1), record(1, stored="existing"),
                           record(2, sha256="f" * 64)], expected)
    assert (found["records"], found["urls_with_record"], found["urls_missing"]) == (4, 3, 1)
    assert (found["urls_with_several"], found["wrong_records"]) == (1, 1)
    assert found["wrong_example"] == ["http://h/a/2.jpg"] and found["stored_new"] == 3


def test_check_stored_reads_each_object_back_and_catches_a_changed_one(tmp_path):
    store = open_store(load_settings({"MEDIA_STORE": str(tmp_path / "store")}))
    records, locations = [], []
    for n in range(3):
        spool = tmp_path / f"spool-{n}"
        spool.write_bytes(b"asset %d" % n)
        sha = hashlib.sha256(spool.read_bytes()).hexdigest()
        stored = store.put(spool, sha, spool.stat().st_size, "image/png", {})
        records.append({"url": f"u{n}", "key": stored.key, "sha256": sha})
        locations.append(Path(stored.location))
    assert check_stored(store, records)["objects_bad"] == 0
    locations[2].write_bytes(b"changed")
    records.append({"url": "gone", "key": "sha256/no/ne/none.png", "sha256": "0" * 64})
    found = check_stored(store, records)
    assert (found["objects_checked"], found["objects_bad"]) == (4, 2)
    assert found["bad_example"] == ["u2", "gone"]


def test_the_floor_gives_a_positive_cpu_cost_per_mib_for_each_step(tmp_path):
    floor = floor_cpu_ms_per_mib(tmp_path, mib=4)
    assert set(floor) == {"sha256", "md5", "write_fsync", "copy_fsync"}
    assert floor["sha256"] > 0 and floor["md5"] > 0
    assert list(tmp_path.iterdir()) == []


def test_tree_cpu_counts_a_busy_child_of_the_process(tmp_path):
    burnt = tmp_path / "burnt"
    child = ("import pathlib, time\nt = time.process_time()\n"
             "while time.process_time() - t < 0.3: pass\n"
             f"pathlib.Path({str(burnt)!r}).touch()\ntime.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                               f"subprocess.run([sys.executable, '-c', {child!r}])"])
    try:
        assert wait_for(burnt.exists, 30)
        time.sleep(0.05)
        assert tree_cpu_s(parent.pid) >= 0.25
    finally:
        parent.kill()
        parent.wait(10)
    assert tree_cpu_s(parent.pid) == 0.0  # gone


@pytest.mark.integration
@pytest.mark.slow
def test_a_tiny_run_downloads_every_asset_once_with_its_hash_and_reports_each_figure(
        services, settings):
    args = parse_args(["--assets", "12", "--size", "4", "--big", "1", "--big-mb", "2",
                       "--concurrency", "4", "--timeout-s", "60"])
    figures = measure(args, services)
    assert figures["exits"] == {"media-0": 0}
    assert (figures["records"], figures["urls_missing"], figures["wrong_records"]) == (13, 0, 0)
    assert (figures["failures"], figures["objects_checked"], figures["objects_bad"]) == (0, 13, 0)
    worker = figures["per_worker"]["media-0"]
    assert worker["assets"] == 13 and worker["mib"] == pytest.approx(2 + 12 * 4 / 1024, abs=0.1)
    assert worker["cpu_s"] > 0 and worker["cpu_ms_per_mib"] > 0 and worker["peak_rss_mb"] > 0
    assert set(figures["others_cpu_s"]) == {"nginx", "redis"}
    table = "\n".join(summary(figures))
    assert "| media-0 | 13 |" in table and "0 wrong" in table
