"""check_job at submission (real Redis): rules the workers would refuse, a router a live worker
lacks (or, with none alive, one that does not load here), a webhook host outside
JOB_WEBHOOK_HOSTS."""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest

from common.jobs.spec import parse_job
from common.store.keys import worker_key
from common.work.job_check import check_job

SEEDS = {"urls": ["http://shop.test/"]}
RULES = [{"name": "title", "path": "^/$", "fields": {"title": "h1"}}]


@pytest.fixture
def router(tmp_path, monkeypatch) -> str:
    name = f"check_router_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent('''
        from scrape_fleet import Router
        router = Router()
        @router.default
        def page(page):
            yield {}
        not_a_router = 3
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:router"


def _job(**fields):
    return parse_job({"name": "shop", "seeds": SEEDS, **fields})


def _beat(client, worker_id: str, handlers: list[str]) -> None:
    client.set(worker_key(worker_id), json.dumps({"id": worker_id, "handlers": handlers}),
               ex=30)


def test_a_valid_job_has_no_problems(settings, redis_client, router):
    allowed = settings.with_overrides(job_webhook_hosts="hooks.test")
    _beat(redis_client, "w1", [router])
    job = _job(rules=RULES, handlers=router, webhooks=["https://ci.hooks.test/done"])
    assert check_job(job, redis_client, allowed) == []


def test_rules_the_workers_would_refuse_are_a_problem_named_rules(settings, redis_client):
    job = _job(rules=[{"name": "r", "path": "^/$", "fields": {"n": {"css": "p",
                                                                     "type": "money"}}}])
    problems = check_job(job, redis_client, settings)
    assert len(problems) == 1 and problems[0].startswith("rules: ")
    assert "unknown type 'money'" in problems[0]


def test_a_router_a_live_worker_lacks_is_a_problem_naming_the_worker(
        settings, redis_client, router):
    _beat(redis_client, "has-it", [router, "other.mod:router"])
    _beat(redis_client, "lacks-it", ["other.mod:router"])
    problems = check_job(_job(handlers=router), redis_client, settings)
    assert len(problems) == 1 and problems[0].startswith("handlers: ")
    assert "lacks-it" in problems[0] and "has-it" not in problems[0]


def test_with_no_live_worker_the_router_must_load_here(settings, redis_client, router):
    assert check_job(_job(handlers=router), redis_client, settings) == []
    module = router.partition(":")[0]
    for ref, said in ((f"{module}:not_a_router", "not a scrape_fleet.Router"),
                      ("no_such_module_anywhere:router", "cannot import")):
        problems = check_job(_job(handlers=ref), redis_client, settings)
        assert len(problems) == 1 and said in problems[0], problems


def test_a_webhook_outside_the_allowed_hosts_is_a_problem(settings, redis_client):
    allowed = settings.with_overrides(job_webhook_hosts="hooks.test, example.org")
    job = _job(webhooks=["https://hooks.test/a", "https://evil-hooks.test/b",
                         "http://api.example.org/c", "http://example.com/d"])
    assert check_job(job, redis_client, allowed) == [
        "webhooks[1]: host 'evil-hooks.test' not in JOB_WEBHOOK_HOSTS",
        "webhooks[3]: host 'example.com' not in JOB_WEBHOOK_HOSTS"]
    assert check_job(job, redis_client, settings) == [  # empty: no webhooks at all
        f"webhooks[{i}]: host {h!r} not in JOB_WEBHOOK_HOSTS" for i, h in enumerate(
            ("hooks.test", "evil-hooks.test", "api.example.org", "example.com"))]
