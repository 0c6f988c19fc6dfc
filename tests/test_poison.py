"""Poison messages end (common/work/poison.py): a URL whose deliveries keep dying with their
worker is dead-lettered ``poison`` with the last stage it reached, never released or retried
forever; a quorum queue's delivery-limit drop is ``poison`` too; a page stuck in libxml2
restarts its worker once and is dead-lettered.

Real RabbitMQ, Redis, worker processes and the loopback test site; ``kill -9`` at the worst
moment (mid-fetch of the doomed URL).
"""

from __future__ import annotations

import json
import signal
import threading
from collections import Counter
from typing import Any

import pika
import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.urls import canonicalize, fingerprint
from common.intake.producer import Producer
from common.store.dedupe import SeenSet
from common.store.keys import FAILURES_STREAM, poison_key
from common.work.poison import STUCK_EXIT_CODE
from common.work.processor import Processor
from tests.helpers import (
    drain,
    output_of,
    results,
    start_worker_process,
    wait_for,
)

pytestmark = pytest.mark.integration


def _seed(settings: Any, client: Any, urls: list[str]) -> None:
    with Producer(settings, client) as producer:
        assert producer.submit(urls).new == len(urls)


def _dead_letters(channel: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for _method, props, body in drain(channel, topology.FAILED_QUEUE):
        url = json.loads(body)["url"]
        assert url not in out, f"{url} dead-lettered twice"
        out[url] = props.headers
    return out


def _kill(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def _three_deaths_then_a_finisher(settings: Any, kill_when: Any) -> None:
    """Three workers in turn, the d-th killed (-9) once ``kill_when(d)``; then one that runs
    until idle and must exit 0."""
    for death in range(1, 4):
        worker = start_worker_process(settings, "--concurrency", "4")
        try:
            assert wait_for(lambda d=death: kill_when(d), 30), output_of(worker)[-3000:]
        finally:
            _kill(worker)
        assert worker.returncode == -signal.SIGKILL
    finisher = start_worker_process(settings, "--concurrency", "4", "--idle-exit", "2")
    try:
        assert finisher.wait(timeout=60) == 0, output_of(finisher)[-3000:]
    finally:
        _kill(finisher)


@pytest.mark.slow
def test_a_url_that_dies_with_its_worker_three_times_is_dead_lettered_as_poison_with_its_stage(
        settings, redis_client, amqp_channel, site, run_cli):
    release = threading.Event()

    def hang(_request: Any) -> tuple[int, dict[str, str], bytes]:
        release.wait(60)  # the worker is killed while it waits here, mid-fetch
        return 200, {"Content-Type": "text/html"}, b"<title>late</title>"

    site.route("/hang", hang)
    doomed = canonicalize(site.url("/hang"))
    ordinary = [site.url(f"/page/{n}") for n in range(1, 21)]
    _seed(settings, redis_client, [*ordinary, doomed])
    try:
        # Three workers die while fetching it, each killed once the ordinary pages are
        # recorded (the test below kills with pages in flight beside it).
        _three_deaths_then_a_finisher(settings, lambda d: site.count("/hang") >= d
                                      and len(results(redis_client)) >= len(ordinary))
    finally:
        release.set()

    assert site.count("/hang") == 3  # the fourth delivery never fetched it
    letters = _dead_letters(amqp_channel)
    assert set(letters) == {doomed}
    headers = letters[doomed]
    assert headers["reason"] == "poison"
    assert "last stage fetch" in headers["last_error"], headers
    per_url = Counter(record["url"] for record in results(redis_client))
    assert per_url == Counter({canonicalize(url): 1 for url in ordinary})
    failures = [json.loads(fields[b"json"]) for _id, fields in
                redis_client.xrange(FAILURES_STREAM)]
    assert [(f["url"], f["reason"]) for f in failures] == [(doomed, "poison")]

    # Fixed (the site answers now): put back as it was (draining took it), replayed by its
    # reason, it gets its one result.
    amqp_channel.basic_publish(topology.FAILED_EXCHANGE, topology.FAILED_ROUTING_KEY,
                               WorkMessage(doomed).to_json(),
                               properties=pika.BasicProperties(headers=headers, delivery_mode=2))
    replayed = run_cli("dlq.py", "replay", "--reason", "poison")
    assert replayed.returncode == 0 and replayed.stdout.startswith("replayed=1 "), replayed
    finisher = start_worker_process(settings, "--concurrency", "2", "--idle-exit", "2")
    try:
        assert finisher.wait(timeout=60) == 0, output_of(finisher)[-3000:]
    finally:
        _kill(finisher)
    per_url = Counter(record["url"] for record in results(redis_client))
    assert per_url[doomed] == 1 and site.count("/hang") == 4


@pytest.mark.slow
def test_pages_in_flight_beside_a_killer_at_every_kill_are_not_condemned_with_it(
        settings, redis_client, amqp_channel, site):
    # Each kill catches the innocent pages mid-fetch too, as long as they are fetched beside
    # the killer. Redelivered, they go on one at a time (the worker's quarantine): one waiting
    # behind the killer dies waiting, which counts no death, so only the killer's add up.
    release = threading.Event()

    def hang(_request: Any) -> tuple[int, dict[str, str], bytes]:
        release.wait(60)
        return 200, {"Content-Type": "text/html"}, b"<title>late</title>"

    def slow(_request: Any) -> tuple[int, dict[str, str], bytes]:
        release.wait(2)  # long enough to be mid-fetch when its worker is killed
        return 200, {"Content-Type": "text/html"}, b"<title>innocent</title>"

    site.route("/hang", hang)
    innocent = [canonicalize(site.url(f"/innocent/{n}")) for n in range(3)]
    for url in innocent:
        site.route(url.removeprefix(site.base_url), slow)
    doomed = canonicalize(site.url("/hang"))
    _seed(settings, redis_client, [*innocent, doomed])
    try:
        def all_fetched_beside(d: int) -> bool:
            return site.count("/hang") >= d and all(
                site.count(url.removeprefix(site.base_url)) >= 1 for url in innocent)

        _three_deaths_then_a_finisher(settings, all_fetched_beside)
    finally:
        release.set()

    assert site.count("/hang") == 3
    assert set(_dead_letters(amqp_channel)) == {doomed}
    per_url = Counter(record["url"] for record in results(redis_client))
    assert per_url == Counter({url: 1 for url in innocent})
    assert [redis_client.exists(poison_key(url)) for url in innocent] == [0, 0, 0]


def test_a_redelivery_counts_a_death_and_an_outcome_forgets_them(settings, redis_client, site):
    processor = Processor(settings, redis_client)
    url = canonicalize(site.url("/page/1"))
    try:
        outcome = processor.process(WorkMessage(url).to_json(), topology.NORMAL_QUEUE,
                                    redelivered=True)
    finally:
        processor.close()
    assert outcome.kind == "result"
    assert not redis_client.exists(poison_key(url))  # recorded: not poison any more


def test_the_third_redelivery_without_an_outcome_is_poison_and_not_fetched(
        settings, redis_client, site):
    processor = Processor(settings, redis_client)
    url = canonicalize(site.url("/page/2"))
    try:
        for _ in range(2):  # two deliveries that died in parse (what a dying worker leaves)
            progress, verdict = processor.poison.arrive(url, redelivered=True)
            assert verdict is None
            progress.enter("parse")
        outcome = processor.process(WorkMessage(url).to_json(), topology.NORMAL_QUEUE,
                                    redelivered=True)
    finally:
        processor.close()
    assert outcome.kind == "dead_letter"
    headers = outcome.publishes[0].headers
    assert headers["reason"] == "poison"
    assert "3 deliveries ended without an outcome; last stage parse" in headers["last_error"]
    assert site.count("/page/2") == 0


def test_a_quorum_queue_delivery_limit_drop_is_poison_not_expired(settings, redis_client):
    processor = Processor(settings, redis_client)
    url = canonicalize("http://127.0.0.1:9/poisoned")
    fp = fingerprint(url)
    seen = SeenSet(redis_client, settings.seen_buckets)
    seen.add_many([fp])
    try:
        outcome = processor.process_expired(WorkMessage(url).to_json(), "delivery_limit")
        expired = processor.process_expired(WorkMessage(url + "2").to_json(), "expired")
    finally:
        processor.close()
    assert outcome.kind == "dead_letter"
    assert outcome.publishes[0].headers["reason"] == "poison"
    assert "delivery limit" in outcome.publishes[0].headers["last_error"]
    assert expired.kind == "released"
    assert seen.contains_many([fp]) == [True]  # not released: it must not come back


@pytest.mark.slow
def test_a_page_stuck_in_the_parser_restarts_its_worker_once_and_is_dead_lettered(
        settings, redis_client, amqp_channel, site):
    # Quoted ">" hide this tag from the long-tag cap; libxml2's duplicate-attribute check is
    # quadratic, so parsing it takes minutes.
    flood = b"<p " + b" ".join(b'a%d=">"' % i for i in range(150_000)) + b">"
    site.route("/stuck", lambda _r: (200, {"Content-Type": "text/html"},
                                     b"<html><body>" + flood + b"</body></html>"))
    stuck = canonicalize(site.url("/stuck"))
    ordinary = [site.url(f"/page/{n}") for n in range(1, 11)]
    _seed(settings, redis_client, [stuck, *ordinary])
    env = {"STUCK_PAGE_S": "2"}
    first = start_worker_process(settings, "--concurrency", "2", env=env)
    try:
        assert first.wait(timeout=60) == STUCK_EXIT_CODE, output_of(first)[-3000:]
    finally:
        _kill(first)
    assert "parse still running after" in output_of(first)
    finisher = start_worker_process(settings, "--concurrency", "2", "--idle-exit", "2", env=env)
    try:
        assert finisher.wait(timeout=60) == 0, output_of(finisher)[-3000:]
    finally:
        _kill(finisher)
    letters = _dead_letters(amqp_channel)
    assert set(letters) == {stuck}
    assert letters[stuck]["reason"] == "poison"
    assert "last stage parse" in letters[stuck]["last_error"]
    assert Counter(r["url"] for r in results(redis_client)) == \
        Counter({canonicalize(url): 1 for url in ordinary})
