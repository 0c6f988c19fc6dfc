"""A job's URLs through the one producer path (common/intake/producer.py with ``job=``): deduped
per run, counted ``known``, held to ``limits.pages``, routed and paced per job; the default
job exactly as before. Real Redis and RabbitMQ."""

from __future__ import annotations

import json
import threading

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.urls import fingerprint, job_fingerprint
from common.intake.defer import Pending, Releaser
from common.intake.job_intake import StoredTerms
from common.intake.producer import Producer
from common.intake.sitemaps import SitemapReader, produce_site
from common.jobs.registry import JobRef, JobRegistry
from common.jobs.spec import JobSpec
from common.jobs.spec_fields import Limits
from common.ops.cli_seed import seed_main
from common.store.dedupe import SeenSet
from common.store.keys import deferred_key, deferred_next_key, job_run_key
from devtools.testsite import TestSite
from tests.helpers import drain, queue_depth
from tests.intake.sitemap_bodies import urlset

SHOP = JobRef("shop", 1)
NEWS = JobRef("news", 1)
PACED_HOST = "127.0.0.9"


def _spec(name: str, **fields) -> JobSpec:
    return JobSpec(name=name, seed_urls=("http://127.0.0.1:9/",), **fields)


def _known(redis_client, ref: JobRef) -> int:
    return int(redis_client.hget(job_run_key(ref.name, ref.run), "known") or 0)


def _messages(channel, queue: str = topology.NORMAL_QUEUE) -> list[WorkMessage]:
    return [WorkMessage.from_json(body) for _m, _p, body in drain(channel, queue)]


def test_the_same_url_in_two_jobs_is_published_once_for_each(settings, redis_client,
                                                               amqp_channel):
    urls = [f"http://127.0.0.1:9/p/{i}" for i in range(5)]
    with Producer(settings, redis_client) as producer:
        shop = producer.submit(urls + urls, job=SHOP, job_spec=_spec("shop"))
        news = producer.submit(urls, job=NEWS, job_spec=_spec("news"))
        default = producer.submit(urls)
    assert (shop.new, shop.duplicate, news.new, news.duplicate) == (5, 5, 5, 0)
    assert default.new == 5, "the default job dedupes apart from every job"
    messages = _messages(amqp_channel)
    assert len(messages) == 15
    by_job = {(m.extra.get("job"), m.extra.get("run"), m.url) for m in messages}
    assert len(by_job) == 15
    assert {(job, run) for job, run, _url in by_job} == {("shop", 1), ("news", 1), (None, None)}
    for message in messages:
        scope = f"{message.extra['job']}/1" if "job" in message.extra else None
        assert message.fp == job_fingerprint(message.url, scope).hex
    assert (_known(redis_client, SHOP), _known(redis_client, NEWS)) == (5, 5)


def test_a_rerun_of_a_jobs_urls_publishes_nothing_new_and_counts_nothing(settings, redis_client,
                                                                        amqp_channel):
    urls = [f"http://127.0.0.1:9/again/{i}" for i in range(20)]
    with Producer(settings, redis_client) as producer:
        first = producer.submit(urls, job=SHOP, job_spec=_spec("shop"))
    with Producer(settings, redis_client) as producer:
        second = producer.submit(urls, job=SHOP, job_spec=_spec("shop"))
        next_run = producer.submit(urls, job=JobRef("shop", 2), job_spec=_spec("shop"))
    assert (first.new, second.new, second.duplicate) == (20, 0, 20)
    assert next_run.new == 20, "a new run of the job knows none of the last run's URLs"
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 40
    assert _known(redis_client, SHOP) == 20
    assert _known(redis_client, JobRef("shop", 2)) == 20


def test_known_counts_exactly_the_new_urls_deferred_ones_included(settings, redis_client,
                                                                  amqp_channel):
    paced = settings.with_overrides(rate_limit=(2, 1000), rate_limit_guard=0.02,
                                    defer_lead_s=2.0)
    urls = [f"http://{PACED_HOST}:9/k/{i}" for i in range(12)]
    with Producer(paced, redis_client) as producer:
        first = producer.submit(urls[:8] + urls[:3], job=SHOP, job_spec=_spec("shop"))
        second = producer.submit(urls, job=SHOP, job_spec=_spec("shop"))
    assert (first.new, first.duplicate, second.new, second.duplicate) == (8, 3, 4, 8)
    assert first.deferred > 0 and second.deferred == 4
    assert _known(redis_client, SHOP) == 12
    assert redis_client.zcard(deferred_key()) == first.deferred + second.deferred
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == \
        12 - redis_client.zcard(deferred_key())


