from __future__ import annotations

import json
import signal
import socket
from urllib.parse import quote, urlsplit

import requests

from common.intake.producer import Producer
from common.store.keys import worker_key
from tests.helpers import output_of, start_worker_process, wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _management_env(services) -> dict[str, str]:
    if not services.management_url:
        return {}
    parts = urlsplit(services.management_url)
    user, password = services.management_auth or ("guest", "guest")
    return {"RABBITMQ_MANAGEMENT_URL":
            f"{parts.scheme}://{quote(user)}:{quote(password)}@{parts.hostname}:{parts.port}"}


def test_status_json_describes_a_running_fleet(settings, services, redis_client, run_cli, site):
    slow = [site.url(f"/slow/10?s={i}") for i in range(2)]
    pages = [site.page_url(n) for n in range(1, 11)]
    with Producer(settings, redis_client) as producer:
        producer.submit(pages + slow + ["ftp://bad/"])
    worker = start_worker_process(settings, "--concurrency", "2",
                                  env={"WORKER_ID": "status-w1", "HEARTBEAT_INTERVAL_S": "0.5",
                                       "PREFETCH": "2"})
    try:
        assert wait_for(lambda: len(site.requests_for("/slow/")) == 2, 30), output_of(worker)
        assert wait_for(lambda: len(json.loads(redis_client.get(worker_key("status-w1"))
                                               or "{}").get("current", [])) == 2, 10)
        snapshots = []

        def unacked_seen() -> bool:
            # The management API refreshes its figures every few seconds: poll.
            result = run_cli("stats.py", "--json", env=_management_env(services))
            assert result.returncode == 0, result.stderr
            snapshots.append(json.loads(result.stdout))
            return (not services.management_url
                    or snapshots[-1]["queues"]["url_queue_ttl"]["unacked"] == 2)

        assert wait_for(unacked_seen, 8, step_s=0.5)
        snapshot = snapshots[-1]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    [alive] = [w for w in snapshot["workers"] if w["id"] == "status-w1"]
    assert alive["processed"] >= 1 and sorted(alive["current"]) == sorted(slow)
    assert snapshot["results"] >= 1 and snapshot["pages_per_s_last_minute"] > 0
    assert snapshot["dead_lettered"] == 1
    assert snapshot["cache"]["misses"] >= snapshot["results"]
    normal = snapshot["queues"]["url_queue_ttl"]
    assert normal["consumers"] == 1
    if services.management_url:
        assert normal["unacked"] == 2  # the two slow pages in flight


def test_a_killed_workers_heartbeat_expires_by_itself(settings, redis_client):
    worker = start_worker_process(settings, env={"WORKER_ID": "doomed",
                                                 "HEARTBEAT_INTERVAL_S": "0.5"})
    try:
        assert wait_for(lambda: redis_client.exists(worker_key("doomed")), 20), output_of(worker)
        beat = json.loads(redis_client.get(worker_key("doomed")))
        assert beat["pid"] == worker.pid and beat["host"]
    finally:
        worker.kill()  # SIGKILL: no chance to delete its key
        worker.wait(10)
    assert redis_client.exists(worker_key("doomed"))
    assert wait_for(lambda: not redis_client.exists(worker_key("doomed")), 5)


def test_worker_serves_prometheus_metrics_with_outcomes_and_latency(settings, redis_client,
                                                                   site):
    port = _free_port()
    with Producer(settings, redis_client) as producer:
        producer.submit([site.page_url(n) for n in range(1, 6)] + [site.url("/status/404")])
    worker = start_worker_process(settings, env={"METRICS_PORT": str(port)})
    try:
        def metrics_text() -> str:
            try:
                return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except requests.ConnectionError:
                return ""
        # Six deliveries are worked on concurrently: wait until every one has settled
        # (five results and the 404's dead letter), not merely the first five.
        settled = ('fleet_fetches_total{job="",outcome="result"} 5.0',
                   'fleet_dead_letters_total{reason="http_404"} 1.0')
        assert wait_for(lambda: all(line in metrics_text() for line in settled), 30), \
            output_of(worker)
        text = metrics_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    assert "fleet_fetch_seconds_bucket" in text and "fleet_fetch_seconds_count 6.0" in text
    assert "fleet_cache_misses_total 6.0" in text
    assert "fleet_fetch_bytes_total" in text and "fleet_in_flight" in text


def test_json_log_format_writes_one_object_per_line(settings, run_cli):
    result = run_cli("worker.py", "--idle-exit", "0.3", env={"LOG_FORMAT": "json",
                                                           "WORKER_ID": "json-w"})
    assert result.returncode == 0
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert lines and all(entry["worker"] == "json-w" for entry in lines)
    assert any("idle exit" in entry["message"] for entry in lines)


def test_status_shows_each_domains_requests_against_its_limit(settings, redis_client):
    import pika

    from common.ops import stats
    from common.web.ratelimit import RateLimiter

    limited = settings.with_overrides(rate_limit_overrides=(("example.test", (5, 60_000)),))
    limiter = RateLimiter(redis_client, limited)
    for _ in range(3):
        assert limiter.admit("example.test", limiter.rate_for("example.test")).go
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        snapshot = stats.collect(limited, connection, redis_client)
    finally:
        connection.close()
    assert {"domain": "example.test", "requests_in_window": 3, "limit": 5,
            "window_s": 60.0} in snapshot["domains"]
    assert "example.test: 3/5 per 60s" in stats.render(snapshot)


def test_status_shows_each_proxy_served_failed_and_resting_without_its_credentials(
        settings, redis_client):
    import pika

    from common.ops import stats
    from common.store.keys import PROXY_STATS, proxy_rest_key

    redis_client.hset(PROXY_STATS, mapping={
        "a1:name": "http://proxy-a.test:3128", "a1:served": 120, "a1:failed": 0,
        "b2:name": "http://proxy-b.test:3128", "b2:served": 3, "b2:failed": 7})
    redis_client.set(proxy_rest_key("b2"), "1", px=30_000)
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        snapshot = stats.collect(settings, connection, redis_client)
    finally:
        connection.close()
    rows = snapshot["proxies"]
    assert [row["proxy"] for row in rows] == ["http://proxy-a.test:3128",
                                              "http://proxy-b.test:3128"]
    assert rows[0]["resting_s"] == 0 and rows[0]["served"] == 120
    assert rows[1]["failed"] == 7 and 25 < rows[1]["resting_s"] <= 30
    text = stats.render(snapshot)
    assert "http://proxy-a.test:3128: 120 / 0" in text
    assert "http://proxy-b.test:3128: 3 / 7, resting" in text
