"""The status view's progress: done of total known, the rate over the time the crawl has
actually run, the rate while a sink trims the streams, and an ETA (common/ops/crawl_progress.py),
against a real Redis."""

from __future__ import annotations

import json

import pytest

from common.core.urls import fingerprint
from common.ops import crawl_progress, stats
from common.ops.crawl_progress import RateHistory, Reading, format_duration
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

    progress = crawl_progress.measure(redis_client, seen=20, done=20, to_do=0)

    assert progress["rate_from"] == "window"
    assert 9.5 <= progress["rate_over_s"] <= 11.5
    assert 1.7 <= progress["pages_per_s"] <= 2.1


def test_a_crawl_older_than_a_minute_is_measured_over_the_last_minute(redis_client):
    _add_at(redis_client, RESULTS_STREAM, -120_000, *range(-59_000, 0, 1000))

    progress = crawl_progress.measure(redis_client, seen=60, done=60, to_do=0)

    assert progress["rate_over_s"] == 60.0
    assert 0.95 <= progress["pages_per_s"] <= 1.0


def test_dead_letters_count_as_done_work_in_the_rate_but_not_as_pages(redis_client):
    _add_at(redis_client, RESULTS_STREAM, *range(-10_000, 0, 1000))   # 10 results
    _add_at(redis_client, FAILURES_STREAM, *range(-10_000, 0, 2000))  # 5 failure records

    progress = crawl_progress.measure(redis_client, seen=15, done=15, to_do=30)

    assert progress["outcomes_per_s"] == pytest.approx(1.5 * progress["pages_per_s"], rel=0.01)
    assert progress["eta_s"] == pytest.approx(30 / progress["outcomes_per_s"], rel=0.02)


def test_done_of_total_known_and_an_eta_at_the_current_rate(redis_client):
    _add_at(redis_client, RESULTS_STREAM, *range(-20_000, 0, 100))  # 200 in 20 s: 10/s

    progress = crawl_progress.measure(redis_client, seen=1000, done=200, to_do=800)

    assert (progress["done"], progress["total"], progress["percent"]) == (200, 1000, 20.0)
    assert progress["eta_s"] == pytest.approx(80, rel=0.1)
    line = crawl_progress.progress_line(progress)
    assert line.startswith("progress: 200 of 1,000 done (20.0%), 800 to do | ")
    assert "ETA 1m" in line


def test_recrawls_make_the_total_what_is_done_plus_what_is_left(redis_client):
    progress = crawl_progress.measure(redis_client, seen=100, done=150, to_do=50)

    assert progress["total"] == 200 and progress["percent"] == 75.0


def test_no_rate_means_no_eta_and_nothing_left_means_done(redis_client):
    idle = crawl_progress.measure(redis_client, seen=10, done=0, to_do=10)
    finished = crawl_progress.measure(redis_client, seen=10, done=10, to_do=0)

    assert idle["outcomes_per_s"] == 0 and idle["eta_s"] is None
    assert "ETA -" in crawl_progress.progress_line(idle)
    assert finished["eta_s"] == 0 and "ETA done" in crawl_progress.progress_line(finished)


def test_while_a_sink_trims_the_stream_the_rate_comes_from_its_counters(redis_client):
    # A sink keeps only what it has not written: the ids of the last minute are gone, but
    # XINFO's entries-added still counts every result.
    _add_at(redis_client, RESULTS_STREAM, *range(-3_000, 0, 100))  # 30 results
    last = redis_client.xrevrange(RESULTS_STREAM, count=1)[0][0].decode()
    redis_client.xtrim(RESULTS_STREAM, minid=last, approximate=False)
    history = RateHistory()
    now_ms = crawl_progress.redis_now_ms(redis_client)
    history.add(Reading(now_ms - 10_000, results=0, failures=0))

    progress = crawl_progress.measure(redis_client, seen=100, done=30, to_do=70,
                                      history=history)

    assert progress["rate_from"] == "counters"
    assert 9.5 <= progress["rate_over_s"] <= 11.5
    assert 2.5 <= progress["pages_per_s"] <= 3.2  # 30 results over ~10 s


def test_a_trimmed_stream_with_no_earlier_reading_is_sampled(redis_client, monkeypatch):
    monkeypatch.setattr(crawl_progress, "SAMPLE_S", 0.3)
    _add_at(redis_client, RESULTS_STREAM, -1000, -500)
    last = redis_client.xrevrange(RESULTS_STREAM, count=1)[0][0].decode()
    redis_client.xtrim(RESULTS_STREAM, minid=last, approximate=False)

    progress = crawl_progress.measure(redis_client, seen=10, done=2, to_do=8)

    assert progress["rate_from"] == "counters" and 0.25 <= progress["rate_over_s"] <= 1.0
    assert progress["outcomes_per_s"] == 0 and progress["eta_s"] is None


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
    assert "progress: 10 of 40 done (25.0%), 0 to do" in table.stdout
    assert snapshot["progress"]["done"] == 10 and snapshot["progress"]["total"] == 40
    assert snapshot["pages_per_s_last_minute"] == snapshot["progress"]["pages_per_s"] > 0.5
    assert "ETA" in stats.render(snapshot)
