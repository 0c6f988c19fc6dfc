"""Integration tests: every failure class ends where it should, with its dead-letter headers.

Real RabbitMQ and Redis (fixtures in conftest.py), the loopback test site, a Worker in a thread.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.urls import canonicalize
from common.intake.producer import Producer
from common.intake.routing import Router
from common.store.keys import COUNTERS, FAILURES_STREAM, failures_key
from devtools.testsite import RequestRecord
from tests.helpers import WorkerThread, drain, publish_raw, queue_depth, results, wait_for

FAILED = topology.FAILED_QUEUE


def _seed(settings: Settings, redis_client: Any, urls: list[str]) -> None:
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(urls)
    assert summary.new == len(urls), summary.line()


def _run_worker_until(settings: Settings, done: Callable[[], bool], timeout_s: float = 20.0,
                      **overrides: Any) -> None:
    """Run a worker until ``done()`` holds, then stop it gracefully (no idle wait)."""
    with WorkerThread(settings.with_overrides(**overrides)) as worker:
        reached = wait_for(done, timeout_s)
    assert worker.exit_code == 0
    assert reached, "the worker did not reach the expected state in time"


def _dead_letters(channel: Any) -> dict[str, dict[str, Any]]:
    """Drain failed_urls: {url in the body: headers}."""
    out = {}
    for _method, props, body in drain(channel, FAILED):
        url = json.loads(body)["url"]
        assert url not in out, f"{url} dead-lettered twice"
        out[url] = props.headers
    return out


def _is_iso_time(value: Any) -> bool:
    return isinstance(value, str) and datetime.fromisoformat(value).tzinfo is not None


@contextmanager
def _refusing_port() -> Iterator[int]:
    """A loopback port that is bound but not listening: connecting to it is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_404_and_410_are_dead_lettered_at_once_without_retry(settings, redis_client,
                                                             amqp_channel, site):
    urls = {404: site.url("/status/404"), 410: site.url("/status/410")}
    _seed(settings, redis_client, list(urls.values()))
    _run_worker_until(settings, lambda: queue_depth(amqp_channel, FAILED) == 2)

    dead = _dead_letters(amqp_channel)
    assert set(dead) == set(urls.values())
    for status, url in urls.items():
        headers = dead[url]
        assert headers["reason"] == f"http_{status}"
        assert headers["failure"] == f"http_{status}"
        assert headers["attempts"] == 1
        assert headers["last_status"] == status
        assert _is_iso_time(headers["first_failure"]), headers
        assert _is_iso_time(headers["last_failure"]), headers
        assert site.count(f"/status/{status}") == 1
        assert not redis_client.exists(failures_key(url))
    assert results(redis_client) == []


def test_503_forever_is_tried_max_retries_plus_one_times_then_dead_lettered(
        settings, redis_client, amqp_channel, site):
    url = canonicalize(site.url("/status/503"))
    _seed(settings, redis_client, [url])
    _run_worker_until(settings, lambda: queue_depth(amqp_channel, FAILED) == 1, max_retries=2)

    assert site.count("/status/503") == 3
    headers = _dead_letters(amqp_channel)[url]
    assert headers["reason"] == "max_retries"
    assert headers["failure"] == "http_503"
    assert headers["attempts"] == 3
    assert headers["last_status"] == 503
    assert _is_iso_time(headers["first_failure"]) and _is_iso_time(headers["last_failure"])
    assert headers["first_failure"] <= headers["last_failure"]
    assert redis_client.get(failures_key(url)) == b"3"
    assert redis_client.ttl(failures_key(url)) > 0
    assert results(redis_client) == []
    assert redis_client.hget(COUNTERS, "retries") == b"2"
    assert redis_client.hget(COUNTERS, "dead_lettered:max_retries") == b"1"


