"""Job webhooks against real Redis and a loopback receiver (the test site): one POST per
ended run with its summary, refusals before any connection, retries then a drop, and no
credential in a log line."""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis

from common.core.config import Settings
from common.jobs.registry import JobRef, JobRegistry
from common.jobs.spec import parse_job
from common.jobs.webhooks import Webhooks, host_allowed
from common.store.keys import JOBS_WEBHOOKS, job_run_key


def hooks_for(settings: Settings, **overrides: object) -> Webhooks:
    """Webhooks to 127.0.0.1 (the test site), 3 attempts, backoff 0.1, 0.2 … s."""
    options = {"job_webhook_hosts": "127.0.0.1", "job_webhook_attempts": 3,
               "job_webhook_timeout_s": 5.0, **overrides}
    return Webhooks(redis.Redis.from_url(settings.redis_url),
                    settings.with_overrides(**options), backoff_base_s=0.1)


def ended_run(registry: JobRegistry, redis_client, name: str, hooks: list[str],
              *, finish: bool = True) -> JobRef:
    """A job whose run 1 knew 3 URLs: 2 results, 1 failed (404); finished when ``finish``."""
    registry.submit(parse_job({"name": name, "seeds": {"urls": ["http://127.0.0.1:9/"]},
                               "webhooks": hooks}))
    ref = registry.start_run(name)
    redis_client.hset(job_run_key(name, ref.run), mapping={
        "known": 3, "results": 2, "failed": 1, "failed:http_404": 1, "bytes": 1234})
    if finish:
        registry.finish(ref)
    return ref


def posts(site, path: str) -> list[dict]:
    return [json.loads(r.body) for r in site.requests_for(path) if r.method == "POST"]


