"""A run's progress from its counters (common/jobs/progress.py): done is every outcome, failed
by reason, the rate from the readings each call stores, the ETA at that rate."""

from __future__ import annotations

import threading
import time

from common.jobs.progress import measure, readings_key
from common.jobs.registry import JobRegistry
from common.jobs.spec import parse_job
from common.store.keys import job_key, job_run_key


def _running(redis_client, name="shop"):
    registry = JobRegistry(redis_client)
    registry.submit(parse_job({"name": name, "seeds": {"urls": ["http://127.0.0.1:9/"]}}))
    ref = registry.start_run(name)
    return registry, ref


def test_done_counts_every_outcome_and_failures_are_split_by_reason(redis_client):
    registry, ref = _running(redis_client)
    redis_client.hset(job_run_key("shop", ref.run), mapping={
        "known": 20, "results": 6, "failed": 3, "failed:http_404": 1, "failed:max_retries": 2,
        "cancelled": 1, "expired": 2, "bytes": 5000})
    [progress] = measure(redis_client, registry.states())
    assert (progress.known, progress.done, progress.left) == (20, 12, 8)
    assert progress.failed_by_reason == {"max_retries": 2, "http_404": 1}
    assert (progress.results, progress.cancelled, progress.expired) == (6, 1, 2)


def test_a_run_started_within_the_last_minute_is_measured_since_its_start(redis_client):
    registry, ref = _running(redis_client)
    redis_client.hset(job_run_key("shop", ref.run), mapping={"known": 100, "results": 10})
    time.sleep(1.2)
    [progress] = measure(redis_client, registry.states())
    assert progress.pages_per_s is not None and 10 / 3 < progress.pages_per_s < 10 / 1.2 + 0.1
    assert progress.eta_s is not None
    assert abs(progress.eta_s - 90 / progress.outcomes_per_s) < 0.2


def test_the_rate_is_taken_between_stored_readings_when_the_run_is_older(redis_client):
    registry, ref = _running(redis_client)
    long_ago = int(time.time() * 1000) - 3_600_000
    redis_client.hset(job_key("shop"), "started", long_ago)
    run_key = job_run_key("shop", ref.run)
    redis_client.hset(run_key, mapping={"known": 50, "results": 10})
    [first] = measure(redis_client, registry.states())
    assert first.pages_per_s is None and first.eta_s is None  # nothing to measure from yet
    assert redis_client.zcard(readings_key("shop", ref.run)) == 1
    time.sleep(1.2)
    redis_client.hincrby(run_key, "results", 12)
    [second] = measure(redis_client, registry.states())
    assert second.pages_per_s is not None and 12 / 2 < second.pages_per_s <= 12 / 1.2
    assert second.eta_s is not None and second.eta_s > 0


def test_a_sample_gives_a_first_call_its_rate(redis_client):
    registry, ref = _running(redis_client)
    redis_client.hset(job_key("shop"), "started", int(time.time() * 1000) - 3_600_000)
    run_key = job_run_key("shop", ref.run)
    redis_client.hset(run_key, mapping={"known": 10, "results": 0})
    threading.Timer(0.2, lambda: redis_client.hincrby(run_key, "results", 5)).start()
    [progress] = measure(redis_client, registry.states(), sample_s=1.0)
    assert progress.pages_per_s is not None and 4 <= progress.pages_per_s <= 5.1
    assert progress.done == 5


def test_a_job_without_a_run_has_zeros_and_no_rate(redis_client):
    registry = JobRegistry(redis_client)
    registry.submit(parse_job({"name": "later", "seeds": {"urls": ["http://127.0.0.1:9/"]}}))
    [progress] = measure(redis_client, registry.states(), sample_s=1.0)
    assert (progress.state, progress.run, progress.known, progress.pages_per_s) == (
        "created", 0, 0, None)
