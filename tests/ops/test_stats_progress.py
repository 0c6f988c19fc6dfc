"""The status view's progress: done, failed, to do and other of total known, the rate over the
time the crawl has actually run, the rate while a sink trims the streams (from readings stored
in Redis), and an ETA (common/ops/crawl_progress.py), against a real Redis."""

from __future__ import annotations

import json

import pytest

from common.core.urls import fingerprint
from common.ops import crawl_progress, stats
from common.ops.crawl_progress import Reading, format_duration, store_reading
from common.store.dedupe import SeenSet
from common.store.keys import DONE_PREFIX, FAILURES_STREAM, RESULTS_STREAM, SEEN_PREFIX


def _add_at(client, stream: str, *offsets_ms: int) -> None:
    """One entry per offset, at the Redis clock's now + offset (ids are ms timestamps)."""
    now_ms = crawl_progress.redis_now_ms(client)
    for n, offset in enumerate(sorted(offsets_ms)):
        client.xadd(stream, {"json": "{}"}, id=f"{now_ms + offset}-{n}")


def _mark(client, settings, prefix: str, count: int) -> None:
    SeenSet(client, settings.seen_buckets, prefix).add_many(
        [fingerprint(f"https://example.test/{n}") for n in range(count)])


def test_a_crawl_younger_than_a_minute_is_measured_over_its_own_age(redis_client):
    # 20 results over the last 10 s: 2 pages/s, not 20 / 60 s = 0.33.
    _add_at(redis_client, RESULTS_STREAM, *range(-10_000, 0, 500))

    progress = crawl_progress.measure(redis_client, seen=20, finished=20, results=20, to_do=0)

    assert progress["rate_from"] == "window"
    assert 9.5 <= progress["rate_over_s"] <= 11.5
    assert 1.7 <= progress["pages_per_s"] <= 2.1


def test_a_crawl_older_than_a_minute_is_measured_over_the_last_minute(redis_client):
    _add_at(redis_client, RESULTS_STREAM, -120_000, *range(-59_000, 0, 1000))

    progress = crawl_progress.measure(redis_client, seen=60, finished=60, results=60, to_do=0)

    assert progress["rate_over_s"] == 60.0
    assert 0.95 <= progress["pages_per_s"] <= 1.0


def test_dead_letters_count_as_done_work_in_the_rate_but_not_as_pages(redis_client):
    _add_at(redis_client, RESULTS_STREAM, *range(-10_000, 0, 1000))   # 10 results
    _add_at(redis_client, FAILURES_STREAM, *range(-10_000, 0, 2000))  # 5 failure records

    progress = crawl_progress.measure(redis_client, seen=45, finished=15, results=10, to_do=30)

    assert progress["outcomes_per_s"] == pytest.approx(1.5 * progress["pages_per_s"], rel=0.01)
    assert progress["eta_s"] == pytest.approx(30 / progress["outcomes_per_s"], rel=0.02)


def test_done_of_total_known_and_an_eta_at_the_current_rate(redis_client):
    _add_at(redis_client, RESULTS_STREAM, *range(-20_000, 0, 100))  # 200 in 20 s: 10/s

    progress = crawl_progress.measure(redis_client, seen=1000, finished=200, results=200,
                                      to_do=800)

    assert (progress["done"], progress["total"], progress["percent"]) == (200, 1000, 20.0)
    assert progress["eta_s"] == pytest.approx(80, rel=0.1) and progress["state"] == "running"
    [line] = crawl_progress.progress_lines(progress)
    assert line.startswith("progress: 200 done (20.0%), 0 failed, 800 to do; 1,000 URLs | ")
    assert "ETA 1m" in line