def test_flaky_page_succeeds_on_the_third_attempt_and_its_failure_counter_is_deleted(
        settings, redis_client, amqp_channel, site):
    url = canonicalize(site.url("/flaky/twice/2"))
    _seed(settings, redis_client, [url])
    _run_worker_until(settings, lambda: len(results(redis_client)) == 1)

    [record] = results(redis_client)
    assert record["url"] == url
    assert record["status"] == 200
    assert record["attempts"] == 3
    assert site.count("/flaky/twice/2") == 3
    assert queue_depth(amqp_channel, FAILED) == 0
    assert not redis_client.exists(failures_key(url))


def test_read_timeout_is_retried_then_dead_lettered_as_fetch_timeout(settings, redis_client,
                                                                     amqp_channel, site):
    url = canonicalize(site.url("/slow/3"))
    _seed(settings, redis_client, [url])
    _run_worker_until(settings, lambda: queue_depth(amqp_channel, FAILED) == 1,
                      read_timeout_s=0.5, max_retries=1)

    headers = _dead_letters(amqp_channel)[url]
    assert headers["reason"] == "max_retries"
    assert headers["failure"] == "fetch_timeout"
    assert headers["attempts"] == 2
    assert "timeout" in headers["last_error"].lower()
    assert "last_status" not in headers
    assert site.count("/slow/3") == 2
    assert results(redis_client) == []


def test_connection_refused_is_retried_then_dead_lettered_as_fetch_connection(
        settings, redis_client, amqp_channel):
    with _refusing_port() as port:
        url = canonicalize(f"http://127.0.0.1:{port}/page")
        _seed(settings, redis_client, [url])
        # robots.txt off: with it on, the unreachable robots.txt is what fails (by design,
        # RFC 9309 "unreachable" = disallow), and the page fetch is never attempted.
        _run_worker_until(settings, lambda: queue_depth(amqp_channel, FAILED) == 1,
                          max_retries=1, robots_enabled=False)

    headers = _dead_letters(amqp_channel)[url]
    assert headers["reason"] == "max_retries"
    assert headers["failure"] == "fetch_connection"
    assert headers["attempts"] == 2
    assert "connection" in headers["last_error"].lower()
    assert redis_client.get(failures_key(url)) == b"2"
    assert results(redis_client) == []


def test_retry_waits_for_the_servers_retry_after(settings, redis_client, amqp_channel, site):
    url = canonicalize(site.url("/retry-after/2"))
    _seed(settings, redis_client, [url])
    _run_worker_until(settings, lambda: queue_depth(amqp_channel, FAILED) == 1,
                      max_retries=1)

    first, second = site.requests_for("/retry-after/2")
    assert second.monotonic_s - first.monotonic_s >= 1.9
    headers = _dead_letters(amqp_channel)[url]
    assert headers["reason"] == "max_retries"
    assert headers["failure"] == "http_429"
    assert headers["last_status"] == 429
    assert headers["attempts"] == 2


def test_503_with_an_unreadable_retry_after_is_retried_like_any_503(settings, redis_client,
                                                                    amqp_channel, site):
    def odd_retry_after(_request: RequestRecord) -> tuple[int, dict[str, str], bytes]:
        # "\u00b2" goes out as the single byte 0xB2 and comes back from requests as "²".
        return 503, {"Retry-After": "\u00b2", "Content-Type": "text/plain"}, b"busy"

    site.route("/odd-retry-after", odd_retry_after)
    url = canonicalize(site.url("/odd-retry-after"))
    _seed(settings, redis_client, [url])
    _run_worker_until(settings, lambda: queue_depth(amqp_channel, FAILED) == 1,
                      max_retries=1)

    headers = _dead_letters(amqp_channel)[url]
    assert (headers["reason"], headers.get("failure")) == ("max_retries", "http_503"), headers
    assert site.count("/odd-retry-after") == 2


