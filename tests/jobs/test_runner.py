"""The job runner against real RabbitMQ and Redis: runs started, seeded, finished, stopped by
their limits and scheduled again, with worker processes where outcomes matter and hand-set
counters where only the runner's judgement is under test; ``scheduler.py run`` killed with
kill -9 mid-seeding and another replica finishing the seeding."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from common.core.config import Settings
from common.jobs.cron import next_after
from common.jobs.registry import JobRef, JobRegistry, outcomes
from common.jobs.runner import JobRunner, JobsLease
from common.jobs.spec import parse_job
from common.store.keys import JOBS_LEASE, job_run_key, worker_key
from tests.helpers import drain, output_of, results, start_worker_process, wait_for
from tests.test_scheduler_fleet import start_scheduler

#: Fast ticks, a short quiet, a one-second lease, webhooks to the loopback test site.
FAST = {"job_tick_s": 0.1, "job_quiet_s": 0.4, "schedule_lease_s": 1.0,
        "job_webhook_hosts": "127.0.0.1"}
FAST_ENV = {"JOB_TICK_S": "0.1", "JOB_QUIET_S": "0.4", "SCHEDULE_LEASE_S": "1",
            "HEARTBEAT_INTERVAL_S": "0.3", "JOB_WEBHOOK_HOSTS": "127.0.0.1"}


@contextmanager
def runner_thread(settings: Settings) -> Iterator[JobRunner]:
    """A JobRunner leading in a thread of the test process (its own Redis client)."""
    client = redis.Redis.from_url(settings.redis_url)
    fast = settings.with_overrides(**FAST)
    runner = JobRunner(fast, client, JobsLease(client, 1000, owner=f"test/{uuid.uuid4().hex}"))
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        stop.set()
        thread.join(15)
        client.close()


@pytest.fixture
def workers(settings: Settings) -> Iterator[list]:
    """Start worker processes with ``workers.append(start())``; killed after the test."""
    procs: list = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except Exception:  # noqa: BLE001 - a worker stuck on its way out is killed
            proc.kill()
            proc.wait(10)


def submit(client: redis.Redis, name: str, urls: list[str], **more: object) -> JobRegistry:
    registry = JobRegistry(client)
    registry.submit(parse_job({"name": name, "seeds": {"urls": urls}, **more}))
    return registry


def state_is(registry: JobRegistry, name: str, state: str, run: int = 1):
    return lambda: (s := registry.state(name)).state == state and s.run == run


def test_a_created_job_is_started_seeded_and_finished_with_exact_counters(
        settings, redis_client, site, workers):
    urls = [site.page_url(n) for n in range(1, 13)] + [site.url("/status/404")]
    registry = submit(redis_client, "shop", urls + urls[:3])  # duplicates counted once
    workers.append(start_worker_process(settings, env=FAST_ENV))
    with runner_thread(settings):
        assert wait_for(state_is(registry, "shop", "finished"), 60), output_of(workers[0])
    counters = registry.counters(JobRef("shop", 1))
    assert counters["known"] == 13 and counters["results"] == 12 and counters["failed"] == 1
    assert outcomes(counters) == 13
    assert registry.state("shop").seeded == 1 and registry.state("shop").reason == "nothing left"
    records = [r for r in results(redis_client) if r.get("job") == "shop"]
    assert sorted(r["url"] for r in records) == sorted(urls[:12])
    assert {r["run"] for r in records} == {1}


def test_a_run_does_not_finish_while_a_worker_shows_a_page_of_it_in_flight(
        settings, redis_client, site):
    registry = submit(redis_client, "busy", [site.page_url(1), site.page_url(2)])
    beat = {"id": "fake", "jobs": {"busy/1": 1}}
    redis_client.set(worker_key("fake"), json.dumps(beat), ex=60)
    with runner_thread(settings):
        assert wait_for(lambda: registry.state("busy").seeded == 1, 20)
        assert registry.counters(JobRef("busy", 1))["known"] == 2
        redis_client.hset(job_run_key("busy", 1), "results", 2)  # as the workers would
        assert not wait_for(state_is(registry, "busy", "finished"), 1.5)
        redis_client.delete(worker_key("fake"))
        assert wait_for(state_is(registry, "busy", "finished"), 10)


def test_a_paused_run_never_finishes_and_finishes_once_resumed(settings, redis_client, site):
    registry = submit(redis_client, "held", [site.page_url(1)])
    with runner_thread(settings):
        assert wait_for(lambda: registry.state("held").seeded == 1, 20)
        registry.pause("held")
        redis_client.hset(job_run_key("held", 1), "results", 1)
        assert not wait_for(state_is(registry, "held", "finished"), 1.5)
        registry.resume("held")
        assert wait_for(state_is(registry, "held", "finished"), 10)


def test_a_scheduled_job_runs_twice_each_with_its_own_run_counters_and_one_webhook(
        settings, redis_client, site, workers):
    hook = site.url("/status/204")
    urls = [site.page_url(n) for n in range(1, 6)]
    registry = submit(redis_client, "daily", urls, schedule={"every": "2s"}, webhooks=[hook])
    workers.append(start_worker_process(settings, env=FAST_ENV))
    with runner_thread(settings):
        assert wait_for(state_is(registry, "daily", "finished", run=2), 60), \
            output_of(workers[0])
        assert wait_for(lambda: len(site.requests_for("/status/204")) >= 2, 10)
        runs = [registry.counters(JobRef("daily", n)) for n in (1, 2)]
        assert wait_for(lambda: registry.state("daily").next_run > 0, 5)  # run 3 planned
    for counters in runs:
        assert counters["known"] == 5 and counters["results"] == 5
    assert runs[1]["started"] - runs[0]["started"] >= 2000
    bodies = [json.loads(r.body) for r in site.requests_for("/status/204")]
    assert [(b["run"], b["state"], b["counters"]["results"]) for b in bodies[:2]] == [
        (1, "finished", 5), (2, "finished", 5)]
    assert set(Counter(b["run"] for b in bodies).values()) == {1}  # one POST per run
    records = [r for r in results(redis_client) if r.get("job") == "daily"]
    assert Counter(r["run"] for r in records) == {1: 5, 2: 5}


def test_a_run_over_its_duration_is_stopped_and_its_schedule_goes_on(
        settings, redis_client, site):
    registry = submit(redis_client, "short", [site.page_url(1)],
                      limits={"duration": "1s"}, schedule={"every": "2s"},
                      webhooks=[site.url("/status/200")])
    with runner_thread(settings):  # no worker: the run's URL stays queued
        assert wait_for(lambda: registry.state("short").state == "cancelled", 10)
        state = registry.state("short")
        assert state.reason == "limit: duration" and 1000 <= state.ended - state.started < 2000
        assert wait_for(lambda: registry.state("short").run == 2, 10)
        assert wait_for(lambda: site.requests_for("/status/200"), 10)
    [body] = [json.loads(r.body) for r in site.requests_for("/status/200")][:1]
    assert (body["run"], body["state"], body["reason"]) == (1, "cancelled", "limit: duration")


def test_a_run_over_its_bytes_is_stopped(settings, redis_client, site):
    registry = submit(redis_client, "heavy", [site.page_url(1), site.page_url(2)],
                      limits={"bytes": "1KiB"})
    with runner_thread(settings):
        assert wait_for(lambda: registry.state("heavy").seeded == 1, 20)
        assert not wait_for(lambda: registry.state("heavy").state != "running", 0.5)
        redis_client.hset(job_run_key("heavy", 1), mapping={"results": 1, "bytes": 1024})
        assert wait_for(lambda: registry.state("heavy").state == "cancelled", 10)
    assert registry.state("heavy").reason == "limit: bytes"


def test_of_two_runners_one_leads_and_a_job_is_seeded_once(settings, redis_client, site,
                                                             amqp_channel):
    urls = [site.page_url(n) for n in range(1, 31)]
    registry = submit(redis_client, "twice", urls)
    with runner_thread(settings) as one, runner_thread(settings) as two:
        assert wait_for(lambda: registry.state("twice").seeded == 1, 20)
        assert sorted(bool(r.token) for r in (one, two)) == [False, True]
    assert registry.counters(JobRef("twice", 1))["known"] == 30
    queued = [json.loads(body) for _m, _p, body in drain(amqp_channel, "url_queue_ttl")]
    assert sorted(m["url"] for m in queued) == sorted(urls)
    assert {(m["job"], m["run"]) for m in queued} == {("twice", 1)}


def test_a_cron_job_plans_its_next_run_at_the_crons_next_time_after_the_end(
        settings, redis_client, site):
    registry = submit(redis_client, "nightly", [site.page_url(1)],
                      schedule={"cron": "*/5 * * * *"})
    with runner_thread(settings):
        assert wait_for(lambda: registry.state("nightly").seeded == 1, 20)
        redis_client.hset(job_run_key("nightly", 1), "results", 1)
        assert wait_for(lambda: registry.state("nightly").next_run > 0, 10)
    state = registry.state("nightly")
    assert (state.state, state.run) == ("finished", 1)
    assert state.next_run == next_after("*/5 * * * *", state.ended / 1000) * 1000
    assert state.next_run % 300_000 == 0 and 0 < state.next_run - state.ended <= 300_000


def test_a_cancelled_scheduled_job_is_not_run_again(settings, redis_client, site):
    registry = submit(redis_client, "stopped", [site.page_url(1)], schedule={"every": "1s"})
    with runner_thread(settings):
        assert wait_for(lambda: registry.state("stopped").seeded == 1, 20)
        registry.cancel("stopped")
        assert not wait_for(lambda: registry.state("stopped").run > 1, 2.5)
    assert registry.state("stopped").state == "cancelled"


def test_a_runner_killed_mid_seeding_is_replaced_and_the_run_gets_every_url_once(
        settings, redis_client, site, workers):
    n_urls = 800
    urls = [site.url(f"/page/{n % 300 + 1}?k={n}") for n in range(n_urls)]
    registry = submit(redis_client, "big", urls)
    env = {**FAST_ENV, "PRODUCER_BATCH": "20"}
    first = start_scheduler(settings, "runner-a", env)
    ref = JobRef("big", 1)
    try:
        assert wait_for(lambda: int(redis_client.hget(job_run_key("big", 1), "known") or 0)
                        >= 120, 60), output_of(first)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        killed_at = registry.counters(ref)["known"]
        assert killed_at < n_urls and registry.state("big").seeded == 0
        second = start_scheduler(settings, "runner-b", env)
        try:
            assert wait_for(lambda: registry.state("big").seeded == 1, 60), output_of(second)
            assert redis_client.get(JOBS_LEASE).decode().split(":", 1)[1].startswith(
                "runner-b/")
            assert registry.counters(ref)["known"] == n_urls
        finally:
            # Its recrawl learner, a result sink, would trim the results stream under us:
            # an in-process runner (no learner) sees the run to its end.
            second.kill()
            second.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    for _ in range(2):
        workers.append(start_worker_process(settings, env=FAST_ENV))
    with runner_thread(settings):
        assert wait_for(state_is(registry, "big", "finished"), 120), output_of(workers[0])
    counters = registry.counters(ref)
    assert counters["known"] == n_urls and counters["results"] == n_urls
    records = Counter(r["url"] for r in results(redis_client) if r.get("job") == "big")
    assert set(records) == set(urls) and set(records.values()) == {1}