def test_done_failed_to_do_and_other_add_up_to_the_total(redis_client):
    # 150 outcomes of which 140 results; 30 queued; 20 known URLs neither (expired, dropped).
    progress = crawl_progress.measure(redis_client, seen=200, finished=150, results=140,
                                      to_do=30)

    assert (progress["done"], progress["failed"], progress["to_do"], progress["other"]) == (
        140, 10, 30, 20)
    assert progress["done"] + progress["failed"] + progress["to_do"] + progress["other"] == 200
    assert ", 20 other; 200 URLs" in crawl_progress.progress_lines(progress)[0]


def test_recrawls_make_the_total_what_is_done_plus_what_is_left(redis_client):
    progress = crawl_progress.measure(redis_client, seen=100, finished=150, results=150,
                                      to_do=50)

    assert progress["total"] == 200 and progress["percent"] == 75.0 and progress["other"] == 0


def test_no_outcome_while_work_is_left_is_stalled_and_nothing_left_is_done(redis_client):
    stalled = crawl_progress.measure(redis_client, seen=10, finished=0, results=0, to_do=10)
    finished = crawl_progress.measure(redis_client, seen=10, finished=10, results=10, to_do=0)
    idle = crawl_progress.measure(redis_client, seen=0, finished=0, results=0, to_do=0)

    assert stalled["outcomes_per_s"] == 0 and stalled["eta_s"] is None
    assert stalled["state"] == "stalled" and "ETA stalled (nothing finished in " in \
        crawl_progress.progress_lines(stalled)[0]
    assert finished["eta_s"] == 0 and "ETA done" in crawl_progress.progress_lines(finished)[0]
    assert idle["state"] == "idle" and "ETA nothing to do" in crawl_progress.progress_lines(idle)[0]


def _trim_all_but_the_last(client, stream: str) -> None:
    """What a sink does: keeps only what it has not written (here the newest entry)."""
    last = client.xrevrange(stream, count=1)[0][0].decode()
    client.xtrim(stream, minid=last, approximate=False)


def test_while_a_sink_trims_the_stream_the_rate_comes_from_a_reading_stored_in_redis(
        redis_client):
    # The ids of the last minute are gone, but XINFO's entries-added still counts every
    # result, and an earlier status call stored its reading of it 10 s ago.
    _add_at(redis_client, RESULTS_STREAM, *range(-3_000, 0, 100))  # 30 results
    _trim_all_but_the_last(redis_client, RESULTS_STREAM)
    now_ms = crawl_progress.redis_now_ms(redis_client)
    store_reading(redis_client, Reading(now_ms - 10_000, results=0, failures=0))
    store_reading(redis_client, Reading(now_ms - 90_000, results=0, failures=0))  # too old

    progress = crawl_progress.measure(redis_client, seen=100, finished=30, results=30, to_do=70)

    assert progress["rate_from"] == "counters"
    assert 9.5 <= progress["rate_over_s"] <= 11.5
    assert 2.5 <= progress["pages_per_s"] <= 3.2  # 30 results over ~10 s
    assert progress["eta_s"] == pytest.approx(70 / progress["outcomes_per_s"], rel=0.02)


def test_each_status_call_stores_its_reading_for_the_next_one(redis_client, monkeypatch):
    monkeypatch.setattr(crawl_progress, "SAMPLE_S", 0.2)
    _add_at(redis_client, RESULTS_STREAM, -1000, -500)
    _trim_all_but_the_last(redis_client, RESULTS_STREAM)
    crawl_progress.measure(redis_client, seen=10, finished=2, results=2, to_do=0)
    stored = crawl_progress.redis_now_ms(redis_client)
    while crawl_progress.redis_now_ms(redis_client) - stored < 1100:  # MIN_SPAN_S
        redis_client.xadd(RESULTS_STREAM, {"json": "{}"})
        _trim_all_but_the_last(redis_client, RESULTS_STREAM)

    def no_sampling(_seconds: float) -> None:
        raise AssertionError("a stored reading of the last minute is used, not a new sample")

    monkeypatch.setattr(crawl_progress.time, "sleep", no_sampling)
    progress = crawl_progress.measure(redis_client, seen=10, finished=2, results=2, to_do=8)

    assert progress["rate_from"] == "counters" and progress["outcomes_per_s"] > 0
    assert progress["eta_s"] is not None and progress["state"] == "running"