def test_invalid_url_and_poison_messages_are_dead_lettered_at_once(settings, redis_client,
                                                                   amqp_channel, site):
    invalid = WorkMessage(url="ftp://x/").to_json()
    poison = b"\xff\xfe{not json"
    publish_raw(settings, topology.NORMAL_QUEUE, [invalid, poison])
    _run_worker_until(settings, lambda: queue_depth(amqp_channel, FAILED) == 2)

    by_body = {body: props.headers for _m, props, body in drain(amqp_channel, FAILED)}
    assert set(by_body) == {invalid, poison}
    assert by_body[invalid]["reason"] == "invalid_url"
    assert by_body[poison]["reason"] == "bad_message"
    for headers in by_body.values():
        assert headers["attempts"] == 0
        assert headers["last_error"]
        assert _is_iso_time(headers["last_failure"])
    assert redis_client.hget(COUNTERS, "retries") is None
    assert results(redis_client) == []
    assert site.log == []


def test_every_seeded_url_ends_exactly_once_as_a_result_or_a_dead_letter(
        settings, redis_client, amqp_channel, site):
    pages = [site.page_url(n) for n in range(1, 13)]
    succeed_late = [site.url("/flaky/mix-a/1"), site.url("/flaky/mix-b/2")]
    fail = [site.url("/status/404"), site.url("/status/410"), site.url("/status/503"),
            site.url("/status/500")]
    seeded = {canonicalize(u) for u in [*pages, *succeed_late, *fail]}
    _seed(settings, redis_client, sorted(seeded))

    with WorkerThread(settings.with_overrides(idle_exit_s=1.5, concurrency=4,
                                              max_retries=2)) as worker:
        assert worker.join(45) == 0

    for name in (*topology.WORK_QUEUES, *map(topology.hold_name, topology.HOLD_LEVELS_MS)):
        assert queue_depth(amqp_channel, name) == 0, name
    recorded = [r["url"] for r in results(redis_client)]
    dead = _dead_letters(amqp_channel)
    assert len(recorded) + len(dead) == len(seeded)
    assert len(set(recorded)) == len(recorded)
    assert set(recorded) | set(dead) == seeded
    assert set(recorded) == {canonicalize(u) for u in [*pages, *succeed_late]}
    assert {h["reason"] for h in dead.values()} == {"http_404", "http_410", "max_retries"}
    # Every dead letter also left one failure record, so sinks see every URL's final outcome.
    failures = [json.loads(f[b"json"]) for _id, f in redis_client.xrange(FAILURES_STREAM)]
    assert sorted(f["url"] for f in failures) == sorted(dead)
    assert {f["outcome"] for f in failures} == {"dead_letter"}
    assert {f["url"]: f["reason"] for f in failures} == {u: h["reason"] for u, h in dead.items()}


def test_expired_url_is_released_and_can_be_enqueued_again(settings, redis_client,
                                                           amqp_channel, site):
    url = canonicalize(site.url("/expire-me"))
    router = Router([{"contains": ["expire-me"], "queue": "priority", "ttl_s": 0.2}])
    with Producer(settings, redis_client, router=router) as producer:
        first = producer.submit([url])
        assert (first.new, first.per_queue[topology.PRIORITY_QUEUE]) == (1, 1)

        assert wait_for(lambda: queue_depth(amqp_channel, topology.EXPIRED_QUEUE) == 1, 10)
        assert queue_depth(amqp_channel, topology.PRIORITY_QUEUE) == 0
        # Still in the seen-set until a worker releases it.
        before_release = producer.submit([url])
        assert (before_release.new, before_release.duplicate) == (0, 1)

        _run_worker_until(settings,
                          lambda: redis_client.hget(COUNTERS, "released") == b"1")
        assert queue_depth(amqp_channel, topology.EXPIRED_QUEUE) == 0
        assert redis_client.hget(COUNTERS, "expired") == b"1"

        again = producer.submit([url])
        assert (again.new, again.duplicate) == (1, 0)
    assert site.count("/expire-me") == 0
