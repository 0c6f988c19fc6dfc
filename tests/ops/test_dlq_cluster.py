"""``dlq replay`` on a Redis Cluster (docs/design-redis-cluster.md): the default job's dead
letters go back to the work queue with every mark they left released, on every primary; a
job's are refused there (jobs do not run on a cluster) and stay in the queue.

Real services on loopback: this module's ``cluster`` (3 primaries, 3 replicas), the session
RabbitMQ. The letters are published straight into the dead-letter queue and their Redis state
(retry counters, seen fingerprints, done marks, robots.txt entries) written as the fleet writes
it, with the cluster's key names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings, load_settings
from common.core.urls import canonicalize, fingerprint
from common.jobs.registry import JobRef
from common.ops.cli_inspect import dlq_main
from common.store.connection import connect_redis
from common.store.dedupe import DoneSet, SeenSet
from common.store.keys import failures_key, job_key, robots_key
from common.web.robots import origin_of
from devtools.services import reset_state
from tests.helpers import TEST_ENV, drain, own_channel, publish_dead_letter, queue_depth

#: 127.0.0.7 .. 127.0.0.12: their domain shards are served by all three primaries.
HOSTS = [f"127.0.0.{n}" for n in range(7, 13)]
URLS = [f"http://{host}:{port}/p/{n}" for host in HOSTS for port in (8001, 8002)
        for n in (1, 2)]
#: Robots entries that stay: one on each primary (checked below).
GOOD = ["http://127.0.0.10:8002", "http://127.0.0.7:8001", "http://127.0.0.7:8002"]
#: A failed entry of an origin no letter is of: nobody asked to forget it.
STRANGER = "http://127.0.0.13:8001"
JOB_REFUSAL = "job shop: jobs do not run on a Redis Cluster (docs/design-redis-cluster.md)"


@pytest.fixture
def on_cluster(services, cluster) -> Iterator[tuple[Settings, object]]:
    """Settings of the session RabbitMQ (queues purged) and the module's cluster (flushed),
    and a client of the cluster: the key builders give cluster names from here on."""
    cluster.heal()
    cluster.flush()
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)
    settings = load_settings({**TEST_ENV, **cluster.env, "RABBITMQ_URL": services.rabbitmq_url})
    client = connect_redis(settings)
    try:
        yield settings, client
    finally:
        client.close()


def _robots(client, origin, status, kind=""):
    """A robots entry as RobotsStore.put stores it, kept long enough for the test."""
    client.set(robots_key(origin), json.dumps({"status": status, "body": "", "detail": "x",
                                               "fetched_at": 0, **({"kind": kind} if kind
                                                                   else {})}), px=600_000)


def _dlq(settings, capsys, *argv):
    code = dlq_main(settings, list(argv), prog="scrape-fleet dlq")
    out = capsys.readouterr()
    return code, out.out, out.err


def _published(settings) -> list[WorkMessage]:
    with own_channel(settings) as channel:
        return [WorkMessage.from_json(body) for queue in topology.WORK_QUEUES
                for _m, _p, body in drain(channel, queue)]


def _left(settings, capsys) -> list[tuple[str, str | None, int | None]]:
    code, out, err = _dlq(settings, capsys, "list", "--json")
    assert code == 0, err
    return [(x["url"], x.get("job"), x.get("run")) for x in map(json.loads, out.splitlines())]


def test_dlq_replay_on_a_cluster_republishes_every_letter_and_forgets_its_marks_on_each_primary(
        cluster, on_cluster, capsys):
    settings, client = on_cluster
    origins = sorted({origin_of(url) for url in URLS})
    failed = [origin for origin in origins if origin not in GOOD]
    primaries = set(cluster.primary_addresses())
    assert [canonicalize(url) for url in URLS] == URLS
    assert {cluster.primary_for_key(failures_key(url)) for url in URLS} == primaries
    assert {cluster.primary_for_key(robots_key(origin)) for origin in failed} == primaries
    assert {cluster.primary_for_key(robots_key(origin)) for origin in GOOD} == primaries
    seen, done = SeenSet(client, settings.seen_buckets), DoneSet(client, settings.seen_buckets)
    assert seen.add_many([fingerprint(url) for url in URLS]) == [True] * len(URLS)
    for url in URLS:
        client.set(failures_key(url), 3)
        done.add(done.mark_for(url))
    for origin in failed[1:]:
        _robots(client, origin, "failed", "tls_certificate")
    _robots(client, failed[0], "unavailable")
    for origin in GOOD:
        _robots(client, origin, "ok")
    _robots(client, STRANGER, "failed", "tls_certificate")
    with own_channel(settings) as channel:
        for url in URLS:
            publish_dead_letter(channel, url)

    code, out, err = _dlq(settings, capsys, "replay")

    assert code == 0, err
    assert out.startswith(f"replayed={len(URLS)} unreplayable=0 kept=0 "), out
    assert f"new={len(URLS)} duplicate=0" in out, "every fingerprint was released first"
    assert sorted(m.url for m in _published(settings)) == sorted(URLS)
    assert _left(settings, capsys) == []
    assert [client.get(failures_key(url)) for url in URLS] == [None] * len(URLS)
    assert [done.contains(done.mark_for(url)) for url in URLS] == [False] * len(URLS)
    assert seen.contains_many([fingerprint(url) for url in URLS]) == [True] * len(URLS), \
        "marked seen again by the replay's publish"
    assert [client.exists(robots_key(origin)) for origin in failed] == [0] * len(failed)
    assert [client.exists(robots_key(origin)) for origin in [*GOOD, STRANGER]] == [1] * 4


def test_a_running_jobs_dead_letter_replayed_on_a_cluster_is_refused_and_stays_in_the_queue(
        on_cluster, capsys):
    settings, client = on_cluster
    job_url, plain = "http://127.0.0.7:8001/job/1", "http://127.0.0.8:8001/plain"
    scope = JobRef("shop", 2).scope
    done = DoneSet(client, settings.seen_buckets)
    # The job's state as a single node's registry leaves it: running at run 2, so only the
    # cluster stands between its letter and the run's fleet-wide counters.
    client.hset(job_key("shop"), mapping={"state": "running", "run": 2})
    done.add(done.mark_for(job_url, scope=scope))
    with own_channel(settings) as channel:
        publish_dead_letter(channel, job_url, "http_503", job="shop", run=2)
        publish_dead_letter(channel, plain)

    code, out, err = _dlq(settings, capsys, "replay")

    assert code == 1, err
    assert out.startswith("replayed=1 unreplayable=0 kept=1 "), out
    assert f"refused 1: {JOB_REFUSAL}; they stay in the queue" in err
    assert [m.url for m in _published(settings)] == [plain]
    assert _left(settings, capsys) == [(job_url, "shop", 2)]
    code, out, err = _dlq(settings, capsys, "replay", "--job", "shop")
    assert (code, out.split()[:3]) == (1, ["replayed=0", "unreplayable=0", "kept=1"]), err
    assert f"refused 1: {JOB_REFUSAL}" in err
    assert _left(settings, capsys) == [(job_url, "shop", 2)]
    assert done.contains(done.mark_for(job_url, scope=scope)), "nothing of the run touched"
    with own_channel(settings) as channel:
        assert queue_depth(channel, topology.FAILED_QUEUE) == 1
