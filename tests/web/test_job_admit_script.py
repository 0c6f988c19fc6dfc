"""The admit script with a job's message (common/web/ratelimit.py): the run's state decides
first, in the same call, and jobs:version comes back; the default job's call is unchanged."""

from __future__ import annotations

import pytest

from common.jobs.registry import JobRef, JobRegistry
from common.jobs.spec import parse_job
from common.store.dedupe import DoneSet
from common.store.keys import content_key, job_run_key, rate_log_key
from common.web.ratelimit import Rate, RateLimiter

pytestmark = pytest.mark.integration

DOMAIN = "127.0.0.1"
RATE = Rate(1000, 1000)


@pytest.fixture
def limiter(settings, redis_client) -> RateLimiter:
    return RateLimiter(redis_client, settings)


@pytest.fixture
def registry(redis_client) -> JobRegistry:
    return JobRegistry(redis_client)


def _job(registry: JobRegistry, name: str) -> JobRef:
    registry.submit(parse_job({"name": name, "seeds": {"urls": ["http://127.0.0.1:9/"]}}))
    return registry.start_run(name)


def _admit(limiter, settings, redis_client, url, job=None, **kw):
    done = DoneSet(redis_client, settings.seen_buckets).mark_for(
        url, scope=job.scope if job else None)
    return limiter.admit(DOMAIN, RATE, done=done, job=job, **kw), done


def _calls(redis_client, command: str) -> int:
    return redis_client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_the_default_jobs_admission_carries_and_runs_nothing_of_jobs(
        limiter, settings, redis_client):
    redis_client.config_resetstat()
    admission, _done = _admit(limiter, settings, redis_client, "http://127.0.0.1:9/d")
    assert admission.go and admission.jobs_version is None and admission.job_verdict == ""
    assert _calls(redis_client, "hmget") == 0 and _calls(redis_client, "get") == 0
    done_admission, _ = _admit(limiter, settings, redis_client, "http://127.0.0.1:9/d")
    assert done_admission.go  # its outcome not recorded: a second permit, as before jobs


def test_a_running_jobs_admission_takes_its_turn_and_brings_back_the_version(
        limiter, settings, redis_client, registry):
    ref = _job(registry, "running")
    redis_client.config_resetstat()
    admission, _done = _admit(limiter, settings, redis_client, "http://127.0.0.1:9/r", ref)
    assert admission.go and admission.permit is not None and admission.job_verdict == ""
    assert admission.jobs_version == registry.version()
    assert _calls(redis_client, "hmget") == 1  # the state, inside the one script call
    assert _calls(redis_client, "evalsha") == 1


def test_a_paused_runs_admission_books_and_marks_nothing(limiter, settings, redis_client,
                                                        registry):
    ref = _job(registry, "paused")
    registry.pause("paused")
    admission, done = _admit(limiter, settings, redis_client, "http://127.0.0.1:9/p", ref,
                             booked_ms=5)
    assert admission.job_verdict == "paused" and not admission.go
    assert admission.jobs_version == registry.version()
    assert redis_client.zcard(rate_log_key(DOMAIN)) == 0
    assert not redis_client.sismember(done.key, done.member)
    assert redis_client.hget(job_run_key("paused", ref.run), "cancelled") is None


def test_a_cancelled_runs_admission_marks_it_done_and_counts_it_once(
        limiter, settings, redis_client, registry):
    ref = _job(registry, "over")
    registry.cancel("over")
    url = "http://127.0.0.1:9/c"
    admission, done = _admit(limiter, settings, redis_client, url, ref)
    assert admission.job_verdict == "cancelled" and admission.permit is None
    assert redis_client.sismember(done.key, done.member)
    again, _ = _admit(limiter, settings, redis_client, url, ref)
    assert again.already_done and again.jobs_version == registry.version()
    assert redis_client.hget(job_run_key("over", ref.run), "cancelled") == b"1"
    assert redis_client.zcard(rate_log_key(DOMAIN)) == 0


def test_a_message_of_another_run_than_the_running_one_is_cancelled(
        limiter, settings, redis_client, registry):
    ref = _job(registry, "twice")
    newer, _ = _admit(limiter, settings, redis_client, "http://127.0.0.1:9/n",
                      JobRef("twice", ref.run + 1))
    older, _ = _admit(limiter, settings, redis_client, "http://127.0.0.1:9/o",
                      JobRef("twice", ref.run))
    assert newer.job_verdict == "cancelled" and older.job_verdict == ""


def test_a_done_url_of_a_paused_run_is_already_done_not_parked(
        limiter, settings, redis_client, registry):
    ref = _job(registry, "halted")
    url = "http://127.0.0.1:9/h"
    DoneSet(redis_client, settings.seen_buckets).add(
        DoneSet(redis_client, settings.seen_buckets).mark_for(url, scope=ref.scope))
    registry.pause("halted")
    admission, _ = _admit(limiter, settings, redis_client, url, ref)
    assert admission.already_done and admission.job_verdict == ""
    assert admission.jobs_version == registry.version()


def test_a_running_jobs_cache_hit_brings_back_the_version_too(
        limiter, settings, redis_client, registry):
    ref = _job(registry, "cached")
    url = "http://127.0.0.1:9/cached"
    redis_client.set(content_key(url), b"stored")
    admission, _ = _admit(limiter, settings, redis_client, url, ref, cache_url=url)
    assert admission.cached == b"stored" and admission.jobs_version == registry.version()
    plain, _ = _admit(limiter, settings, redis_client, url, cache_url=url)
    assert plain.cached == b"stored" and plain.jobs_version is None
