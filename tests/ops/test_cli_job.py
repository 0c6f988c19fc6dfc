"""``scrape-fleet job`` (common/ops/cli_job.py), the jobs section of ``status`` and ``dlq
--job``: submit a job file, list it, move it through its lifecycle, read its results, see it
in the status view, list and replay its dead letters."""

from __future__ import annotations

import json

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.urls import job_fingerprint
from common.jobs.registry import JobRef, JobRegistry
from common.ops.cli_inspect import dlq_main, status_main
from common.ops.cli_job import job_main
from common.store.dedupe import DoneSet, SeenSet
from common.store.keys import JOBS, job_run_key
from tests.helpers import drain, publish_dead_letter, queue_depth

GOOD = """\
name: shop
description: the shop's catalogue
seeds:
  urls: [http://127.0.0.1:9/a, http://127.0.0.1:9/b]
crawl: {max_depth: 2}
priority: high
limits: {pages: 100, duration: 2h}
schedule: {every: 6h}
"""


def _job(settings, capsys, *argv):
    code = job_main(settings, list(argv), prog="scrape-fleet job")
    out = capsys.readouterr()
    return code, out.out, out.err


def _submit(settings, capsys, tmp_path, text=GOOD):
    path = tmp_path / "job.yml"
    path.write_text(text, encoding="utf-8")
    return _job(settings, capsys, "submit", str(path))


def test_a_submitted_job_file_is_listed_as_created(settings, redis_client, capsys, tmp_path):
    code, out, _err = _submit(settings, capsys, tmp_path)
    assert code == 0 and "job shop: created" in out and "scrape-fleet job show shop" in out
    code, out, _err = _job(settings, capsys, "list", "--json")
    [listed] = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert (listed["name"], listed["state"], listed["run"], listed["priority"],
            listed["schedule"]) == ("shop", "created", 0, "high", "every 6h00m")
    code, table, _err = _job(settings, capsys, "list")
    assert table.splitlines()[0].split()[:4] == ["name", "state", "run", "done/known"]
    assert table.splitlines()[1].split()[:3] == ["shop", "created", "0"]
    code, shown, _err = _job(settings, capsys, "show", "shop")
    assert "job shop: created, no run yet" in shown and "the shop's catalogue" in shown
    assert "limits: pages 100, duration 2h00m" in shown and "CRAWL_MAX_DEPTH=2" in shown


def test_a_bad_job_file_exits_2_naming_the_field_and_stores_nothing(redis_client, run_cli,
                                                                      tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text(GOOD.replace("max_depth: 2", "max_depth: -1"), encoding="utf-8")
    submitted = run_cli("-m", "common.ops.console", "job", "submit", str(path))
    assert submitted.returncode == 2, submitted.stderr
    assert "crawl.max_depth" in submitted.stderr and str(path) in submitted.stderr
    assert not redis_client.exists(JOBS) and not list(redis_client.scan_iter("job:*"))


def test_a_job_file_on_standard_input_is_submitted_through_the_root_script(redis_client,
                                                                          run_cli):
    submitted = run_cli("job.py", "submit", "-", input_text=GOOD)
    assert submitted.returncode == 0, submitted.stderr
    assert "job shop: created (2 seed URLs" in submitted.stdout
    assert redis_client.hget(JOBS, "shop") is not None
    refused = run_cli("job.py", "submit", "-", input_text="name: [unclosed\n")
    assert refused.returncode == 2 and "not YAML" in refused.stderr


def test_a_taken_name_is_refused_without_replace_and_replaced_with_it(settings, redis_client,
                                                                       capsys, tmp_path):
    assert _submit(settings, capsys, tmp_path)[0] == 0
    code, _out, err = _submit(settings, capsys, tmp_path, GOOD.replace("high", "normal"))
    assert code == 1 and "exists" in err
    assert JobRegistry(redis_client).spec("shop").priority == "high"
    path = tmp_path / "job.yml"
    code, _out, _err = _job(settings, capsys, "submit", str(path), "--replace")
    assert code == 0 and JobRegistry(redis_client).spec("shop").priority == "normal"


def test_pause_resume_and_cancel_move_the_job_and_refuse_what_its_state_does_not_allow(
        settings, redis_client, capsys, tmp_path):
    _submit(settings, capsys, tmp_path)
    code, _out, err = _job(settings, capsys, "pause", "shop")
    assert code == 1 and "cannot pause a job that is created" in err
    JobRegistry(redis_client).start_run("shop")
    code, out, _err = _job(settings, capsys, "pause", "shop")
    assert code == 0 and out.startswith("job shop: paused")
    assert _job(settings, capsys, "pause", "shop")[0] == 1
    code, out, _err = _job(settings, capsys, "resume", "shop")
    assert code == 0 and out.startswith("job shop: running")
    code, _out, err = _job(settings, capsys, "delete", "shop")
    assert code == 1 and "cancel it first" in err
    code, out, _err = _job(settings, capsys, "cancel", "shop", "--reason", "wrong seeds")
    assert code == 0 and out.startswith("job shop: cancelled")
    code, _out, err = _job(settings, capsys, "resume", "shop")
    assert code == 1 and "cannot resume a job that is cancelled" in err
    assert "(wrong seeds)" in _job(settings, capsys, "show", "shop")[1]
    assert _job(settings, capsys, "delete", "shop")[0] == 0
    code, _out, err = _job(settings, capsys, "show", "shop")
    assert code == 1 and "no job named 'shop'" in err


def test_runs_lists_each_runs_counters(settings, redis_client, capsys, tmp_path):
    _submit(settings, capsys, tmp_path)
    registry = JobRegistry(redis_client)
    first = registry.start_run("shop")
    redis_client.hset(job_run_key("shop", 1), mapping={"known": 5, "results": 4, "failed": 1})
    registry.finish(first)
    registry.start_run("shop")
    code, out, _err = _job(settings, capsys, "runs", "shop", "--json")
    runs = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["run"] for r in runs] == [1, 2]
    assert (runs[0]["known"], runs[0]["results"], runs[0]["failed"]) == (5, 4, 1)
    assert runs[0]["ended"] > 0 and runs[1]["started"] > 0 and "ended" not in runs[1]
    assert _job(settings, capsys, "runs", "shop")[1].startswith("run 1: known 5, results 4")


