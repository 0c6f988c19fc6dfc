"""The fleet over HTTP (common/api/routes_fleet.py): status, workers, queues, settings shown
redacted, a broker that does not answer as a 503 naming it, and the API's own metrics."""

from __future__ import annotations

import json

import pika
import requests

from common.api.auth import Tokens
from common.broker import topology
from common.core.config import load_settings
from common.work.heartbeat import Heartbeat
from common.work.pressure import MEMORY
from tests.api.conftest import served

PASSWORD = "s3cret-amqp-pw"
REDIS_SENTINEL_PW = "s3cret-sentinel-pw"


def test_every_fleet_route_needs_a_token(api):
    for path in ("/api/status", "/api/workers", "/api/queues", "/api/settings",
                 "/api/metrics"):
        assert api.call("GET", path, token=None).status_code == 401, path
        assert api.call("GET", path, token="sf_not-a-token").status_code == 401, path


def test_status_is_the_snapshot_scrape_fleet_status_prints(api, amqp_channel):
    amqp_channel.basic_publish("", topology.NORMAL_QUEUE, b'{"url": "http://127.0.0.1:9/x"}',
                               properties=pika.BasicProperties(delivery_mode=2))
    answer = api.call("GET", "/api/status", token="read")
    assert answer.status_code == 200, answer.text
    snapshot = answer.json()
    assert snapshot["queues"][topology.NORMAL_QUEUE]["ready"] == 1
    assert {"to_do", "progress", "workers", "pressure", "dead_letters"} <= set(snapshot)
    queues = api.call("GET", "/api/queues", token="read").json()
    assert queues["queues"][topology.NORMAL_QUEUE]["ready"] == 1
    assert set(queues["queues"]) >= set(topology.WORK_QUEUES) | {topology.FAILED_QUEUE}


def test_workers_are_read_from_their_heartbeats_with_what_they_fetch_and_why_they_pause(
        api, redis_client):
    snapshot = {"in_flight": 2, "current": ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"],
                "jobs": {"shop/1": 2}, "processed": 7, "concurrency": 8,
                "pressure": {"paused": True, "reason": MEMORY, "memory_ratio": 0.95,
                             "memory_low": 0.8}}
    Heartbeat(redis_client, "worker-a", 5, lambda: snapshot).beat()
    answer = api.call("GET", "/api/workers", token="read")
    assert answer.status_code == 200, answer.text
    [worker] = answer.json()["workers"]
    assert (worker["id"], worker["in_flight"], worker["current"], worker["jobs"]) == (
        "worker-a", 2, snapshot["current"], {"shop/1": 2})
    assert worker["paused"] is True and worker["reason"] == MEMORY
    assert worker["state"].startswith(f"paused: {MEMORY} (0.95 of maxmemory")
    assert 0 <= worker["beat_age_s"] < 5 and worker["stale"] is False


def test_settings_are_shown_redacted_and_a_broker_that_does_not_answer_is_a_503(
        settings, redis_client):
    shown = load_settings({"RABBITMQ_URL": f"amqp://fleet:{PASSWORD}@127.0.0.1:1/",
                           "REDIS_URL": settings.redis_url,
                           "REDIS_SENTINEL_PASSWORD": REDIS_SENTINEL_PW,
                           "CONNECT_RETRY_S": "1"})
    token = Tokens(redis_client).create("reader", "read")
    with served(shown) as url:
        answer = requests.get(f"{url}/api/settings", timeout=10,
                              headers={"Authorization": f"Bearer {token}"})
        down = requests.get(f"{url}/api/status", timeout=30,
                            headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    assert PASSWORD not in answer.text and REDIS_SENTINEL_PW not in answer.text
    knobs = {row["name"]: row for row in answer.json()["settings"]}
    assert knobs["RABBITMQ_URL"]["value"] == "amqp://fleet:***@127.0.0.1:1/"
    assert knobs["REDIS_SENTINEL_PASSWORD"]["value"] == "***"
    assert knobs["RATE_LIMIT"]["secret"] is False and knobs["RABBITMQ_URL"]["secret"] is True
    assert len(knobs) == len(shown.knobs())
    assert json.loads(json.dumps(knobs["FETCH_ALLOW_NETWORKS"]["value"])) is not None
    assert down.status_code == 503 and down.json()["detail"].startswith("RabbitMQ")
    assert PASSWORD not in down.text


def test_metrics_count_the_api_s_calls_by_route_and_status(api):
    api.call("GET", "/api/workers", token="read")
    api.call("GET", "/api/workers", token="read")
    api.call("GET", "/api/workers", token=None)
    answer = api.call("GET", "/api/metrics", token="read")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    text = answer.text
    assert 'api_calls_total{method="GET",route="/api/workers",status="200"} 2.0' in text
    assert 'api_calls_total{method="GET",route="/api/workers",status="401"} 1.0' in text
