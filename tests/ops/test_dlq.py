from __future__ import annotations

import json

import pika

from common.broker import topology
from common.broker.deadletter import dead_letter_headers
from common.broker.messages import WorkMessage
from common.intake.producer import Producer
from common.store.keys import failures_key
from tests.helpers import WorkerThread, queue_depth, results


def _dead_letter_some(settings, redis_client, site, state):
    """Two URLs that fail for good (503, max_retries=0) and one invalid URL."""
    site.route("/replay-me", lambda _r: (state["status"], {"Content-Type": "text/html"},
                                         b"<html><title>back</title></html>"))
    with Producer(settings, redis_client) as producer:
        producer.submit([site.url("/replay-me"), site.url("/status/404"), "ftp://nope/"])
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0, max_retries=0)) as worker:
        worker.join(30)


def test_list_shows_reasons_and_leaves_the_queue_untouched(settings, redis_client, run_cli,
                                                            amqp_channel, site):
    _dead_letter_some(settings, redis_client, site, {"status": 503})
    assert queue_depth(amqp_channel, "failed_urls") == 3
    listing = run_cli("dlq.py", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    letters = [json.loads(line) for line in listing.stdout.splitlines()]
    assert sorted(x["reason"] for x in letters) == ["http_404", "invalid_url", "max_retries"]
    assert queue_depth(amqp_channel, "failed_urls") == 3
    table = run_cli("dlq.py", "list")
    assert "by reason" in table.stdout and "max_retries" in table.stdout


def test_replay_resets_the_counter_and_routes_the_url_again(settings, redis_client, run_cli,
                                                            amqp_channel, site):
    state = {"status": 503}
    _dead_letter_some(settings, redis_client, site, state)
    url = site.url("/replay-me")
    assert redis_client.get(failures_key(url)) == b"1"
    state["status"] = 200  # the site recovered
    replayed = run_cli("dlq.py", "replay", "--reason", "max_retries")
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.startswith("replayed=1 ")
    assert redis_client.get(failures_key(url)) is None
    assert queue_depth(amqp_channel, "failed_urls") == 2  # the others were left alone
    assert queue_depth(amqp_channel, "url_queue_ttl") == 1
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0)) as worker:
        worker.join(30)
    assert [(r["url"], r["status"]) for r in results(redis_client)] == [(url, 200)]


def test_purge_needs_yes_and_then_empties_the_dead_letter_queue(settings, redis_client,
                                                               run_cli, amqp_channel, site):
    _dead_letter_some(settings, redis_client, site, {"status": 503})
    refused = run_cli("dlq.py", "purge")
    assert refused.returncode == 2 and queue_depth(amqp_channel, "failed_urls") == 3
    purged = run_cli("dlq.py", "purge", "--yes")
    assert purged.returncode == 0 and "purged 3" in purged.stdout
    assert queue_depth(amqp_channel, "failed_urls") == 0


def test_list_shows_a_hostile_url_and_error_on_one_line(settings, run_cli, amqp_channel):
    forged = "2026-01-01 INFO [worker-1] forged"
    body = WorkMessage(url=f"http://127.0.0.1:9/x\n{forged}").to_json()
    headers = dead_letter_headers("worker_error", last_error=f"boom\r\n{forged}-error")
    amqp_channel.basic_publish(topology.FAILED_EXCHANGE, topology.FAILED_ROUTING_KEY, body,
                               properties=pika.BasicProperties(headers=headers,
                                                               delivery_mode=2))
    listing = run_cli("dlq.py", "list")
    assert listing.returncode == 0, listing.stderr
    assert not [line for line in listing.stdout.splitlines() if line.startswith(forged)]
    assert "\\n2026-01-01 INFO" in listing.stdout