def _record(redis_client, url, **fields):
    redis_client.xadd("results", {"json": json.dumps({"url": url, "status": 200,
                                                      "title": url[-1], **fields})})


def test_results_are_the_runs_own_records_from_the_stream(settings, redis_client, capsys,
                                                         tmp_path):
    _submit(settings, capsys, tmp_path)
    registry = JobRegistry(redis_client)
    registry.finish(registry.start_run("shop"))
    registry.start_run("shop")
    _record(redis_client, "http://x/d")  # the default job's
    _record(redis_client, "http://x/1", job="shop", run=1)
    _record(redis_client, "http://x/2", job="shop", run=2)
    _record(redis_client, "http://x/3", job="shop", run=2)
    _record(redis_client, "http://x/o", job="other", run=2)
    code, out, err = _job(settings, capsys, "results", "shop")
    assert code == 0 and "scrape-fleet export --job" in err
    assert [json.loads(line)["url"] for line in out.splitlines()] == ["http://x/2",
                                                                      "http://x/3"]
    code, out, _err = _job(settings, capsys, "results", "shop", "--run", "1", "--format", "csv")
    header, *rows = out.splitlines()
    assert header.startswith("id,") and "title" in header.split(",")
    assert len(rows) == 1 and "http://x/1" in rows[0]
    code, out, _err = _job(settings, capsys, "results", "shop", "--limit", "1")
    assert [json.loads(line)["url"] for line in out.splitlines()] == ["http://x/2"]


def test_status_shows_a_line_per_job_beside_the_default_jobs_view(settings, redis_client,
                                                                  capsys, tmp_path):
    _submit(settings, capsys, tmp_path)
    JobRegistry(redis_client).start_run("shop")
    redis_client.hset(job_run_key("shop", 1), mapping={"known": 10, "results": 4, "failed": 1})
    assert status_main(settings, []) == 0
    out = capsys.readouterr().out
    assert "progress:" in out  # the default job's line, as before
    assert "job shop: running, run 1, 5/10 done" in out and "1 failed" in out
    assert status_main(settings, ["--json"]) == 0
    [job] = json.loads(capsys.readouterr().out)["jobs"]
    assert (job["name"], job["known"], job["done"], job["failed"]) == ("shop", 10, 5, 1)


@pytest.fixture
def job_letters(settings, redis_client, amqp_channel, capsys, tmp_path):
    """Job shop at run 2 (running); dead letters of its runs 1 and 2, of job other, and of
    the default job."""
    _submit(settings, capsys, tmp_path)
    registry = JobRegistry(redis_client)
    registry.finish(registry.start_run("shop"))
    registry.start_run("shop")
    publish_dead_letter(amqp_channel, "http://127.0.0.1:9/old", job="shop", run=1)
    publish_dead_letter(amqp_channel, "http://127.0.0.1:9/now", "http_503", job="shop", run=2)
    publish_dead_letter(amqp_channel, "http://127.0.0.1:9/else", job="other", run=1)
    publish_dead_letter(amqp_channel, "http://127.0.0.1:9/plain")
    return registry


def _dlq(settings, capsys, *argv):
    code = dlq_main(settings, list(argv), prog="scrape-fleet dlq")
    out = capsys.readouterr()
    return code, out.out, out.err


