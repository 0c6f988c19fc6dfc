"""A Redis Cluster primary killed mid-crawl (issue 31): the fleet follows the promoted replica.

Real processes on loopback: a Redis Cluster of 3 primaries with a replica each (this module's
``cluster``), the session RabbitMQ, six test sites whose domains fall on every primary, two
worker processes that know Redis only as ``redis+cluster://`` and ack a result only once a
replica has it (REDIS_MIN_REPLICAS=1). The primary holding the most keys is ``kill -9``-ed when
a third of the farm is crawled; once its replica is promoted the killed node is started again
(it rejoins as the new primary's replica, as a supervisor would restart it), so WAIT is
satisfied again. Then: every URL ends with exactly one result, none twice; the seen-set came
through, so the same URLs seeded again are all duplicates. It also prints Redis's CPU per page
per primary (docs/design-redis-cluster.md, capacity).

Also on the cluster: a files sink exports every shard's results once; two recrawl
schedulers, the leader killed while it holds a batch, revisit every URL and learn each visit;
URLs deferred in Redis are released at their domains' pace through a releaser killed holding a
claim.
"""

from __future__ import annotations

import bisect
import json
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from common.broker import topology
from common.core.config import Settings, load_settings
from common.core.errors import REDIS_UNAVAILABLE
from common.core.urls import canonicalize, fingerprint
from common.intake.defer import deferred_status
from common.intake.producer import Producer
from common.intake.schedule import Schedule
from common.store import slots
from common.store.backlog import read_fill
from common.store.connection import connect_redis
from common.store.dedupe import HELD, TAKEN, Claims, SeenSet
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM, deferred_key, schedule_key
from devtools.services import reset_state
from devtools.services.redis_cluster import RedisClusterGroup
from devtools.testsite import TestSite, running_sites
from tests.helpers import (
    TEST_ENV,
    drain,
    files_sink_process,
    kill_when,
    leader_id,
    output_of,
    own_channel,
    queue_depth,
    start_scheduler,
    start_worker_process,
    stop_workers,
    wait_for,
)
from tests.sink.parts import lines

#: 127.0.0.7 .. 127.0.0.12: their domain shards are served by all three primaries.
SITES, PAGES, FIRST_HOST = 6, 50, "127.0.0.7"
LATENCY_S = 0.1  # a page takes a while: the crawl lasts long enough to be cut in the middle
WORKERS, CONCURRENCY = 2, 4
PENDING_QUEUES = (*topology.WORK_QUEUES, *(topology.hold_name(level)
                                           for level in topology.HOLD_LEVELS_MS),
                  topology.EXPIRED_QUEUE)


@pytest.fixture
def farm() -> Iterator[list[TestSite]]:
    with running_sites(SITES, first_host=FIRST_HOST, pages=PAGES, latency_s=LATENCY_S) as sites:
        yield sites


def _streams(client: redis.cluster.RedisCluster, name: str) -> list[dict]:
    """Every record in every shard's part of stream ``name``."""
    return [json.loads(fields[b"json"]) for part in slots.parts(name)
            for _id, fields in client.xrange(part)]


def _recorded(client: redis.cluster.RedisCluster) -> int:
    """Results and failure records in every part (0 while the cluster fails over)."""
    try:
        return sum(int(client.xlen(part)) for name in (RESULTS_STREAM, FAILURES_STREAM)
                   for part in slots.parts(name))
    except (*REDIS_UNAVAILABLE, redis.exceptions.RedisClusterException):
        return 0


def _appended(client: redis.cluster.RedisCluster) -> int:
    """Results ever appended to every part (XINFO STREAM entries-added: a sink trims)."""
    total = 0
    for part in slots.parts(RESULTS_STREAM):
        try:
            total += int(client.xinfo_stream(part)["entries-added"])
        except redis.ResponseError:  # no such stream yet
            continue
    return total


def _fullest_primary(cluster: RedisClusterGroup) -> tuple[str, int]:
    """The primary holding the most keys."""
    sizes = {}
    for address in cluster.primary_addresses():
        node = redis.Redis(host=address[0], port=address[1], socket_timeout=2)
        try:
            sizes[address] = int(node.dbsize())
        finally:
            node.close()
    return max(sizes, key=lambda address: sizes[address])


