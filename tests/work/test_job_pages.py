"""A job's pages in the worker (real Redis, the loopback site): read with the job's own rules
and router, recorded with its job and run, counted once in its run's counters."""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.jobs.registry import JobRef, JobRegistry
from common.jobs.spec import parse_job
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM, job_run_key
from common.work.processor import Processor

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
