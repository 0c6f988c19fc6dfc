from __future__ import annotations

import json

import pytest

from common.broker.messages import WorkMessage
from common.core.urls import canonicalize, fingerprint
from common.intake.producer import Producer
from common.store.dedupe import SeenSet
from tests.helpers import drain, queue_depth


def test_new_urls_are_published_once_and_repeats_counted_as_duplicates(settings, redis_client,
                                                                       amqp_channel):
    urls = [f"http://127.0.0.1:9/p/{i}" for i in range(50)]
    with Producer(settings, redis_client) as producer:
        first = producer.submit(urls + urls[:10])
        second = producer.submit(urls)
    assert (first.read, first.new, first.duplicate) == (60, 50, 10)
    assert (second.new, second.duplicate) == (0, 50)
    assert queue_depth(amqp_channel, "url_queue_ttl") == 50
    assert SeenSet(redis_client, settings.seen_buckets).count() == 50


def test_equivalent_spellings_of_one_url_are_deduplicated(settings, redis_client):
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(["http://Example.com:80/a?b=2&a=1#top",
                                   "http://example.com/a?a=1&b=2"])
    assert (summary.new, summary.duplicate) == (1, 1)


def test_seen_set_stores_compact_integers_not_url_strings(settings, redis_client):
    with Producer(settings, redis_client) as producer:
        producer.submit([f"http://127.0.0.1:9/x/{i}" for i in range(2000)])
    keys = list(redis_client.scan_iter(match="crawled_urls:*"))
    assert keys, "seen-set buckets missing"
    assert {redis_client.object("encoding", k) for k in keys} == {b"intset"}
    member = redis_client.srandmember(keys[0])
    int(member)  # an integer, not a URL or hex digest


def test_messages_are_persistent_json_with_url_enqueued_at_and_fingerprint(settings,
                                                                          redis_client,
                                                                          amqp_channel):
    with Producer(settings, redis_client) as producer:
        producer.submit(["http://127.0.0.1:9/blog/1"])
    [(_method, props, body)] = drain(amqp_channel, "url_queue_ttl")
    message = WorkMessage.from_json(body)
    assert props.delivery_mode == 2 and props.content_type == "application/json"
    assert message.url == "http://127.0.0.1:9/blog/1" and message.enqueued_at > 0
    assert message.fp == fingerprint(message.url).hex


def test_routing_sends_httpbin_with_five_minute_ttl_and_news_to_priority(settings, redis_client,
                                                                         amqp_channel):
    # Only enqueued, never fetched: no traffic leaves this machine.
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(["https://httpbin.org/get", "http://127.0.0.1:9/news/1",
                                   "http://127.0.0.1:9/live", "http://127.0.0.1:9/other"])
    assert summary.per_queue == {"priority_queue": 3, "url_queue_ttl": 1}
    got = {json.loads(body)["url"]: props.expiration
           for _m, props, body in drain(amqp_channel, "priority_queue")}
    assert got == {"https://httpbin.org/get": "300000", "http://127.0.0.1:9/news/1": None,
                   "http://127.0.0.1:9/live": None}


def test_force_priority_overrides_the_rules(settings, redis_client, amqp_channel):
    with Producer(settings, redis_client) as producer:
        producer.submit(["http://127.0.0.1:9/other"], force_priority=True)
    assert queue_depth(amqp_channel, "priority_queue") == 1


def test_invalid_urls_are_dead_lettered_with_reason_invalid_url(settings, redis_client,
                                                                amqp_channel):
    with Producer(settings, redis_client) as producer:
        summary = producer.submit(["ftp://example.com/f", "no scheme here", "http://ok.test/"])
    assert (summary.invalid, summary.new) == (2, 1)
    dead = drain(amqp_channel, "failed_urls")
    assert sorted(json.loads(b)["url"] for _m, _p, b in dead) == ["ftp://example.com/f",
                                                                   "no scheme here"]
    for _m, props, _b in dead:
        assert props.headers["reason"] == "invalid_url"
        assert props.headers["last_error"]


def test_a_nacked_publish_releases_the_url_from_the_seen_set(settings, services, redis_client,
                                                             amqp_channel):
    if services.rabbitmq is None:
        pytest.skip("needs a broker started by the tests (rabbitmqctl set_policy)")
    services.rabbitmq.ctl("set_policy", "-p", "/", "reject-all", "^url_queue_ttl$",
                          '{"max-length": 0, "overflow": "reject-publish"}',
                          "--apply-to", "queues")
    try:
        with Producer(settings, redis_client) as producer:
            summary = producer.submit(["http://127.0.0.1:9/rejected"])
    finally:
        services.rabbitmq.ctl("clear_policy", "-p", "/", "reject-all")
    assert (summary.new, summary.failed) == (0, 1)
    fp = fingerprint(canonicalize("http://127.0.0.1:9/rejected"))
    assert SeenSet(redis_client, settings.seen_buckets).contains_many([fp]) == [False]
    # ...so the same URL can be enqueued once the broker accepts it again.
    with Producer(settings, redis_client) as producer:
        assert producer.submit(["http://127.0.0.1:9/rejected"]).new == 1


def test_cli_reads_args_files_with_comments_and_stdin(run_cli, tmp_path):
    listing = tmp_path / "urls.txt"
    listing.write_text("# seeds\nhttp://127.0.0.1:9/a   # first\n\nhttp://127.0.0.1:9/b#frag\n"
                       "not-a-url\n")
    result = run_cli("producer.py", "http://127.0.0.1:9/c", "-f", str(listing), "-",
                     input_text="http://127.0.0.1:9/d\nhttp://127.0.0.1:9/a\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("read=6 new=4 duplicate=1 invalid=1 failed=0 "
                                     "priority_queue=0 url_queue_ttl=4")


def test_cli_exits_non_zero_with_a_clear_message_when_the_broker_is_down(run_cli,
                                                                         redis_client):
    result = run_cli("producer.py", "http://127.0.0.1:9/a",
                     env={"RABBITMQ_URL": "amqp://127.0.0.1:1/%2F", "CONNECT_RETRY_S": "1"})
    assert result.returncode == 3
    assert "RabbitMQ" in result.stderr and "unreachable" in result.stderr
    assert redis_client.dbsize() == 0  # nothing was marked as seen


def test_cli_exits_non_zero_when_redis_is_down(run_cli):
    result = run_cli("producer.py", "http://127.0.0.1:9/a",
                     env={"REDIS_URL": "redis://127.0.0.1:1/0", "CONNECT_RETRY_S": "1"})
    assert result.returncode == 3
    assert "Redis" in result.stderr


def test_cli_rejects_a_bad_setting_naming_the_variable(run_cli):
    result = run_cli("producer.py", "http://127.0.0.1:9/a", env={"PRODUCER_BATCH": "zero"})
    assert result.returncode == 2
    assert "PRODUCER_BATCH" in result.stderr