def test_seen_set_and_claims_split_by_shard_on_a_cluster_keep_their_single_node_answers(
        cluster):
    cluster.flush()
    settings = load_settings({**TEST_ENV, **cluster.env})
    client = connect_redis(settings)
    seen, claims = SeenSet(client, settings.seen_buckets), Claims(client)
    fps = [fingerprint(f"http://site{n % 40}.test/p/{n}") for n in range(300)]
    assert claims.take_unseen(seen, fps, "page:a") == [HELD] * 300
    assert claims.take_unseen(seen, fps, "page:b") == [TAKEN] * 300, "claimed by page:a"
    assert claims.mark_seen(seen, fps[:200]) == 200
    assert claims.release(fps[200:], "page:a", seen=seen) == 100
    assert seen.contains_many(fps) == [True] * 200 + [False] * 100
    for node in cluster.primary_addresses():  # a restarted or promoted node: no scripts
        redis.Redis(host=node[0], port=node[1]).script_flush()
    assert seen.add_many(fps[150:]) == [False] * 50 + [True] * 100, "NOSCRIPT: loaded again"
    assert claims.take_unseen(seen, fps, "page:b") == [TAKEN] * 300, "all seen now"
    assert len({seen.key(fp).split("}")[0] for fp in fps}) == slots.SHARDS


@pytest.mark.slow
def test_a_killed_cluster_primary_is_replaced_by_its_replica_and_every_url_has_one_result(
        services, cluster, farm):
    cluster.heal()
    cluster.flush()
    fleet_env = {**cluster.env, "REDIS_MIN_REPLICAS": "1", "REDIS_WAIT_TIMEOUT_MS": "1000",
                 "PRESSURE_CHECK_S": "0.5"}
    settings: Settings = load_settings({**TEST_ENV, **fleet_env,
                                        "RABBITMQ_URL": services.rabbitmq_url})
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)  # the topology fresh
    client = connect_redis(settings)
    urls = [site.page_url(n) for site in farm for n in range(1, PAGES + 1)]
    with Producer(settings, client) as producer:
        assert producer.submit(urls).new == len(urls)
    cpu_before = cluster.cpu_s()

    workers = [start_worker_process(settings, "--concurrency", str(CONCURRENCY),
                                    env={**fleet_env, "WORKER_ID": f"cluster-w{i}"})
               for i in range(WORKERS)]
    try:
        started = time.time()
        assert wait_for(lambda: _recorded(client) >= len(urls) // 3, 120), \
            [output_of(w)[-2000:] for w in workers]
        victim = _fullest_primary(cluster)
        cpu_mid = cluster.cpu_s()
        recorded_at_kill = _recorded(client)
        killed_at = cluster.kill(victim)
        promoted, promoted_at = cluster.wait_for_failover(victim, timeout_s=30)
        cluster.heal()  # the killed node back, as the promoted one's replica
        assert wait_for(lambda: _recorded(client) >= len(urls), 180), \
            _diagnosis(settings, client, cluster, workers)
        finished_at = time.time()
        time.sleep(1.0)  # a second result for some URL would show up now
        cpu_after = cluster.cpu_s()
        logs = stop_workers(workers)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(timeout=10)

    per_url = Counter(record["url"] for record in _streams(client, RESULTS_STREAM))
    with own_channel(settings) as channel:
        dead = [json.loads(body)["url"] for _m, _p, body in
                drain(channel, topology.FAILED_QUEUE)]
        left = {name: queue_depth(channel, name) for name in PENDING_QUEUES}
    assert "CROSSSLOT" not in logs and "Traceback" not in logs, logs[-3000:]
    assert [url for url, count in per_url.items() if count > 1] == [], "no URL twice"
    assert dead == [], dead
    assert per_url == Counter(canonicalize(url) for url in urls), "nothing lost"
    assert set(left.values()) == {0}, left
    with Producer(settings, client) as producer:
        again = producer.submit(urls)
    assert (again.new, again.duplicate) == (0, len(urls)), again.line()
    print(f"\nkill -9 of primary :{victim[1]} -> :{promoted[1]} promoted in "
          f"{promoted_at - killed_at:.1f} s; {len(per_url)} URLs in "
          f"{finished_at - started:.0f} s, one result each; deliveries held "
          f"{logs.count('holding delivery')} times, {logs.count('already_done')} redelivered "
          f"ones already done")
    print(_cpu_per_page(cpu_before, cpu_mid, recorded_at_kill))
    print(_cpu_per_page(cpu_mid, cpu_after, len(urls) - recorded_at_kill, "after the kill"))


@pytest.mark.slow
def test_a_files_sink_on_a_cluster_exports_every_shard_s_results_once_and_drains_its_backlog(
        services, cluster, farm, tmp_path: Path):
    cluster.heal()
    cluster.flush()
    settings = load_settings({**TEST_ENV, **cluster.env, "RABBITMQ_URL": services.rabbitmq_url})
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)
    client = connect_redis(settings)
    urls = [site.page_url(n) for site in farm for n in range(1, 11)]
    out = tmp_path / "out"
    with files_sink_process(settings, out, tmp_path / "sink.log") as sink:
        with Producer(settings, client) as producer:
            assert producer.submit(urls).new == len(urls)
        worker = start_worker_process(settings, "--concurrency", "4",
                                      env={**cluster.env, "WORKER_ID": "cluster-sink-w"})
        try:
            assert wait_for(lambda: _appended(client) >= len(urls), 120), output_of(worker)
            assert wait_for(lambda: read_fill(client).sinks.get("files") == 0, 30), \
                (read_fill(client), (tmp_path / "sink.log").read_text()[-2000:])
            fill = read_fill(client)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0, output_of(worker)[-3000:]
        sink.send_signal(signal.SIGTERM)
        assert sink.wait(timeout=60) == 0, (tmp_path / "sink.log").read_text()[-3000:]
    exported = lines(out)
    assert Counter(line["url"] for line in exported) == Counter(canonicalize(u) for u in urls)
    parts = {line["stream"] for line in exported}
    assert len(parts) > 1 and {slots.whole(p) for p in parts} == {RESULTS_STREAM}, parts
    assert fill.lengths[RESULTS_STREAM] <= len(urls), "the parts' lengths summed per stream"


