"""A job's pages in the worker (real Redis, the loopback site): read with the job's own rules
and router, recorded with its job and run, counted once in its run's counters."""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.errors import ConfigError
from common.core.urls import domain_of
from common.jobs.registry import JobRef, JobRegistry
from common.jobs.spec import parse_job
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM, crawl_pages_key, job_run_key
from common.work.processor import Processor
from common.work.steps.read import Read
from tests.helpers import drain

pytestmark = pytest.mark.integration

HTML = {"Content-Type": "text/html; charset=utf-8"}
PAGE = b"<html><body><h1>Kettle</h1><p class=price>12.50</p></body></html>"

ROUTER = '''
from scrape_fleet import Router

{name} = Router()

@{name}.default
def page(page):
    yield {{"by": "{name}", "heading": page.css("h1::text").get()}}
'''


def _rules(field: str, css: str) -> list[dict]:
    return [{"name": field, "path": "^/job/page$", "fields": {field: css}}]


def _job(registry: JobRegistry, name: str, seed: str, **fields) -> JobRef:
    registry.submit(parse_job({"name": name, "seeds": {"urls": [seed]}, **fields}))
    return registry.start_run(name)


def _body(url: str, job: JobRef | None) -> bytes:
    return WorkMessage(url=url, extra=job.fields() if job else {}).to_json()


def _stream(client, stream: str) -> list[dict]:
    return [json.loads(fields[b"json"]) for _id, fields in client.xrange(stream)]


def _counters(client, job: JobRef) -> dict[str, int]:
    raw = client.hgetall(job_run_key(job.name, job.run))
    return {k.decode(): int(v) for k, v in raw.items() if k.decode() != "started"}


@pytest.fixture
def processor(settings, redis_client):
    processor = Processor(settings.with_overrides(robots_enabled=False, cache_ttl_s=0),
                          redis_client)
    yield processor
    processor.close()


