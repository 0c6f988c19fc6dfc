from __future__ import annotations

import json
import signal
import time

from common.broker.messages import WorkMessage
from common.intake.producer import Producer
from tests.helpers import (
    WorkerThread,
    drain,
    output_of,
    publish_raw,
    queue_depth,
    results,
    start_worker_process,
    wait_for,
)


def _seed(settings, redis_client, urls, priority=False):
    with Producer(settings, redis_client) as producer:
        return producer.submit(urls, force_priority=priority)


def test_worker_records_one_result_per_url_with_the_parsed_fields(settings, redis_client, site):
    urls = [site.page_url(n) for n in range(1, 21)]
    _seed(settings, redis_client, urls)
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0, concurrency=4)) as worker:
        assert worker.join(30) == 0
    records = {r["url"]: r for r in results(redis_client)}
    assert set(records) == set(urls)
    page = records[site.page_url(3)]
    assert page["status"] == 200 and page["title"] == "Page 3"
    assert page["description"] == "Test page 3 of 300."
    assert page["canonical"] == site.page_url(3) and page["language"] == "en"
    assert set(page["links"]) >= {site.page_url(m) for m in site.links_of(3)}
    assert page["text_length"] > 100 and len(page["content_hash"]) >= 16
    assert page["worker"] == settings.worker_id and page["elapsed_ms"] > 0
    assert page["fetched_at"] > 0 and page["final_url"] == site.page_url(3)
    assert site.requests_for("/page/") and all(
        r.user_agent == settings.user_agent for r in site.requests_for("/page/"))


def test_latin1_page_declared_only_in_meta_is_decoded(settings, redis_client, site):
    _seed(settings, redis_client, [site.url("/latin1")])
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0)) as worker:
        worker.join(30)
    [record] = results(redis_client)
    assert record["title"] == "Café Latin-1"


def test_priority_messages_are_served_first_when_both_queues_are_backlogged(settings,
                                                                          redis_client, site):
    normal = [site.page_url(n) for n in range(1, 41)]
    urgent = [site.page_url(n) for n in range(41, 46)]
    _seed(settings, redis_client, normal)
    _seed(settings, redis_client, urgent, priority=True)
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0, concurrency=1,
                                              prefetch=5)) as worker:
        worker.join(60)
    order = [r["url"] for r in results(redis_client)]
    assert len(order) == 45
    # At most one normal delivery can have started before the first priority one arrived.
    positions = sorted(order.index(u) for u in urgent)
    assert positions[-1] <= len(urgent), order[:10]


def test_poison_messages_are_dead_lettered_and_the_worker_keeps_going(settings, redis_client,
                                                                     amqp_channel, site):
    good = WorkMessage(url=site.page_url(1)).to_json()
    publish_raw(settings, "url_queue_ttl", [b"not json", b'{"url": 42}', b"[]", good])
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0)) as worker:
        assert worker.join(30) == 0
    dead = drain(amqp_channel, "failed_urls")
    assert sorted(p.headers["reason"] for _m, p, _b in dead) == ["bad_message"] * 3
    assert sorted(b for _m, _p, b in dead) == sorted([b"not json", b'{"url": 42}', b"[]"])
    assert [r["url"] for r in results(redis_client)] == [site.page_url(1)]
    assert queue_depth(amqp_channel, "url_queue_ttl") == 0


def test_a_fetch_longer_than_the_heartbeat_keeps_the_connection(settings, redis_client,
                                                               amqp_channel, site):
    # Heartbeat 1 s; the page takes 4 s. A fetch on pika's thread would lose the connection
    # and the message would be redelivered (two requests, a second result).
    _seed(settings, redis_client, [site.url("/slow/4")])
    fast_beat = settings.with_overrides(rabbitmq_heartbeat_s=1, idle_exit_s=2.0)
    with WorkerThread(fast_beat) as worker:
        assert worker.join(40) == 0
    assert [r["status"] for r in results(redis_client)] == [200]
    assert site.count("/slow/4") == 1
    assert queue_depth(amqp_channel, "url_queue_ttl") == 0


def test_sigterm_lets_in_flight_fetches_finish_and_be_acked(settings, redis_client,
                                                           amqp_channel, site):
    slow = [site.url(f"/slow/2?n={i}") for i in range(2)]
    rest = [site.page_url(n) for n in range(1, 11)]
    _seed(settings, redis_client, slow)
    _seed(settings, redis_client, rest)
    proc = start_worker_process(settings, "--concurrency", "2",
                                 env={"PREFETCH": "20"})
    try:
        assert wait_for(lambda: len(site.requests_for("/slow/")) == 2, 20)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, output_of(proc)
    done = [r["url"] for r in results(redis_client)]
    assert set(slow) <= set(done)
    # Whatever was not finished went back to the queue: nothing lost, nothing doubled.
    left = queue_depth(amqp_channel, "url_queue_ttl")
    assert left + len(done) == 12 and len(done) == len(set(done))


def test_auto_ack_mode_loses_an_in_flight_priority_message_when_killed(settings, redis_client,
                                                                      amqp_channel, site):
    _seed(settings, redis_client, [site.url("/slow/5?q=p")], priority=True)
    _seed(settings, redis_client, [site.url("/slow/5?q=n")])
    proc = start_worker_process(settings, "--concurrency", "2",
                                 env={"PRIORITY_AUTO_ACK": "true"})
    try:
        assert wait_for(lambda: len(site.requests_for("/slow/")) == 2, 20)
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
    # The manually acked message comes back; the auto-acked one is gone: the documented trade-off.
    assert wait_for(lambda: queue_depth(amqp_channel, "url_queue_ttl") == 1, 10)
    assert queue_depth(amqp_channel, "priority_queue") == 0


def test_worker_cli_idle_exit_returns_zero(settings, run_cli):
    result = run_cli("worker.py", "--idle-exit", "0.5", timeout_s=30)
    assert result.returncode == 0, result.stderr
    assert "idle exit" in result.stderr


def test_stats_json_reports_queues_seen_and_results(settings, redis_client, run_cli, site):
    _seed(settings, redis_client, [site.page_url(1), site.page_url(2), "ftp://bad/"])
    result = run_cli("stats.py", "--json")
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["queues"]["url_queue_ttl"]["ready"] == 2
    assert snapshot["dead_lettered"] == 1 and snapshot["seen"] == 2 and snapshot["results"] == 0
    table = run_cli("stats.py")
    assert "url_queue_ttl" in table.stdout and "seen URLs: 2" in table.stdout