def test_dlq_list_picks_a_jobs_dead_letters_and_one_run_of_them(settings, amqp_channel,
                                                               capsys, job_letters):
    code, out, _err = _dlq(settings, capsys, "list", "--job", "shop", "--json")
    letters = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [(x["url"], x["job"], x["run"]) for x in letters] == [
        ("http://127.0.0.1:9/old", "shop", 1), ("http://127.0.0.1:9/now", "shop", 2)]
    code, out, _err = _dlq(settings, capsys, "list", "--job", "shop", "--run", "2")
    assert "job=shop/2" in out and "/old" not in out and "1 shown" in out
    assert queue_depth(amqp_channel, topology.FAILED_QUEUE) == 4


def test_dlq_replay_sends_a_running_runs_letter_back_into_it_and_refuses_an_older_runs(
        settings, redis_client, amqp_channel, capsys, job_letters):
    now = "http://127.0.0.1:9/now"
    scope = JobRef("shop", 2).scope
    seen, done = SeenSet(redis_client, settings.seen_buckets), DoneSet(redis_client,
                                                                       settings.seen_buckets)
    seen.add_many([job_fingerprint(now, scope)])
    done.add(done.mark_for(now, scope=scope))
    # The run is at its limits.pages (100), the dead letter's URL one of them: replaying it
    # takes back what it counted, so it fits again.
    redis_client.hset(job_run_key("shop", 2), mapping={
        "known": 100, "results": 98, "failed": 2, "failed:http_503": 1, "failed:x": 1})
    code, out, err = _dlq(settings, capsys, "replay", "--job", "shop")
    assert code == 1, err  # one refused
    assert out.startswith("replayed=1 ") and "kept=1" in out
    assert "run 1 of job shop is over (the job is at run 2)" in err
    assert not done.contains(done.mark_for(now, scope=scope))
    assert seen.contains_many([job_fingerprint(now, scope)]) == [True]  # marked seen again
    counters = JobRegistry(redis_client).counters(JobRef("shop", 2))
    assert (counters["known"], counters["failed"], counters["failed:http_503"]) == (100, 1, 0)
    published = [WorkMessage.from_json(body) for _m, _p, body in
                 drain(amqp_channel, "priority_queue") + drain(amqp_channel, "url_queue_ttl")]
    assert [(m.url, m.extra.get("job"), m.extra.get("run")) for m in published] == [
        (now, "shop", 2)]
    left = [json.loads(line) for line in _dlq(settings, capsys, "list", "--json")[1].splitlines()]
    assert sorted(x["url"] for x in left) == ["http://127.0.0.1:9/else",
                                              "http://127.0.0.1:9/old",
                                              "http://127.0.0.1:9/plain"]


def test_dlq_replay_of_a_paused_job_is_refused_and_leaves_its_letters(
        settings, redis_client, amqp_channel, capsys, job_letters):
    job_letters.pause("shop")
    code, out, err = _dlq(settings, capsys, "replay", "--job", "shop")
    assert code == 1 and out.startswith("replayed=0 ") and "kept=2" in out
    assert "run 2 of job shop is paused, not running" in err
    assert queue_depth(amqp_channel, topology.FAILED_QUEUE) == 4


def test_a_webhook_outside_the_allowed_hosts_is_refused_at_submission(settings, redis_client,
                                                                       capsys, tmp_path):
    text = GOOD + "webhooks: [http://hooks.example/done]\n"
    code, _out, err = _submit(settings.with_overrides(job_webhook_hosts="127.0.0.1"), capsys,
                              tmp_path, text)
    assert code == 2 and "webhooks[0]: host 'hooks.example' not in JOB_WEBHOOK_HOSTS" in err
    assert not redis_client.exists(JOBS)


def test_a_letter_its_run_cannot_take_back_stays_in_the_queue_with_its_counts(
        settings, redis_client, amqp_channel, capsys, job_letters):
    now = "http://127.0.0.1:9/now"
    scope = JobRef("shop", 2).scope
    done = DoneSet(redis_client, settings.seen_buckets)
    done.add(done.mark_for(now, scope=scope))
    # 100 other URLs fill the run's limits.pages: the letter's URL (no longer seen) is over it.
    redis_client.hset(job_run_key("shop", 2), mapping={
        "known": 100, "results": 99, "failed": 1, "failed:http_503": 1})
    code, out, err = _dlq(settings, capsys, "replay", "--job", "shop", "--reason", "http_503")
    assert code == 1 and out.startswith("replayed=0 ") and "over_budget=1" in out
    assert "not published into run 2 of job shop" in err
    assert done.contains(done.mark_for(now, scope=scope))  # put back
    counters = JobRegistry(redis_client).counters(JobRef("shop", 2))
    assert (counters["known"], counters["failed"], counters["failed:http_503"]) == (100, 1, 1)
    assert queue_depth(amqp_channel, topology.FAILED_QUEUE) == 4