@pytest.fixture
def routers(tmp_path, monkeypatch) -> str:
    """A fresh module holding two routers, ``first`` and ``second``."""
    name = f"job_routers_{uuid.uuid4().hex}"
    code = "".join(textwrap.dedent(ROUTER.format(name=n)) for n in ("first", "second"))
    (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_two_jobs_with_different_rules_get_different_data_from_the_same_page(
        redis_client, site, processor):
    site.route("/job/page", lambda _r: (200, HTML, PAGE))
    url = site.url("/job/page")
    registry = JobRegistry(redis_client)
    heading = _job(registry, "heading", url, rules=_rules("heading", "h1"))
    price = _job(registry, "price", url, rules=_rules("price", ".price"))
    for job in (heading, price, None):
        outcome = processor.process(_body(url, job), topology.NORMAL_QUEUE)
        assert outcome.kind == "result", outcome.detail
    records = {r.get("job"): r for r in _stream(redis_client, RESULTS_STREAM)}
    assert set(records) == {"heading", "price", None}
    assert records["heading"]["data"] == {"heading": "Kettle"}
    assert records["price"]["data"] == {"price": "12.50"}
    assert records["heading"]["run"] == heading.run and records["price"]["run"] == price.run
    default = records[None]  # the default job's record: no job fields, no job rules
    assert "run" not in default and "data" not in default


def test_a_page_processed_twice_counts_one_result_and_its_bytes_in_its_run(
        redis_client, site, processor):
    site.route("/job/page", lambda _r: (200, HTML, PAGE))
    url = site.url("/job/page")
    job = _job(JobRegistry(redis_client), "twice", url)
    first = processor.process(_body(url, job), topology.NORMAL_QUEUE)
    again = processor.process(_body(url, job), topology.NORMAL_QUEUE)  # a redelivery
    assert (first.kind, again.kind) == ("result", "already_done")
    assert _counters(redis_client, job) == {"results": 1, "bytes": len(PAGE)}
    assert [r["job"] for r in _stream(redis_client, RESULTS_STREAM)] == ["twice"]


def test_a_job_naming_a_router_the_worker_lacks_is_dead_lettered_not_a_crash(
        settings, redis_client, site, routers):
    site.route("/job/page", lambda _r: (200, HTML, PAGE))
    url = site.url("/job/page")
    processor = Processor(settings.with_overrides(
        robots_enabled=False, handlers=f"{routers}:first,{routers}:second",
        handler_isolation="inline"), redis_client)
    try:
        registry = JobRegistry(redis_client)
        second = _job(registry, "second", url, handlers=f"{routers}:second")
        missing = _job(registry, "missing", url, handlers=f"{routers}:third")
        outcomes = {job.name if job else None: processor.process(_body(url, job),
                                                                 topology.NORMAL_QUEUE)
                    for job in (second, missing, None)}
    finally:
        processor.close()
    assert outcomes["second"].kind == "result" and outcomes[None].kind == "result"
    dead = outcomes["missing"]
    assert dead.kind == "dead_letter"
    assert dead.publishes[0].headers["reason"] == "handler_missing"
    assert "third" in dead.publishes[0].headers["last_error"]
    assert dead.record["job"] == "missing" and dead.record["run"] == missing.run
    records = {r.get("job"): r for r in _stream(redis_client, RESULTS_STREAM)}
    assert records["second"]["items"] == [{"by": "second", "heading": "Kettle"}]
    assert records[None]["items"] == [{"by": "first", "heading": "Kettle"}]


def test_a_failure_counts_once_in_its_run_with_its_reason(redis_client, site, processor):
    url = site.url("/job/gone")
    site.route("/job/gone", lambda _r: (404, HTML, b"gone"))
    job = _job(JobRegistry(redis_client), "failing", url)
    outcome = processor.process(_body(url, job), topology.NORMAL_QUEUE)
    assert outcome.kind == "dead_letter"
    for _confirm in range(2):  # the dead letter confirmed twice (a redelivered confirm)
        processor.record_dead_letter(outcome.mark_done, outcome.record)
    failures = _stream(redis_client, FAILURES_STREAM)
    assert len(failures) == 1
    assert failures[0]["job"] == "failing" and failures[0]["run"] == job.run
    reason = failures[0]["reason"]
    assert _counters(redis_client, job) == {"failed": 1, f"failed:{reason}": 1}


LINKS = (b'<html><body><a href="/job/a">a</a><a href="/job/b">b</a><a href="/job/c">c</a>'
         b"</body></html>")


def test_a_jobs_links_follow_its_crawl_settings_and_are_published_in_its_run(
        redis_client, site, processor, amqp_channel):
    site.route("/job/list", lambda _r: (200, HTML, LINKS))
    url = site.url("/job/list")
    job = _job(JobRegistry(redis_client), "crawler", url,
               crawl={"max_depth": 1, "max_pages_per_domain": 2})
    assert processor.process(_body(url, job), topology.NORMAL_QUEUE).kind == "result"
    published = [WorkMessage.from_json(body)
                 for _m, _p, body in drain(amqp_channel, topology.NORMAL_QUEUE)]
    assert len(published) == 2  # the run's budget: 2 pages of the domain, not the fleet's
    assert {(m.extra.get("job"), m.extra.get("run"), m.depth) for m in published} == {
        ("crawler", job.run, 1)}
    domain = domain_of(url)
    assert redis_client.get(crawl_pages_key(f"{job.scope}|{domain}")) == b"2"
    assert redis_client.get(crawl_pages_key(domain)) is None  # the fleet's budget untouched
    record = next(r for r in _stream(redis_client, RESULTS_STREAM) if r["url"] == url)
    assert record["followed"] == 2 and record["job"] == "crawler"

    site.route("/job/other", lambda _r: (200, HTML, LINKS))  # the fleet: no crawl mode
    other = site.url("/job/other")
    assert processor.process(_body(other, None), topology.NORMAL_QUEUE).kind == "result"
    assert drain(amqp_channel, topology.NORMAL_QUEUE) == []


def test_a_jobs_redirect_to_another_host_is_handed_off_in_its_run(
        redis_client, site, processor, amqp_channel):
    target = f"http://localhost:{site.port}/job/moved"
    site.route("/job/old", lambda _r: (301, {"Location": target}, b""))
    url = site.url("/job/old")
    job = _job(JobRegistry(redis_client), "mover", url)
    outcome = processor.process(_body(url, job), topology.NORMAL_QUEUE)
    assert outcome.kind == "result", outcome.detail
    record = _stream(redis_client, RESULTS_STREAM)[0]
    assert record["redirect"] == "queued" and (record["job"], record["run"]) == ("mover",
                                                                               job.run)
    [(_m, _p, body)] = drain(amqp_channel, topology.NORMAL_QUEUE)
    moved = WorkMessage.from_json(body)
    assert moved.url == target and moved.extra["redirected_from"] == url
    assert (moved.extra["job"], moved.extra["run"]) == ("mover", job.run)
    assert _counters(redis_client, job)["results"] == 1


def test_a_replaced_jobs_next_run_is_read_with_its_new_rules(redis_client, site, processor):
    for path in ("/job/page", "/job/page2"):
        site.route(path, lambda _r: (200, HTML, PAGE))
    url, url2 = site.url("/job/page"), site.url("/job/page2")
    registry = JobRegistry(redis_client)
    job = _job(registry, "edited", url, rules=_rules("heading", "h1"))
    assert processor.process(_body(url, job), topology.NORMAL_QUEUE).kind == "result"
    registry.cancel("edited")  # replaced between runs
    registry.submit(parse_job({"name": "edited", "seeds": {"urls": [url]}, "rules": [
        {"name": "price", "path": "^/job/page2?$", "fields": {"price": ".price"}}]}),
        replace=True)
    later = registry.start_run("edited")
    assert later.run == job.run + 1
    assert processor.process(_body(url2, later), topology.NORMAL_QUEUE).kind == "result"
    data = {r["url"]: r["data"] for r in _stream(redis_client, RESULTS_STREAM)}
    assert data == {url: {"heading": "Kettle"}, url2: {"price": "12.50"}}


def test_a_job_message_that_broke_the_worker_still_ends_once_in_its_run(
        redis_client, site, processor):
    url = site.url("/job/page")
    job = _job(JobRegistry(redis_client), "broken", url)
    outcome = processor.worker_error(_body(url, job), RuntimeError("a bug"))
    assert outcome.kind == "dead_letter" and outcome.mark_done is not None
    for _confirm in range(2):
        processor.record_dead_letter(outcome.mark_done, outcome.record)
    [failure] = _stream(redis_client, FAILURES_STREAM)
    assert (failure["url"], failure["job"], failure["reason"]) == (url, "broken",
                                                                   "worker_error")
    assert _counters(redis_client, job) == {"failed": 1, "failed:worker_error": 1}
    plain = processor.worker_error(_body(url, None), RuntimeError("a bug"))
    assert plain.mark_done is None and plain.record["url"] == "<unknown>"  # as ever


def test_a_jobs_redirect_out_of_its_crawl_scope_is_not_handed_off(
        redis_client, site, processor, amqp_channel):
    processor.hand_off.jobs = processor.jobs  # the processor hands HandOff its job book
    target = f"http://localhost:{site.port}/job/moved"
    site.route("/job/old", lambda _r: (301, {"Location": target}, b""))
    url = site.url("/job/old")
    job = _job(JobRegistry(redis_client), "scoped", url, crawl={"max_depth": 2})
    assert processor.process(_body(url, job), topology.NORMAL_QUEUE).kind == "result"
    [record] = _stream(redis_client, RESULTS_STREAM)
    assert record["redirect"] == "out_of_scope" and record["job"] == "scoped"
    assert drain(amqp_channel, topology.NORMAL_QUEUE) == []


def test_every_handlers_router_must_load_when_the_worker_starts(settings, routers):
    refs = f"{routers}:first, no_such_module_for_jobs:router"
    with pytest.raises(ConfigError, match="no_such_module_for_jobs"):
        Read.from_settings(settings.with_overrides(handlers=refs))
    both = f"{routers}:first,{routers}:second"
    step = Read.from_settings(settings.with_overrides(handlers=both))
    try:
        assert step.codes.refs == (f"{routers}:first", f"{routers}:second")
        assert step.pages.custom.value == f"{routers}:first"  # the default job's
    finally:
        step.close()