def test_the_recrawl_scheduler_on_a_cluster_revisits_every_url_through_a_killed_leader(
        services, cluster, farm):
    cluster.heal()
    cluster.flush()
    settings = load_settings({**TEST_ENV, **cluster.env, "RABBITMQ_URL": services.rabbitmq_url})
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)
    client = connect_redis(settings)
    pages = {canonicalize(site.page_url(n)): (site, f"/page/{n}") for site in farm
             for n in range(1, 6)}
    urls = list(pages)
    schedule = Schedule(client, settings.with_overrides(schedule_min_interval_s=1))
    assert schedule.add([(url, 1, 0) for url in urls], replace=True).added == len(urls)
    env = {"SCHEDULE_LEASE_S": "1", "SCHEDULE_INTERVAL_S": "1", "SCHEDULE_MIN_INTERVAL_S": "1",
           "SCHEDULE_MAX_INTERVAL_S": "1", "SCHEDULE_BATCH": "7"}
    schedulers = {name: start_scheduler(settings, name, env) for name in ("cl-a", "cl-b")}
    worker = start_worker_process(settings, "--concurrency", "8",
                                  env={"WORKER_ID": "cluster-recrawl-w", "CACHE_TTL_S": "0"})
    procs = [*schedulers.values(), worker]

    def visits() -> Counter[str]:  # the sites' request logs: the results stream is trimmed
        return Counter({url: site.count(path) for url, (site, path) in pages.items()})

    try:
        assert wait_for(lambda: leader_id(client) is not None, 30), \
            [output_of(p)[-2000:] for p in procs]
        first = leader_id(client)
        # kill -9 the leader while it holds a batch: taken, maybe published, not rescheduled
        assert wait_for(lambda: client.hlen(schedule_key("inflight")) > 0, 20, step_s=0.001)
        schedulers[first].kill()
        held = {url.decode() for url in client.hkeys(schedule_key("inflight"))}
        at_kill = visits()
        other = next(name for name in schedulers if name != first)
        assert wait_for(lambda: leader_id(client) == other, 10, step_s=0.01)
        assert wait_for(lambda: all(visits()[url] >= at_kill[url] + 2 for url in urls), 60), \
            (visits(), [output_of(p)[-2000:] for p in procs])
        assert wait_for(lambda: all(schedule.entry(url)["visits"] >= 2 for url in urls), 20), \
            ([schedule.entry(url) for url in urls[:3]], output_of(schedulers[other])[-3000:])
        schedulers[other].send_signal(signal.SIGTERM)
        assert schedulers[other].wait(15) == 0, output_of(schedulers[other])[-3000:]
        logs = "\n".join(output_of(p) for p in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert "CROSSSLOT" not in logs and "Traceback" not in logs, logs[-3000:]
    assert "without the job runner" in output_of(schedulers[other])
    assert held and all(visits()[url] >= at_kill[url] + 2 for url in held)  # none skipped
    assert client.get(schedule_key("lease")) is None  # given up on a clean stop
    assert client.zcard(schedule_key("due")) == len(urls)  # every URL still scheduled
    assert client.hlen(schedule_key("inflight")) == 0
    assert schedule.remove(urls[:3]) == 3 and schedule.entry(urls[0]) is None  # MULTI: one slot
    assert schedule.status()["scheduled"] == len(urls) - 3


def test_urls_deferred_on_a_cluster_are_released_at_their_domain_s_pace_through_a_killed_releaser(
        services, cluster, farm):
    cluster.heal()
    cluster.flush()
    paced = {"RATE_LIMIT": "20/second", "DEFER_LEAD_S": "0.5"}
    settings = load_settings({**TEST_ENV, **cluster.env, **paced,
                              "RABBITMQ_URL": services.rabbitmq_url})
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)
    client = connect_redis(settings)
    urls = [site.page_url(n) for site in farm for n in range(1, PAGES + 1)]
    with Producer(settings, client) as producer:
        seeded = producer.submit(urls)
    # 20/s a domain, 0.5 s ahead: about ten of each domain's 50 go now, the rest wait in Redis
    assert seeded.new == len(urls) and seeded.deferred >= len(urls) * 2 // 3, seeded.line()
    assert client.hlen(deferred_key("counts")) == SITES
    shown = deferred_status(client)  # the status view's part: a count, an MGET of slots
    assert shown["total"] == seeded.deferred and len(shown["domains"]) == SITES, shown
    assert all(domain["through_in_s"] >= 1 for domain in shown["domains"]), shown
    victim = start_worker_process(settings, "--concurrency", "4", env={
        **paced, "DEFER_BATCH": "500", "DEFER_LEASE_S": "2", "WORKER_ID": "cluster-victim"})
    # killed right after its releaser claimed a batch
    kill_when(victim, lambda: client.zcard(deferred_key("inflight")) > 0)
    held = client.zcard(deferred_key("inflight"))
    survivors = [start_worker_process(settings, "--idle-exit", "4", "--concurrency", "4", env={
        **paced, "WORKER_ID": f"cluster-survivor-{i}"}) for i in range(2)]
    try:
        for proc in survivors:
            assert proc.wait(180) == 0, output_of(proc)[-3000:]
        logs = "\n".join(output_of(proc) for proc in [victim, *survivors])
    finally:
        for proc in survivors:
            if proc.poll() is None:
                proc.kill()
    assert held > 0, "the killed releaser's claim was still held"
    assert "CROSSSLOT" not in logs and "Traceback" not in logs, logs[-3000:]
    per_url = Counter(record["url"] for record in _streams(client, RESULTS_STREAM))
    assert per_url == Counter(canonicalize(url) for url in urls), "each URL one result"
    assert client.zcard(deferred_key()) + client.zcard(deferred_key("inflight")) == 0
    assert client.hlen(deferred_key("counts")) == 0
    with own_channel(settings) as channel:
        assert queue_depth(channel, topology.FAILED_QUEUE) == 0
    for site in farm:  # released at the domain's pace: never over 20 in a second
        times = sorted(r.wall_time_s for r in site.requests_for("/page/"))
        assert max(bisect.bisect_right(times, t + 1.0) - i for i, t in enumerate(times)) <= 21


