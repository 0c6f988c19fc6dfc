"""``stats.py`` during and after a real crawl with a files sink (issue 24's status defects): done +
failed + to do (+ other) add up to the total, to do reaches 0, the results are counted although
the sink trimmed the stream, dead letters now and ever are told apart, the ETA comes from a
rate, the table fits 80×24 and ``--json`` has its documented keys."""

from __future__ import annotations

import contextlib
import json
import signal
import time

from common.core.urls import fingerprint
from common.intake.producer import Producer
from common.store.dedupe import SeenSet
from common.store.keys import (
    DONE_PREFIX,
    RESULTS_STREAM,
    SEEN_PREFIX,
    deferred_key,
    worker_key,
)
from tests.helpers import (
    files_sink_process,
    output_of,
    start_worker_process,
    wait_for,
)
from tests.sink.parts import lines

PAGES = 30
MISSING = 2  # /status/404 URLs: a dead letter each
PROGRESS_KEYS = {"done", "failed", "to_do", "other", "total", "percent", "outcomes_per_s",
                 "pages_per_s", "rate_over_s", "rate_from", "eta_s", "state"}
TOP_KEYS = {"progress", "to_do", "results", "results_detail", "dead_letters", "dead_lettered",
            "dead_lettered_by_reason", "queues", "delayed", "seen", "pages_per_s_last_minute",
            "expired", "expired_waiting", "cache", "robots_blocked", "rate_limited", "retries",
            "user_code_stopped", "domains", "throttled", "deferred", "workers", "pressure",
            "counters"}


def _adds_up(progress: dict) -> bool:
    return (progress["done"] + progress["failed"] + progress["to_do"] + progress["other"]
            == progress["total"])


def test_status_during_and_after_a_crawl_with_a_files_sink_tells_one_consistent_story(
        settings, redis_client, run_cli, site, tmp_path):
    parts = tmp_path / "parts"
    with files_sink_process(settings, parts, tmp_path / "sink.log") as sink:
        assert wait_for(lambda: redis_client.sismember("sinks", "files"), 20)
        urls = [site.page_url(n) for n in range(1, PAGES + 1)]
        urls += [site.url(f"/status/404?n={n}") for n in range(MISSING)]
        with Producer(settings, redis_client) as producer:
            assert producer.submit(urls).new == len(urls)
        # 8 URLs a second: about 4 s of crawl, long enough to look at it mid-way.
        worker = start_worker_process(settings, env={"RATE_LIMIT": "8/second",
                                                     "WORKER_ID": "status-crawl"})
        try:
            during = []

            def mid_crawl() -> bool:
                shown = run_cli("stats.py", "--json")
                assert shown.returncode == 0, shown.stderr
                during.append(json.loads(shown.stdout))
                progress = during[-1]["progress"]
                return progress["done"] >= 5 and progress["to_do"] > 0

            assert wait_for(mid_crawl, 30, step_s=0.2), output_of(worker)

            def finished() -> dict | None:
                snapshot = json.loads(run_cli("stats.py", "--json").stdout)
                progress = snapshot["progress"]
                settled = (progress["to_do"] == 0 and progress["done"] == PAGES
                           and snapshot["results_detail"]["sinks"]["files"]["waiting"] == 0)
                return snapshot if settled else None

            assert wait_for(lambda: finished() is not None, 60, step_s=0.5), output_of(worker)
            after = finished()
            table = run_cli("stats.py", env={"COLUMNS": "80", "LINES": "24"})
            purged = run_cli("dlq.py", "purge", "--yes")
            later = json.loads(run_cli("stats.py", "--json").stdout)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
        sink.send_signal(signal.SIGTERM)
        assert sink.wait(30) == 0

    # Mid-crawl: every URL is somewhere, and the ETA comes from a rate.
    for snapshot in during:
        assert TOP_KEYS <= set(snapshot) and set(snapshot["progress"]) == PROGRESS_KEYS
        assert _adds_up(snapshot["progress"]), snapshot["progress"]
        assert set(snapshot["to_do"]) == {"ready", "delayed", "deferred", "in_flight", "total",
                                          "in_flight_reported"}
        assert snapshot["to_do"]["total"] == snapshot["progress"]["to_do"]
    middle = during[-1]["progress"]
    assert middle["state"] == "running" and middle["outcomes_per_s"] > 0, middle
    assert middle["eta_s"] is not None and middle["eta_s"] > 0

    # At the end: nothing to do, everything done or failed, the results counted from the
    # sink although it trimmed them off the stream.
    progress = after["progress"]
    assert (progress["done"], progress["failed"], progress["to_do"], progress["other"],
            progress["total"]) == (PAGES, MISSING, 0, 0, PAGES + MISSING)
    assert progress["state"] == "done" and progress["eta_s"] == 0
    results = after["results_detail"]
    assert after["results"] == results["recorded"] == PAGES
    assert results["source"] == "sinks" and results["sinks"]["files"]["written"] == PAGES
    # Trimmed; the sink may trim more after that snapshot, before it stops.
    assert redis_client.xlen(RESULTS_STREAM) <= results["in_stream"] < PAGES
    assert sum(1 for line in lines(parts) if line["stream"] == "results") == PAGES

    # Dead letters now (in the queue) and ever (counters), by reason; purged: none now.
    assert after["dead_letters"] == {"now": MISSING, "now_by_reason": {"http_404": MISSING},
                                     "by_reason_of": MISSING, "ever": MISSING,
                                     "ever_by_reason": {"http_404": MISSING}}
    assert purged.returncode == 0, purged.stderr
    assert later["dead_letters"]["now"] == 0 and later["dead_letters"]["now_by_reason"] == {}
    assert later["dead_letters"]["ever_by_reason"] == {"http_404": MISSING}

    # The table at 80x24.
    assert table.returncode == 0, table.stderr
    shown = table.stdout.rstrip("\n").splitlines()
    assert len(shown) <= 24 and all(len(line) <= 80 for line in shown), table.stdout
    text = table.stdout
    assert f"progress: {PAGES} done (93.8%), {MISSING} failed, 0 to do; 32 URLs" in text
    assert "ETA done" in text
    assert f"results: {PAGES} recorded; sink files: {PAGES} written, 0 waiting" in text
    assert f"dead letters now: {MISSING} (http_404 {MISSING})" in text
    assert "workers alive: 1" in text and "  status-crawl: running" in text


