"""Job admission in the worker: a job's message is fetched while its run runs, parked in Redis
and acked while it is paused (resumed into ``deferred``), dropped as cancelled once its run
is over (counted once), and dead-lettered when its job fields are malformed; robots.txt off
for a job that turns it off; the heartbeat's pages in flight per run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from common.broker.messages import WorkMessage
from common.core.urls import canonicalize
from common.intake.defer import Pending
from common.jobs.registry import JobRef, JobRegistry
from common.jobs.spec import parse_job
from common.store.dedupe import DoneSet
from common.store.keys import deferred_key, job_parked_key, job_run_key
from common.store.results import ResultStore
from common.web.ratelimit import RateLimiter
from common.web.robots import robots_fetcher
from common.work.heartbeat import jobs_in_flight
from common.work.job_book import JobBook
from common.work.outcome import DeadLetter, Park
from common.work.processor import Processor
from common.work.robots_gate import RobotsGate
from common.work.steps.admit import Admit
from common.work.steps.decode import Decode
from common.work.steps.robots import Robots
from common.work.steps.trip import Trip
from devtools.testsite import TestSite
from tests.work.steps.conftest import QUEUE, failure_of, reason, trip_for

HTML = {"Content-Type": "text/html; charset=utf-8"}


@pytest.fixture
def processor(settings, redis_client) -> Iterator[Processor]:
    processor = Processor(settings.with_overrides(robots_enabled=False, cache_ttl_s=0),
                          redis_client)
    yield processor
    processor.close()


@pytest.fixture
def registry(redis_client) -> JobRegistry:
    return JobRegistry(redis_client)


def _job(registry: JobRegistry, name: str, **fields) -> JobRef:
    registry.submit(parse_job({"name": name, "seeds": {"urls": ["http://127.0.0.1:9/"]},
                               **fields}))
    return registry.start_run(name)


def _body(url: str, ref: JobRef | None, **extra) -> bytes:
    return WorkMessage(url=url, extra={**(ref.fields() if ref else {}), **extra}).to_json()


def _counters(client, ref: JobRef) -> dict[str, int]:
    raw = client.hgetall(job_run_key(ref.name, ref.run))
    return {k.decode(): int(v) for k, v in raw.items()
            if k.decode() not in ("started", "ended")}


def _done(settings, redis_client, url: str, ref: JobRef) -> bool:
    mark = DoneSet(redis_client, settings.seen_buckets).mark_for(canonicalize(url),
                                                                 scope=ref.scope)
    return bool(redis_client.sismember(mark.key, mark.member))


def test_a_paused_jobs_message_is_parked_once_acked_and_resumed_into_deferred(
        processor, registry, redis_client):
    ref = _job(registry, "pausing")
    registry.pause("pausing")
    body = _body("http://127.0.0.1:9/paused", ref)
    outcome = processor.process(body, QUEUE)
    assert outcome.kind == "paused" and outcome.publishes == ()  # acked, nothing published
    member = Pending("127.0.0.1", QUEUE, None, body).member()  # the body as delivered
    assert redis_client.zrange(job_parked_key("pausing"), 0, -1) == [member.encode()]
    # A redelivery (a worker killed between parking and acking) parks the same member again.
    assert processor.process(body, QUEUE, redelivered=True).kind == "paused"
    assert redis_client.zcard(job_parked_key("pausing")) == 1
    assert _counters(redis_client, ref) == {"paused": 1}

    assert registry.resume("pausing") == "running"
    assert redis_client.zcard(job_parked_key("pausing")) == 0
    assert redis_client.zscore(deferred_key(), member) is not None  # due now, for a releaser
    assert redis_client.hget(deferred_key("counts"), "127.0.0.1") == b"1"
    released = Pending.from_member(member)  # what a releaser publishes, and where
    assert released.body == body and released.queue == QUEUE


def test_a_paused_page_that_was_waiting_for_its_turn_is_parked_without_that_wait(
        processor, registry, redis_client):
    ref = _job(registry, "waiting")
    registry.pause("waiting")
    body = _body("http://127.0.0.1:9/waited", ref, slot=5, parked_at=1.0, keep="me")
    assert processor.process(body, QUEUE).kind == "paused"
    assert processor.process(body, QUEUE, redelivered=True).kind == "paused"
    [member] = redis_client.zrange(job_parked_key("waiting"), 0, -1)
    parked = WorkMessage.from_json(Pending.from_member(member).body)
    assert parked.extra == {**ref.fields(), "keep": "me"}  # its MAX_WAIT_S starts afresh


def test_a_jobs_own_max_wait_bounds_its_pages_wait_for_a_turn(settings, redis_client, registry,
                                                              give_up):
    ref = _job(registry, "hasty", settings={"MAX_WAIT_S": "10"})
    slow = settings.with_overrides(rate_limit=(1, 60_000))
    step = Admit.from_settings(slow, RateLimiter(redis_client, slow),
                               ResultStore(redis_client, slow.results_maxlen), give_up,
                               redis_client, JobBook(slow, redis_client))
    assert step.take_turn(trip_for("http://127.0.0.1:9/first")) is None  # the window fills
    waited = round(time.time() - 100, 3)
    job_trip = trip_for("http://127.0.0.1:9/hasty", parked_at=waited, **ref.fields())
    job_trip.job = ref
    assert failure_of(step.take_turn(job_trip)) == "waited_too_long"
    assert slow.max_wait_s > 200  # the fleet's own: the default job's page waits its turn
    end = step.take_turn(trip_for("http://127.0.0.1:9/calm", parked_at=waited))
    assert isinstance(end, Park) and end.why == "rate limit"


def test_a_cancelled_jobs_message_is_counted_cancelled_once_when_delivered_twice(
        processor, registry, redis_client, settings, site):
    ref = _job(registry, "stopping")
    registry.cancel("stopping")
    body = _body(site.url("/cancelled"), ref)
    first = processor.process(body, QUEUE)
    second = processor.process(body, QUEUE, redelivered=True)
    assert first.kind == "cancelled" and first.publishes == ()
    assert second.kind in ("cancelled", "already_done") and second.publishes == ()
    assert _counters(redis_client, ref) == {"cancelled": 1}
    assert _done(settings, redis_client, site.url("/cancelled"), ref)
    assert site.count("/cancelled") == 0


def test_an_older_runs_message_is_dropped_as_cancelled_in_that_run(
        processor, registry, redis_client, site):
    first = _job(registry, "rerun")
    registry.finish(first)
    second = registry.start_run("rerun")
    assert second.run == first.run + 1
    outcome = processor.process(_body(site.url("/old-run"), first), QUEUE)
    assert outcome.kind == "cancelled"
    assert _counters(redis_client, first) == {"cancelled": 1}
    assert "cancelled" not in _counters(redis_client, second)
    assert site.count("/old-run") == 0


def test_a_deleted_jobs_message_is_dropped_marking_and_counting_nothing(
        processor, registry, redis_client, settings):
    ref = _job(registry, "gone")
    registry.cancel("gone")
    registry.delete("gone")
    outcome = processor.process(_body("http://127.0.0.1:9/gone", ref), QUEUE)
    assert outcome.kind == "cancelled" and "deleted" in outcome.detail
    assert not redis_client.exists(job_run_key("gone", ref.run))
    assert not _done(settings, redis_client, "http://127.0.0.1:9/gone", ref)


def test_a_running_jobs_message_is_fetched_and_recorded(processor, registry, redis_client,
                                                        site):
    site.route("/running", lambda _r: (200, HTML, b"<html><title>run</title></html>"))
    ref = _job(registry, "going")
    outcome = processor.process(_body(site.url("/running"), ref), QUEUE)
    assert outcome.kind == "result"
    assert site.count("/running") == 1
    assert _counters(redis_client, ref).get("results") == 1


def test_the_admission_brings_back_the_jobs_version_and_the_book_reloads_when_it_moved(
        processor, registry, redis_client):
    ref = _job(registry, "watched")
    registry.pause("watched")
    processor.jobs.reload()
    before = processor.jobs.version
    registry.submit(parse_job({"name": "newcomer", "seeds": {"urls": ["http://127.0.0.1:9/"]}}))
    assert registry.version() > before and processor.jobs.version == before
    assert processor.process(_body("http://127.0.0.1:9/v", ref), QUEUE).kind == "paused"
    assert processor.jobs.version == registry.version()
    assert "newcomer" in processor.jobs._specs  # loaded by the reload, not asked for


def test_a_run_no_longer_paused_when_its_page_would_be_parked_is_not_parked(
        processor, registry, redis_client):
    ref = _job(registry, "flipping")
    trip = trip_for("http://127.0.0.1:9/flip", **ref.fields())
    trip.job, trip.domain = ref, "127.0.0.1"
    assert processor.admit._parked(trip) is False  # running: admission is asked again
    registry.pause("flipping")
    assert processor.admit._parked(trip) is True
    assert redis_client.zcard(job_parked_key("flipping")) == 1


@pytest.mark.parametrize("fields, error", [
    ({"job": "shop"}, "'run' of job 'shop' must be an integer of 1 or more, not None"),
    ({"run": 2}, "'job' must be a job name"),
    ({"job": "shop", "run": 0}, "not 0"),
    ({"job": "shop", "run": "1"}, "not '1'"),
    ({"job": "shop", "run": True}, "not True"),
    ({"job": "Shop!", "run": 1}, "not 'Shop!'"),
    ({"job": 7, "run": 1}, "not 7"),
    ({"job": "default", "run": 1}, "given to the default job"),
])
def test_a_message_with_malformed_job_fields_is_dead_lettered_as_bad_message(
        settings, give_up, fields, error):
    trip = Trip.begin(json.dumps({"url": "http://127.0.0.1:9/j", **fields}).encode(), QUEUE,
                      False)
    end = Decode.from_settings(settings).decode_message(trip)
    assert isinstance(end, DeadLetter) and failure_of(end) == "bad_message"
    outcome = give_up.settle(trip, end)
    assert reason(outcome) == "bad_message"
    assert error in outcome.publishes[0].headers["last_error"]


@pytest.mark.parametrize("fields, job", [
    ({}, None),
    ({"job": "default"}, None),
    ({"job": "shop", "run": 3}, JobRef("shop", 3)),
])
def test_a_message_names_its_job_run_or_the_default_job(settings, fields, job):
    trip = Trip.begin(json.dumps({"url": "http://127.0.0.1:9/j", **fields}).encode(), QUEUE,
                      False)
    assert Decode.from_settings(settings).decode_message(trip) is None
    assert trip.job == job


def test_a_job_that_turns_robots_off_skips_robots_txt_while_the_default_job_obeys_it(
        settings, redis_client, registry):
    ref = _job(registry, "impolite", politeness={"robots": False})
    with TestSite(pages=2, robots_txt="User-agent: *\nDisallow: /\n") as site:
        gate = RobotsGate(settings, redis_client, RateLimiter(redis_client, settings),
                          robots_fetcher(settings))
        step = Robots(gate, JobBook(settings, redis_client))
        try:
            job_trip = trip_for(site.page_url(1), **ref.fields())
            job_trip.job = ref
            assert step.ask_robots(job_trip) is None and job_trip.rules is None
            assert site.count("/robots.txt") == 0
            default_trip = trip_for(site.page_url(1))
            assert failure_of(step.ask_robots(default_trip)) == "robots_disallowed"
            assert site.count("/robots.txt") == 1
        finally:
            gate.fetcher.close()


def test_a_job_cannot_turn_robots_on_where_the_fleet_has_it_off(settings, redis_client,
                                                              registry):
    ref = _job(registry, "polite", politeness={"robots": True})
    trip = trip_for("http://127.0.0.1:9/p", **ref.fields())
    trip.job = ref
    assert Robots(None, JobBook(settings, redis_client)).ask_robots(trip) is None
    assert trip.rules is None


def test_the_heartbeat_counts_a_workers_pages_in_flight_per_job_run():
    shop = JobRef("shop", 2)
    bodies = [_body("http://a/1", shop), _body("http://a/2", shop),
              _body("http://a/3", JobRef("news", 1)), _body("http://a/4", None),
              b"{not json", b"[1]"]
    assert jobs_in_flight(bodies) == {"shop/2": 2, "news/1": 1}


def test_the_book_asks_only_for_the_version_about_a_job_it_does_not_have(
        settings, redis_client, registry):
    book = JobBook(settings, redis_client)
    book.reload()
    redis_client.config_resetstat()
    ghost = JobRef("ghost", 1)
    assert book.spec(ghost) is None and book.spec(ghost) is None
    stats = redis_client.info("commandstats")
    assert "cmdstat_hgetall" not in stats and stats["cmdstat_get"]["calls"] == 2
    _job(registry, "ghost")
    assert book.spec(ghost) is not None and book.version == registry.version()