def test_a_cluster_node_whose_port_was_taken_before_it_bound_starts_on_other_ports(
        monkeypatch, caplog):
    from devtools.services import redis_cluster
    from devtools.services.base import find_binaries

    with socket.socket() as taken:  # a port found free, then taken by someone else
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = redis_cluster.free_port
        monkeypatch.setattr(redis_cluster, "free_port", lambda: next(ports, None) or real())
        group = RedisClusterGroup()
        node = group._start_node(find_binaries(["redis"])["redis-server"])
        try:
            assert node.running and redis.Redis(port=node.port).ping()
        finally:
            node.stop()
    assert "a port was taken before it bound" in caplog.text


def _cpu_per_page(before: dict, after: dict, pages: int, when: str = "before the kill") -> str:
    """Redis CPU (user + sys) per page, per primary and in all, between two readings (a
    primary in only one of them, the promoted replica, counts from 0)."""
    used = {address: after[address] - before.get(address, 0.0) for address in after}
    per_shard = ", ".join(f":{port} {1e6 * cpu / max(pages, 1):.0f}"
                          for (_host, port), cpu in sorted(used.items()))
    return (f"Redis CPU per page {when} ({pages} pages): {per_shard} us per primary, "
            f"{1e6 * sum(used.values()) / max(pages, 1):.0f} us in all")


def _diagnosis(settings: Settings, client: redis.cluster.RedisCluster,
               cluster: RedisClusterGroup, workers: list) -> str:
    """What a stalled crawl left: outcomes, queues, the nodes' logs, the workers' logs
    without their per-page lines."""
    with own_channel(settings) as channel:
        depths = {name: queue_depth(channel, name)
                  for name in (*PENDING_QUEUES, topology.FAILED_QUEUE)}
    logs = ["\n".join(line for line in output_of(w).splitlines() if " -> result " not in line)
            [-3000:] for w in workers]
    return (f"recorded {_recorded(client)}; queues {depths}\n" + "\n".join(logs) + "\n"
            + cluster.logs()[-3000:])
