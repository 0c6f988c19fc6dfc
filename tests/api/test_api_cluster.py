"""The control plane on a Redis Cluster (docs/design-redis-cluster.md): served for real against
a 3-primary, 3-replica cluster on loopback and the session RabbitMQ. The fleet's views, dead
letters and logins work there; every job route answers 409, since jobs do not run on a cluster
yet, and nothing reaches Redis as a cross-slot call.
"""

from __future__ import annotations

import requests

from common.api.auth import Tokens
from common.core.config import load_settings
from common.intake.producer import Producer
from common.store.connection import connect_redis
from common.store.keys import api_fails_key
from devtools.services import reset_state
from tests.api.conftest import served
from tests.helpers import TEST_ENV

PASSWORD = "correct horse battery"


def test_the_control_plane_on_a_cluster_serves_the_fleet_and_logins_and_refuses_jobs(
        services, cluster):
    cluster.heal()
    cluster.flush()
    settings = load_settings({**TEST_ENV, **cluster.env, "RABBITMQ_URL": services.rabbitmq_url})
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)
    client = connect_redis(settings)
    urls = [f"http://127.0.0.{n}:9/page/{i}" for n in range(7, 13) for i in range(5)]
    with Producer(settings, client) as producer:
        assert producer.submit(urls).new == len(urls)
    tokens = Tokens(client)
    admin = {"Authorization": f"Bearer {tokens.create('cluster-admin', 'admin')}"}
    tokens.add_user("ana", PASSWORD, "admin")

    with served(settings) as url:
        def call(method: str, path: str, **kwargs: object) -> requests.Response:
            return requests.request(method, url + path, headers=admin, timeout=30,
                                    **kwargs)  # type: ignore[arg-type]

        status = call("GET", "/api/status")
        assert status.status_code == 200, status.text
        assert "30" in status.text  # the seeded URLs, counted over every shard
        for path in ("/api/workers", "/api/queues", "/api/dead-letters"):
            assert call("GET", path).status_code == 200, path
        replay = call("POST", "/api/dead-letters/replay", json={})
        assert replay.status_code == 200, replay.text
        for method, path, body in (("GET", "/api/jobs", None), ("GET", "/api/jobs/shop", None),
                                   ("POST", "/api/jobs", {"name": "shop",
                                                          "seeds": {"urls": [urls[0]]}})):
            refused = call(method, path, json=body)
            assert refused.status_code == 409, (path, refused.text)
            assert "jobs do not run on a Redis Cluster" in refused.text
        # A login reads and counts two failure keys together: one slot ({api}).
        for _ in range(settings.api_login_attempts):
            wrong = requests.post(f"{url}/api/login", timeout=30,
                                  json={"user": "ana", "password": "not the password"})
            assert wrong.status_code == 401, wrong.text
        blocked = requests.post(f"{url}/api/login", timeout=30,
                                json={"user": "ana", "password": PASSWORD})
        assert blocked.status_code == 429, blocked.text
        assert int(client.get(api_fails_key("user:ana"))) == settings.api_login_attempts
