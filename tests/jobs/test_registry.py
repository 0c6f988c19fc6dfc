"""The jobs registry (common/jobs/registry.py) on a real Redis: a job is stored whole or not at
all, its lifecycle moves only where the design allows, a paused run's parked pages go back to
the deferral on resume and count cancelled on cancel, and a name's run numbers never repeat."""

from __future__ import annotations

import pytest

from common.intake.defer import Pending
from common.jobs.registry import JobRef, JobRegistry, JobStateError
from common.jobs.spec import parse_job
from common.store.keys import (
    JOBS,
    JOBS_VERSION,
    deferred_key,
    job_key,
    job_parked_key,
    job_run_key,
    job_seeds_key,
)


def _spec(name="shop", **more):
    return parse_job({"name": name, "seeds": {"urls": ["http://a.test/", "http://b.test/"]},
                      **more})


def test_a_submitted_job_is_created_with_its_definition_and_seeds(redis_client):
    registry = JobRegistry(redis_client)
    version = registry.version()
    state = registry.submit(_spec())
    assert (state.state, state.run) == ("created", 0)
    assert registry.spec("shop", with_seeds=True).seed_urls == ("http://a.test/",
                                                                 "http://b.test/")
    assert registry.version() == version + 1
    assert [s.name for s in registry.states()] == ["shop"]


def test_a_taken_name_is_refused_and_an_active_job_is_never_replaced(redis_client):
    registry = JobRegistry(redis_client)
    registry.submit(_spec())
    with pytest.raises(JobStateError, match="exists"):
        registry.submit(_spec())
    registry.start_run("shop")
    with pytest.raises(JobStateError, match="running"):
        registry.submit(_spec(priority="high"), replace=True)
    assert registry.spec("shop").priority == "normal"  # nothing of the refused one stored


def test_the_lifecycle_moves_only_where_it_may(redis_client):
    registry = JobRegistry(redis_client)
    registry.submit(_spec())
    with pytest.raises(JobStateError, match="cannot pause a job that is created"):
        registry.pause("shop")
    ref = registry.start_run("shop")
    assert ref == JobRef("shop", 1)
    with pytest.raises(JobStateError, match="the job is running"):
        registry.start_run("shop")
    assert registry.pause("shop") == "paused"
    with pytest.raises(JobStateError):
        registry.finish(ref)  # a paused run never finishes
    assert registry.resume("shop") == "running"
    with pytest.raises(JobStateError):
        registry.finish(JobRef("shop", 2))  # not the current run
    assert registry.finish(ref) == "finished"
    assert registry.start_run("shop") == JobRef("shop", 2)  # a schedule's next run
    assert registry.cancel("shop", "enough") == "cancelled"
    state = registry.state("shop")
    assert (state.state, state.reason) == ("cancelled", "enough")
    with pytest.raises(JobStateError, match="cannot resume"):
        registry.resume("shop")
    with pytest.raises(JobStateError, match="no job named"):
        registry.state("nobody")
    with pytest.raises(JobStateError, match="no such job"):
        registry.pause("nobody")


def test_resume_hands_the_parked_pages_to_the_deferral_and_cancel_counts_them(redis_client):
    registry = JobRegistry(redis_client)
    registry.submit(_spec())
    ref = registry.start_run("shop")
    registry.pause("shop")
    members = [Pending("a.test", "url_queue_ttl", None, b'{"url":"http://a.test/%d"}' % n
                       ).member() for n in range(3)]
    redis_client.zadd(job_parked_key("shop"), {m: 1 for m in members})
    registry.resume("shop")
    assert redis_client.zcard(job_parked_key("shop")) == 0
    assert sorted(redis_client.zrange(deferred_key(), 0, -1)) == sorted(m.encode() for m in members)
    assert int(redis_client.hget(deferred_key("counts"), "a.test")) == 3
    registry.pause("shop")
    redis_client.zadd(job_parked_key("shop"), {members[0]: 1, members[1]: 1})
    registry.cancel("shop")
    assert redis_client.exists(job_parked_key("shop")) == 0
    assert registry.counters(ref)["cancelled"] == 2


def test_a_deleted_jobs_name_goes_on_from_its_last_run(redis_client):
    registry = JobRegistry(redis_client)
    registry.submit(_spec())
    registry.start_run("shop")
    with pytest.raises(JobStateError, match="cancel it first"):
        registry.delete("shop")
    registry.cancel("shop")
    redis_client.hset(job_run_key("shop", 1), "known", 5)
    registry.delete("shop")
    assert not redis_client.exists(job_key("shop"), job_seeds_key("shop"),
                                   job_run_key("shop", 1))
    assert redis_client.hget(JOBS, "shop") is None
    registry.submit(_spec())
    assert registry.start_run("shop") == JobRef("shop", 2)
    assert int(redis_client.get(JOBS_VERSION)) >= 6
