"""A run's outcome counters (``job:{name}:run:{n}``), bumped by the script that records the
outcome and only when the outcome is new (real Redis)."""

from __future__ import annotations

from common.broker.messages import WorkMessage
from common.core.urls import job_fingerprint
from common.jobs.registry import JobRef
from common.store.dedupe import DoneSet, SeenSet
from common.store.keys import COUNTERS, job_run_key
from common.store.results import ResultStore
from common.work.expired import release_expired

URL = "http://shop.test/p/1"
JOB = JobRef("shop", 3)


def _run(client, job: JobRef = JOB) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(job_run_key(job.name, job.run)).items()}


def test_a_result_recorded_twice_counts_once_with_its_bytes(settings, redis_client):
    store = ResultStore(redis_client, settings.results_maxlen)
    mark = DoneSet(redis_client, settings.seen_buckets).mark_for(URL, scope=JOB.scope)
    record = {"url": URL, "status": 200, "bytes": 1234, **JOB.fields()}
    assert store.record(dict(record), done=mark) is True
    assert store.record(dict(record), done=mark) is False  # a second pass: nothing appended
    assert _run(redis_client) == {"results": 1, "bytes": 1234}
    assert store.count() == 1


def test_a_failure_recorded_twice_counts_failed_and_its_reason_once(settings, redis_client):
    store = ResultStore(redis_client, settings.results_maxlen)
    mark = DoneSet(redis_client, settings.seen_buckets).mark_for(URL, scope=JOB.scope)
    record = {"url": URL, "outcome": "dead_letter", "reason": "fetch_http_404",
              **JOB.fields()}
    assert store.record_failure(dict(record), mark) is True
    assert store.record_failure(dict(record), mark) is False
    assert _run(redis_client) == {"failed": 1, "failed:fetch_http_404": 1}


def test_two_runs_of_a_job_count_the_same_url_each(settings, redis_client):
    store = ResultStore(redis_client, settings.results_maxlen)
    done = DoneSet(redis_client, settings.seen_buckets)
    later = JobRef("shop", 4)
    for job in (JOB, later):
        assert store.record({"url": URL, "bytes": 10, **job.fields()},
                            done=done.mark_for(URL, scope=job.scope))
    assert _run(redis_client, JOB)["results"] == 1 and _run(redis_client, later)["results"] == 1


def test_a_default_job_record_touches_no_run_counters(settings, redis_client):
    store = ResultStore(redis_client, settings.results_maxlen)
    mark = DoneSet(redis_client, settings.seen_buckets).mark_for(URL)
    assert store.record({"url": URL, "bytes": 10}, done=mark, counters={"cache_misses": 1})
    assert not list(redis_client.scan_iter(match="job:*"))
    assert redis_client.hget(COUNTERS, "cache_misses") == b"1"  # the fleet's counters as ever


def test_an_expired_job_message_releases_its_runs_fingerprint_and_counts_once(
        settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    fp = job_fingerprint(URL, JOB.scope)
    seen.add_many([fp])
    body = WorkMessage(url=URL, extra=JOB.fields()).to_json()  # no fp: computed in its run
    for _delivery in range(2):  # the second copy finds nothing to release
        assert release_expired(body, seen).kind == "released"
    assert seen.contains_many([fp]) == [False]
    assert _run(redis_client) == {"expired": 1}
    counters = redis_client.hgetall(COUNTERS)
    assert counters[b"expired"] == b"2" and counters[b"released"] == b"1"


def test_an_expired_default_job_message_releases_its_url_and_no_run_counts_it(
        settings, redis_client):
    seen = SeenSet(redis_client, settings.seen_buckets)
    plain, scoped = job_fingerprint(URL, None), job_fingerprint(URL, JOB.scope)
    seen.add_many([plain, scoped])
    assert release_expired(WorkMessage(url=URL).to_json(), seen).kind == "released"
    assert seen.contains_many([plain, scoped]) == [False, True]  # the job's run keeps its own
    assert not list(redis_client.scan_iter(match="job:*"))