def test_the_page_limit_holds_across_two_producers_at_once(settings, redis_client, amqp_channel):
    small_batches = settings.with_overrides(producer_batch=7)
    spec = _spec("shop", limits=Limits(pages=30))
    summaries = []
    lock = threading.Lock()

    def produce(prefix: str) -> None:
        urls = [f"http://127.0.0.1:9/{prefix}/{i}" for i in range(40)]
        with Producer(small_batches, redis_client) as producer:
            summary = producer.submit(urls, job=SHOP, job_spec=spec)
        with lock:
            summaries.append(summary)

    threads = [threading.Thread(target=produce, args=(prefix,)) for prefix in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(summaries) == 2
    assert sum(s.new for s in summaries) == 30
    assert sum(s.over_budget for s in summaries) == 50
    assert sum(s.duplicate for s in summaries) == 0
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 30
    assert _known(redis_client, SHOP) == 30
    assert SeenSet(redis_client, settings.seen_buckets).count() == 30, (
        "a URL over the limit was marked seen")
    with Producer(settings, redis_client) as producer:
        later = producer.submit(["http://127.0.0.1:9/late"], job=SHOP, job_spec=spec)
    assert (later.new, later.over_budget) == (0, 1)


def test_a_high_priority_jobs_urls_land_in_the_priority_queue(settings, redis_client,
                                                              amqp_channel):
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(["http://127.0.0.1:9/urgent/1", "http://127.0.0.1:9/urgent/2"],
                                  job=SHOP, job_spec=_spec("shop", priority="high"))
    assert summary.per_queue[topology.PRIORITY_QUEUE] == 2
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 0
    assert {m.extra["job"] for m in _messages(amqp_channel, topology.PRIORITY_QUEUE)} == {"shop"}


def test_a_jobs_pace_defers_its_urls_beyond_its_rate_while_the_domains_rate_lets_others_by(
        settings, redis_client, amqp_channel):
    # The domain allows 1000/s (TEST_ENV); the job 2/s: a slot every 510 ms, 1 s of lead.
    paced = settings.with_overrides(rate_limit_guard=0.02, defer_lead_s=1.0)
    urls = [f"http://{PACED_HOST}:9/slow/{i}" for i in range(10)]
    with Producer(paced, redis_client) as producer:
        job = producer.submit(urls, job=SHOP, job_spec=_spec("shop", rate_limit=(2, 1000)))
        default = producer.submit(urls)
    assert (job.new, job.deferred) == (10, 8)
    assert (default.new, default.deferred) == (10, 0)
    assert redis_client.exists(deferred_next_key(f"shop/1:{PACED_HOST}"))
    waiting = redis_client.zrange(deferred_key(), 0, -1, withscores=True)
    gaps = {round(b - a) for (_m, a), (_n, b) in zip(waiting, waiting[1:], strict=False)}
    assert gaps == {510}
    assert _known(redis_client, SHOP) == 10
    # The releaser publishes a deferred job message as it was: its job and run with it.
    bodies = {Pending.from_member(m).body for m, _s in waiting}
    releaser = Releaser(paced, threading.Event(), redis_client)
    try:
        redis_client.zadd(deferred_key(), {m: 0 for m, _s in waiting})  # due now
        while redis_client.zcard(deferred_key()) + redis_client.zcard(deferred_key("inflight")):
            releaser.release_once()
    finally:
        releaser._close_amqp()
    released = [body for _m, _p, body in drain(amqp_channel, topology.NORMAL_QUEUE)]
    assert bodies <= set(released)
    assert {json.loads(b)["job"] for b in bodies} == {"shop"}


def test_the_default_jobs_fingerprints_and_messages_are_as_before(settings, redis_client,
                                                                   amqp_channel):
    url = "http://127.0.0.1:9/plain"
    with Producer(settings, redis_client) as producer:
        producer.submit([url])
    [(_method, _props, body)] = drain(amqp_channel, topology.NORMAL_QUEUE)
    enqueued_at = json.loads(body)["enqueued_at"]
    expected = json.dumps({"url": url, "enqueued_at": enqueued_at, "depth": 0, "attempts": 0,
                           "fp": fingerprint(url).hex}, separators=(",", ":")).encode()
    assert body == expected
    assert SeenSet(redis_client, settings.seen_buckets).contains_many([fingerprint(url)]) == [True]
    assert not list(redis_client.scan_iter(match="job:*"))


def test_a_job_given_without_its_spec_takes_its_stored_terms(settings, redis_client,
                                                             amqp_channel):
    registry = JobRegistry(redis_client)
    registry.submit(_spec("shop", priority="high", limits=Limits(pages=2)))
    ref = registry.start_run("shop")
    with Producer(settings, redis_client) as producer:
        summary = producer.submit([f"http://127.0.0.1:9/s/{i}" for i in range(3)], job=ref)
        with pytest.raises(ValueError, match="no job named 'gone'"):
            producer.submit(["http://127.0.0.1:9/"], job=JobRef("gone", 1))
    assert (summary.new, summary.over_budget) == (2, 1)
    assert summary.per_queue[topology.PRIORITY_QUEUE] == 2
    assert registry.counters(ref)["known"] == 2


def test_a_sitemap_seeds_into_a_job_and_counts_in_its_run(settings, redis_client, amqp_channel):
    with TestSite(pages=3) as site:
        urls = [site.url(f"/m/{i}") for i in range(3)]
        site.route("/map.xml", lambda _r: (200, {"Content-Type": "application/xml"},
                                           urlset(*urls)))
        reader = SitemapReader(settings, redis_client)
        with Producer(settings, redis_client) as producer:
            report = produce_site(site.url("/map.xml"), reader, producer, job=SHOP,
                                  job_spec=_spec("shop", limits=Limits(pages=2)))
    assert (report.errors, report.summary.new, report.summary.over_budget) == ([], 2, 1)
    assert {(m.extra["job"], m.extra["run"]) for m in _messages(amqp_channel)} == {("shop", 1)}
    assert _known(redis_client, SHOP) == 2


def test_seed_adds_urls_to_a_running_job_and_refuses_a_job_not_running(
        settings, redis_client, amqp_channel, capsys):
    registry = JobRegistry(redis_client)
    registry.submit(_spec("shop"))
    urls = ["http://127.0.0.1:9/more/1", "http://127.0.0.1:9/more/2"]
    assert seed_main(settings, ["--job", "shop", *urls]) != 0, "a created job took URLs"
    assert "is created, not running" in capsys.readouterr().err
    assert seed_main(settings, ["--job", "nosuch", *urls]) != 0
    assert "no job named 'nosuch'" in capsys.readouterr().err
    assert queue_depth(amqp_channel, topology.NORMAL_QUEUE) == 0
    ref = registry.start_run("shop")
    assert seed_main(settings, ["--job", "shop", "--json", *urls, urls[0]]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["job"], summary["run"], summary["new"], summary["duplicate"]) == (
        "shop", 1, 2, 1)
    assert registry.counters(ref)["known"] == 2
    registry.pause("shop")
    assert seed_main(settings, ["--job", "shop", "http://127.0.0.1:9/more/3"]) != 0
    assert "is paused, not running" in capsys.readouterr().err
    assert {m.extra["job"] for m in _messages(amqp_channel)} == {"shop"}


def test_a_jobs_invalid_url_is_dead_lettered_with_its_job_and_not_known(settings, redis_client,
                                                                         amqp_channel):
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(["no scheme here", "http://127.0.0.1:9/ok"], job=SHOP,
                                  job_spec=_spec("shop"))
        producer.submit(["ftp://example.com/f"])
    assert (summary.invalid, summary.new) == (1, 1)
    letters = {json.loads(body)["url"]: json.loads(body)
               for _m, _p, body in drain(amqp_channel, topology.FAILED_QUEUE)}
    assert (letters["no scheme here"]["job"], letters["no scheme here"]["run"]) == ("shop", 1)
    assert "job" not in letters["ftp://example.com/f"]
    assert _known(redis_client, SHOP) == 1


def test_stored_terms_read_what_a_job_spec_stores():
    spec = _spec("paced", rate_limit=(3, 2000), priority="high", limits=Limits(pages=7))
    stored = StoredTerms.from_json(spec.to_json())
    assert (stored.priority, stored.rate_limit, stored.limits.pages) == ("high", (3, 2000), 7)
    plain = StoredTerms.from_json(_spec("plain").to_json())
    assert (plain.priority, plain.rate_limit, plain.limits.pages) == ("normal", None, None)
