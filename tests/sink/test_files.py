"""The files sink on its own (no Redis): line format, rotation by size and age, recovery of a
torn part after a crash, and replayed entries written once."""

from __future__ import annotations

import gzip
import os
import time

from common.sink.files import FileSink, scan_part
from common.sink.reader import Entry
from tests.sink.parts import finalized, lines, open_parts


def _entries(start: int, count: int, stream: str = "results") -> list[Entry]:
    return [Entry(stream, f"1700000000{n:03d}-0", {"url": f"https://example.test/{stream}/{n}",
                                                   "title": "t" * 200, "n": n})
            for n in range(start, start + count)]


def test_each_line_is_the_record_with_its_stream_and_id_and_only_renamed_parts_look_complete(
        tmp_path):
    sink = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    batch = [*_entries(1, 3), *_entries(1, 2, "failures")]

    sink.write(batch)

    assert finalized(tmp_path) == []
    [part] = open_parts(tmp_path)
    assert part.name == ".part-1700000000001-0.jsonl.gz.tmp"
    sink.close()
    assert open_parts(tmp_path) == []
    [done] = finalized(tmp_path)
    assert done.name == "results-1700000000001-0-1700000000002-0.jsonl.gz"
    got = lines(tmp_path)
    assert [(line["stream"], line["id"]) for line in got] == [(e.stream, e.id) for e in batch]
    assert got[0] == {"stream": "results", "id": "1700000000001-0", **batch[0].record}


def test_parts_rotate_by_size_and_age_and_every_entry_is_in_exactly_one(tmp_path):
    sink = FileSink(tmp_path, rotate_bytes=300, rotate_s=3600)
    for start in range(1, 40, 4):
        sink.write(_entries(start, 4))
    sink.close()
    parts = finalized(tmp_path)
    assert len(parts) > 3
    assert [line["n"] for line in lines(tmp_path)] == list(range(1, 41))

    aged = FileSink(tmp_path / "aged", rotate_bytes=10**9, rotate_s=0.2)
    aged.write(_entries(100, 2))
    aged.idle()
    assert finalized(tmp_path / "aged") == []
    time.sleep(0.3)
    aged.idle()  # nothing new, everything acknowledged: an old part is closed
    assert len(finalized(tmp_path / "aged")) == 1
    assert open_parts(tmp_path / "aged") == []


def test_a_torn_last_batch_is_cut_the_part_stays_open_and_a_replay_is_written_once(tmp_path):
    sink = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    sink.write(_entries(1, 5))
    sink.write(_entries(1, 1, "failures"))
    sink.write(_entries(6, 5))
    [part] = open_parts(tmp_path)
    whole = part.stat().st_size
    # A crash in the middle of the next batch: half a gzip member at the end, never fsynced.
    half = gzip.compress(b'{"stream":"results","id":"1700000000011-0"}\n' * 50)
    with part.open("ab") as handle:
        handle.write(half[: len(half) // 2])
    del sink  # the process is gone: no close()

    restarted = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)

    assert part.stat().st_size == whole
    assert scan_part(part).lines == 11
    assert finalized(tmp_path) == []  # recovered, kept open: it may hold unacknowledged entries
    # The replay brings every pending entry again: the last batch written and what came after.
    restarted.write([*_entries(6, 8), *_entries(1, 2, "failures")])
    assert restarted.skipped == 6
    restarted.close()
    got = [(line["stream"], line["n"]) for line in lines(tmp_path)]
    assert sorted(got) == sorted([("results", n) for n in range(1, 14)]
                                 + [("failures", 1), ("failures", 2)])
    assert open_parts(tmp_path) == []


def test_a_second_crash_during_the_replay_still_writes_nothing_twice(tmp_path):
    first = FileSink(tmp_path, rotate_bytes=50, rotate_s=3600)
    first.write(_entries(1, 4))
    first.write(_entries(5, 4))  # rotated before this batch: the first part is finalized
    assert len(finalized(tmp_path)) == 1
    del first  # kill -9 after the fsync, before the ack: 5..8 stay pending

    second = FileSink(tmp_path, rotate_bytes=50, rotate_s=3600)
    assert second.high == {"results": (1700000000008, 0)}
    del second  # killed again before replaying anything

    third = FileSink(tmp_path, rotate_bytes=50, rotate_s=3600)
    third.write(_entries(5, 6))
    third.close()
    assert [line["n"] for line in lines(tmp_path)] == list(range(1, 11))


def test_a_part_with_no_complete_batch_is_removed_and_a_failed_write_leaves_nothing(tmp_path):
    (tmp_path / ".part-1700000000001-0.jsonl.gz.tmp").write_bytes(b"\x1f\x8b\x08\x00")
    sink = FileSink(tmp_path, rotate_bytes=10**9, rotate_s=3600)
    assert open_parts(tmp_path) == [] and sink.high == {}

    sink.write(_entries(1, 2))
    [part] = open_parts(tmp_path)
    size = part.stat().st_size
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    os.fsync = failing_fsync
    try:
        try:
            sink.write(_entries(3, 2))
        except OSError:
            pass
        else:
            raise AssertionError("the failed fsync must reach the caller")
    finally:
        os.fsync = real_fsync
    assert part.stat().st_size == size  # the unsynced member was cut again
    sink.write(_entries(3, 2))  # the runner writes the batch again
    sink.close()
    assert [line["n"] for line in lines(tmp_path)] == [1, 2, 3, 4]