def test_to_do_counts_deferred_urls_by_what_waits_not_by_a_per_domain_tally(
        settings, redis_client, run_cli):
    # The per-domain tally (deferred:counts, for the status rows) says 32 while nothing waits:
    # "to do" is the ZSETs' members, so a finished crawl shows 0 whatever the tally says.
    redis_client.hset(deferred_key("counts"), "example.test", 32)
    finished = json.loads(run_cli("stats.py", "--json").stdout)
    redis_client.zadd(deferred_key(), {"example.test url_queue_ttl -\n{}": 1})
    waiting = json.loads(run_cli("stats.py", "--json").stdout)

    assert finished["progress"]["to_do"] == 0 and finished["progress"]["state"] != "running"
    assert waiting["to_do"]["deferred"] == 1 and waiting["progress"]["to_do"] == 1


def test_a_finished_crawl_has_nothing_in_flight_whatever_the_last_samples_said(
        settings, redis_client, run_cli):
    # Every URL known is done, nothing is queued; the heartbeats (like the management API's
    # statistics, up to 5 s old) still say what two workers held a moment ago.
    fingerprints = [fingerprint(f"https://example.test/{n}") for n in range(32)]
    for prefix in (SEEN_PREFIX, DONE_PREFIX):
        SeenSet(redis_client, settings.seen_buckets, prefix).add_many(fingerprints)
    for worker_id in ("local-1", "local-2"):
        redis_client.set(worker_key(worker_id), json.dumps(
            {"id": worker_id, "host": "h", "pid": 1, "started": 0, "processed": 16,
             "in_flight": 16, "current": [], "interval_s": 5.0, "beat": time.time(),
             "pressure": {}}), ex=60)

    snapshot = json.loads(run_cli("stats.py", "--json").stdout)

    assert snapshot["progress"]["to_do"] == 0 and snapshot["progress"]["state"] == "done"
    assert snapshot["to_do"]["in_flight"] == 0
    if snapshot["queues"]["url_queue_ttl"]["unacked"] is None:  # no management API here
        assert snapshot["to_do"]["in_flight_reported"] == 32


def test_the_live_view_keeps_the_dead_letter_reasons_while_no_count_moves(
        settings, redis_client, monkeypatch, capsys):
    import pika

    from common.ops import stats, status_counts

    with Producer(settings, redis_client) as producer:
        producer.submit(["ftp://bad/", "ftp://worse/"])  # two dead letters, invalid_url
    browsed = []
    real_browse = status_counts.dlq.browse

    def counting_browse(*args, **kwargs):
        browsed.append(1)
        return real_browse(*args, **kwargs)

    refreshes = []

    def stop_after_three(_seconds: float) -> None:
        refreshes.append(1)
        if len(refreshes) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_counts.dlq, "browse", counting_browse)
    monkeypatch.setattr(stats.time, "sleep", stop_after_three)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        with contextlib.suppress(KeyboardInterrupt):
            stats.watch(settings, connection, redis_client, interval_s=0)
    finally:
        connection.close()

    assert len(refreshes) == 3 and browsed == [1]  # three views, one browse
    shown = capsys.readouterr().out
    assert "dead letters now: 2 (invalid_url 2)" in shown