def test_a_trimmed_stream_with_no_reading_is_sampled_until_something_finishes(redis_client,
                                                                            monkeypatch):
    # A crawl of about one URL every 2.5 s: a 2 s reading alone often sees nothing finish
    # (``ETA -`` before); the sample goes on, up to SAMPLE_MAX_S, until something does.
    monkeypatch.setattr(crawl_progress, "SAMPLE_S", 0.3)
    _add_at(redis_client, RESULTS_STREAM, -1000, -500)
    _trim_all_but_the_last(redis_client, RESULTS_STREAM)
    sleeps = []

    def sleep_then_finish_one(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            redis_client.xadd(RESULTS_STREAM, {"json": "{}"})

    monkeypatch.setattr(crawl_progress.time, "sleep", sleep_then_finish_one)
    progress = crawl_progress.measure(redis_client, seen=10, finished=2, results=2, to_do=8)

    assert len(sleeps) == 3 and progress["rate_from"] == "counters"
    assert progress["outcomes_per_s"] > 0 and progress["eta_s"] is not None


def test_a_trimmed_stream_where_nothing_finishes_is_stalled_after_sample_max_s(redis_client,
                                                                              monkeypatch):
    monkeypatch.setattr(crawl_progress, "SAMPLE_S", 0.2)
    monkeypatch.setattr(crawl_progress, "SAMPLE_MAX_S", 0.6)
    _add_at(redis_client, RESULTS_STREAM, -1000, -500)
    _trim_all_but_the_last(redis_client, RESULTS_STREAM)

    progress = crawl_progress.measure(redis_client, seen=10, finished=2, results=2, to_do=8)

    assert progress["rate_from"] == "counters" and 0.55 <= progress["rate_over_s"] <= 1.5
    assert progress["state"] == "stalled" and progress["eta_s"] is None


def test_durations_read_like_a_long_jobs():
    assert [format_duration(s) for s in (None, 4.4, 65, 3600 * 2 + 7 * 60, 86400 * 3 + 3600)] \
        == ["-", "4s", "1m05s", "2h07m", "3d01h"]


def test_the_status_table_and_json_show_progress_and_the_eta(settings, redis_client, run_cli):
    _mark(redis_client, settings, SEEN_PREFIX, 40)
    _mark(redis_client, settings, DONE_PREFIX, 10)
    _add_at(redis_client, RESULTS_STREAM, *range(-10_000, 0, 1000))

    table = run_cli("stats.py")
    snapshot = json.loads(run_cli("stats.py", "--json").stdout)

    assert table.returncode == 0, table.stderr
    assert "progress: 10 done (25.0%), 0 failed, 0 to do, 30 other; 40 URLs" in table.stdout
    assert snapshot["progress"]["done"] == 10 and snapshot["progress"]["total"] == 40
    assert snapshot["pages_per_s_last_minute"] == snapshot["progress"]["pages_per_s"] > 0.5
    assert "ETA" in stats.render(snapshot)


def test_a_finished_crawl_with_a_trimmed_stream_is_not_sampled(redis_client, monkeypatch):
    _add_at(redis_client, RESULTS_STREAM, -1000, -500)
    _trim_all_but_the_last(redis_client, RESULTS_STREAM)

    def no_sampling(_seconds: float) -> None:
        raise AssertionError("nothing is left to do: no ETA to measure a rate for")

    monkeypatch.setattr(crawl_progress.time, "sleep", no_sampling)
    progress = crawl_progress.measure(redis_client, seen=2, finished=2, results=2, to_do=0)

    assert progress["state"] == "done"
    assert crawl_progress.progress_lines(progress)[0].endswith("| no rate measured | ETA done")