def send_until(hooks: Webhooks, predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        hooks.send_due()
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_an_ended_run_gets_one_post_per_webhook_url_with_its_summary(settings, redis_client,
                                                                      site):
    registry, hooks = JobRegistry(redis_client), hooks_for(settings)
    urls = [site.url("/status/200?a"), site.url("/status/201?b")]
    ref = ended_run(registry, redis_client, "shop", urls, finish=False)
    assert hooks.queue(ref, tuple(urls), "finished", "nothing left") == 2
    registry.finish(ref)
    assert send_until(hooks, lambda: not redis_client.zcard(JOBS_WEBHOOKS))
    hooks.send_due()
    for path in ("/status/200", "/status/201"):
        [body] = posts(site, path)
        assert body["job"] == "shop" and body["run"] == 1
        assert body["state"] == "finished" and body["reason"] == "nothing left"
        assert body["counters"] == {"known": 3, "results": 2, "failed": 1,
                                    "failed:http_404": 1, "bytes": 1234}
        assert 0 < body["started"] <= body["ended"]


def test_queueing_a_run_again_adds_no_second_delivery(settings, redis_client, site):
    registry, hooks = JobRegistry(redis_client), hooks_for(settings)
    url = site.url("/status/200")
    ref = ended_run(registry, redis_client, "again", [url])
    assert hooks.queue(ref, (url,), "finished", "nothing left") == 1
    assert hooks.queue(ref, (url,), "finished", "nothing left") == 0
    assert redis_client.zcard(JOBS_WEBHOOKS) == 1


def test_a_delivery_waits_while_its_run_has_not_ended(settings, redis_client, site):
    registry, hooks = JobRegistry(redis_client), hooks_for(settings)
    url = site.url("/status/200")
    ref = ended_run(registry, redis_client, "waits", [url], finish=False)
    hooks.queue(ref, (url,), "finished", "nothing left")
    hooks.send_due()
    assert posts(site, "/status/200") == [] and redis_client.zcard(JOBS_WEBHOOKS) == 1
    registry.finish(ref)
    assert send_until(hooks, lambda: len(posts(site, "/status/200")) == 1, 5)


def test_a_host_outside_the_allow_list_is_refused_before_connecting(settings, redis_client,
                                                                    site, caplog):
    registry, hooks = JobRegistry(redis_client), hooks_for(
        settings, job_webhook_hosts="hooks.example")
    url = site.url("/status/200")
    ref = ended_run(registry, redis_client, "outside", [url])
    hooks.queue(ref, (url,), "finished", "nothing left")
    with caplog.at_level(logging.ERROR, logger="common.jobs.webhooks"):
        hooks.send_due()
    assert site.requests_for("/status/200") == []
    assert redis_client.zcard(JOBS_WEBHOOKS) == 0
    assert "not in JOB_WEBHOOK_HOSTS" in caplog.text


def test_an_address_the_guard_blocks_is_refused_though_its_host_is_allowed(
        settings, redis_client, site, caplog):
    registry = JobRegistry(redis_client)
    hooks = hooks_for(settings, fetch_allow_networks=())
    url = site.url("/status/200")
    ref = ended_run(registry, redis_client, "guarded", [url])
    hooks.queue(ref, (url,), "finished", "nothing left")
    with caplog.at_level(logging.ERROR, logger="common.jobs.webhooks"):
        hooks.send_due()
    assert site.requests_for("/status/200") == []
    assert "refused by the address guard" in caplog.text


def test_a_failing_receiver_is_retried_with_backoff_then_dropped(settings, redis_client, site,
                                                                 caplog):
    registry, hooks = JobRegistry(redis_client), hooks_for(settings)
    url = site.url("/status/500")
    ref = ended_run(registry, redis_client, "failing", [url])
    hooks.queue(ref, (url,), "finished", "nothing left")
    with caplog.at_level(logging.WARNING, logger="common.jobs.webhooks"):
        assert send_until(hooks, lambda: not redis_client.zcard(JOBS_WEBHOOKS))
    tries = [r.monotonic_s for r in site.requests_for("/status/500")]
    assert len(tries) == 3
    assert tries[1] - tries[0] >= 0.1 and tries[2] - tries[1] >= 0.2  # 0.1 s, then 0.2 s
    assert "dropped after 3 attempts (last: HTTP 500)" in caplog.text


def test_a_redirect_is_not_followed(settings, redis_client, site):
    registry, hooks = JobRegistry(redis_client), hooks_for(settings, job_webhook_attempts=1)
    url = site.url("/redirect/1")
    ref = ended_run(registry, redis_client, "moved", [url])
    hooks.queue(ref, (url,), "finished", "nothing left")
    assert send_until(hooks, lambda: not redis_client.zcard(JOBS_WEBHOOKS))
    assert len(site.requests_for("/redirect/1")) == 1
    assert site.requests_for("/page/1") == []


def test_credentials_of_a_webhook_url_never_reach_the_log(settings, redis_client, site,
                                                          caplog):
    registry, hooks = JobRegistry(redis_client), hooks_for(settings, job_webhook_attempts=2)
    url = site.url("/status/500?token=tok3n-value")  # user:password@ is refused at submission
    ref = ended_run(registry, redis_client, "secret", [url])
    hooks.queue(ref, (url,), "finished", "nothing left")
    with caplog.at_level(logging.INFO, logger="common.jobs.webhooks"):
        assert send_until(hooks, lambda: not redis_client.zcard(JOBS_WEBHOOKS))
    assert len(site.requests_for("/status/500")) == 2
    assert "dropped after 2 attempts" in caplog.text
    assert "token=***" in caplog.text and "tok3n-value" not in caplog.text


@pytest.mark.parametrize(("host", "allowed"), [
    ("hooks.example", True), ("a.hooks.example", True), ("HOOKS.example.", True),
    ("evilhooks.example", False), ("hooks.example.evil", False), ("other", False)])
def test_the_allow_list_takes_a_host_and_its_subdomains(host, allowed):
    assert host_allowed(host, "other.test, hooks.example") is allowed
