"""A crawl longer than Redis can hold (issue 11): a real Redis with a small ``maxmemory`` fills
up during a crawl, the fleet pauses (no thread dies, nothing is dead-lettered for it), the
status view says why, a files sink drains the backlog, the fleet resumes on its own, and every
URL ends with exactly one result in the sink's parts.

The limit is measured, not guessed: after a warm-up batch the workers are idle, Redis's
``used_memory`` and a result's size in the stream give a ``maxmemory`` at which the high
watermark comes after about PAUSE_AT results, with the low watermark well above what Redis
holds once the sink has drained the stream. Records are large (pages with many links), so the
noise of client buffers (a few tens of KB a connection) stays small beside them. The response
cache is off: it would fill memory too, and no sink drains it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import signal
from collections.abc import Iterator

import pytest
import redis

from common.broker import topology
from common.core.urls import canonicalize
from common.intake.producer import Producer
from common.store.keys import COUNTERS, FAILURES_STREAM, RESULTS_STREAM, sink_group
from common.store.workers import alive_workers
from common.work.pressure import MEMORY
from devtools.testsite import TestSite
from tests.helpers import (
    WorkerThread,
    files_sink_process,
    own_channel,
    queue_depth,
    wait_for,
)
from tests.sink.parts import finalized, lines, open_parts

PAGES = 250
WARM_UP = 20  # pages crawled before the limit is set: connections open, a record's size known
PAUSE_AT = 120  # about this many results in the stream when memory reaches the high watermark
# REDIS_MEMORY_HIGH / _LOW for this test. A maxmemory of a few MB needs more room above the
# high watermark than the default 10%: a new connection costs Redis 20-40 KB, a sink's read
# SINK_BATCH records, and each stats.py run briefly buffers the last minute of results.
HIGH, LOW = 0.8, 0.7
CONCURRENCY = 4
WORKER_IDS = ("long-w1", "long-w2")
SINK_ENV = {"SINK_BATCH": "10", "SINK_ROTATE_BYTES": "65536"}  # small reads, several parts
STATS_ENV = {"REDIS_MEMORY_HIGH": str(HIGH), "REDIS_MEMORY_LOW": str(LOW)}


@pytest.fixture
def link_site() -> Iterator[TestSite]:
    """Pages of 150 links each (records of ~5.6 KB); a little latency bounds the fetch rate."""
    with TestSite(pages=PAGES, links_per_page=150, latency_s=0.05) as site:
        yield site


def _seed(settings, client: redis.Redis, urls: list[str]) -> None:
    with Producer(settings, client) as producer:
        assert producer.submit(urls).new == len(urls)


def _depth(settings, queue: str) -> int:
    with own_channel(settings) as channel:
        return queue_depth(channel, queue)


def _consumers(settings, queue: str) -> int:
    with own_channel(settings) as channel:
        return channel.queue_declare(queue=queue, passive=True).method.consumer_count


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _transitions(records: list[logging.LogRecord], running: WorkerThread) -> list[str]:
    """The worker's pauses and resumes in order, from its I/O thread's log lines."""
    out = []
    for record in records:
        if record.thread != running.thread.ident or record.name != "common.work.worker":
            continue
        template = str(record.msg)
        if template.startswith("paused: "):
            out.append(f"paused: {record.args[0]}")
        elif template.startswith("worker %s consuming"):
            out.append("consuming")
    return out


def _oom_refusals(records: list[logging.LogRecord]) -> int:
    """Deliveries a fetch thread gave back because Redis refused them for memory."""
    return sum(1 for r in records if r.name == "common.work.fetch_loops"
               and "OutOfMemoryError" in r.getMessage())


@pytest.mark.slow
@pytest.mark.usefixtures("small_stream_nodes", "memory_limit")
def test_a_crawl_that_fills_redis_pauses_the_fleet_until_a_sink_drains_it_and_loses_nothing(
        settings, redis_client, run_cli, link_site, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="common.work.worker")
    urls = [link_site.page_url(n) for n in range(1, PAGES + 1)]
    parts, sink_log = tmp_path / "parts", tmp_path / "sink.log"
    # Registered before the crawl, so the workers stop MAXLEN-trimming; not running yet.
    registered = run_cli("sink.py", "files", "--dir", str(parts), "--idle-exit", "0.2",
                         env=SINK_ENV)
    assert registered.returncode == 0, registered.stderr[-3000:]

    own = settings.with_overrides(concurrency=CONCURRENCY, prefetch=CONCURRENCY,
                                  idle_exit_s=6.0, pressure_check_s=0.1,
                                  heartbeat_interval_s=0.3, redis_memory_high=HIGH,
                                  redis_memory_low=LOW, cache_ttl_s=0, robots_enabled=False,
                                  record_max_links=1000)  # every link: big records
    with contextlib.ExitStack() as stack:
        fleet = [stack.enter_context(WorkerThread(own.with_overrides(worker_id=wid)))
                 for wid in WORKER_IDS]

        # Warm-up: the workers have their Redis connections, a result's size is known.
        _seed(own, redis_client, urls[:WARM_UP])
        assert wait_for(lambda: redis_client.xlen(RESULTS_STREAM) == WARM_UP, 120)
        assert wait_for(lambda: not any(r.worker.ledger.inflight for r in fleet), 30)
        baseline = _used(redis_client)
        per_result = redis_client.memory_usage(RESULTS_STREAM, samples=0) // WARM_UP
        maxmemory = int((baseline + (PAUSE_AT - WARM_UP) * per_result) / HIGH)
        # The low watermark well above a drained Redis, room above the high one for the
        # deliveries a pause lets finish (at most 2 x prefetch, plus one check's worth).
        drained_estimate = baseline - WARM_UP * per_result
        assert LOW * maxmemory - drained_estimate > 40 * per_result, (baseline, per_result)
        assert (1 - HIGH) * maxmemory > 60 * per_result, (baseline, per_result)
        redis_client.config_set("maxmemory-policy", "noeviction")
        redis_client.config_set("maxmemory", maxmemory)

        # The crawl: the rest of the site, more than Redis can hold.
        _seed(own, redis_client, urls[WARM_UP:])
        assert wait_for(lambda: all(r.worker.pressure.verdict.reason == MEMORY for r in fleet),
                        120), [r.worker.pressure.verdict for r in fleet]
        assert wait_for(lambda: _consumers(own, topology.NORMAL_QUEUE) == 0, 30)
        # What was received finishes; nothing more is taken.
        assert wait_for(lambda: not any(r.worker.ledger.inflight for r in fleet), 60)
        held, at_pause = redis_client.xlen(RESULTS_STREAM), _used(redis_client)
        assert WARM_UP < held < PAGES - 50, held
        assert at_pause < maxmemory, "past maxmemory a sink cannot even register (OOM)"
        # The rest waits in RabbitMQ: nothing lost, nothing dead-lettered, no thread died.
        assert wait_for(lambda: _depth(own, topology.NORMAL_QUEUE) == PAGES - held, 30)
        assert _depth(own, topology.FAILED_QUEUE) == 0
        assert redis_client.xlen(FAILURES_STREAM) == 0
        assert not [k for k in redis_client.hkeys(COUNTERS) if k.startswith(b"dead_lettered")]
        for running in fleet:
            assert running.thread.is_alive() and running.worker.loops.alive() == CONCURRENCY

        # The status view says why: both heartbeats, the fleet's line, the table.
        def heartbeats_paused() -> bool:
            beats = {w["id"]: w.get("pressure") or {} for w in alive_workers(redis_client)}
            return all(beats.get(wid, {}).get("reason") == MEMORY for wid in WORKER_IDS)

        assert wait_for(heartbeats_paused, 30), alive_workers(redis_client)
        shown = run_cli("stats.py", "--json", env=STATS_ENV)
        assert shown.returncode == 0, shown.stderr[-3000:]
        pressure = json.loads(shown.stdout)["pressure"]
        assert MEMORY in pressure["paused"], pressure
        assert pressure["paused_workers"] == dict.fromkeys(WORKER_IDS, MEMORY), pressure
        memory = pressure["redis_memory"]
        assert memory["max"] == maxmemory and memory["ratio"] > LOW, memory
        assert (memory["high"], memory["low"]) == (HIGH, LOW)
        table = run_cli("stats.py", env=STATS_ENV).stdout
        assert "pressure: paused: Redis memory" in table, table
        assert table.count(f"paused: {MEMORY} (") == len(WORKER_IDS), table
        assert f"resume below {LOW:g})" in table, table

        # A sink drains the backlog and the fleet resumes by itself (maxmemory untouched).
        sink = stack.enter_context(files_sink_process(own, parts, sink_log, env=SINK_ENV, kill=True))
        for running in fleet:
            assert running.join(300) == 0, "the workers finish the crawl, then exit idle"
        assert wait_for(lambda: redis_client.xlen(RESULTS_STREAM) == 0, 120), \
            "the sink wrote, acknowledged and trimmed everything"
        assert redis_client.xpending(RESULTS_STREAM, sink_group("files"))["pending"] == 0
        drained = _used(redis_client)
        sink.send_signal(signal.SIGTERM)
        assert sink.wait(60) == 0, sink_log.read_text()[-3000:]

    assert int(redis_client.config_get("maxmemory")["maxmemory"]) == maxmemory
    histories = {r.worker.settings.worker_id: _transitions(caplog.records, r) for r in fleet}
    for history in histories.values():
        # Consuming; paused for memory and consuming again, once or more; no other reason.
        pauses = history.count(f"paused: {MEMORY}")
        assert pauses >= 1 and set(history) == {"consuming", f"paused: {MEMORY}"}, histories
        assert history == ["consuming", f"paused: {MEMORY}"] * pauses + ["consuming"], histories
    for running in fleet:
        assert running.worker.loops.alive() == 0  # stopped cleanly, none died before

    # Every URL exactly once in the sink's finalized parts, and no failure records.
    written = lines(parts)
    assert open_parts(parts) == [] and len(finalized(parts)) > 1
    assert [line for line in written if line["stream"] != RESULTS_STREAM] == []
    per_url = collections.Counter(line["url"] for line in written)
    assert per_url == collections.Counter(canonicalize(url) for url in urls), per_url
    assert _depth(own, topology.NORMAL_QUEUE) == _depth(own, topology.FAILED_QUEUE) == 0
    pauses = {wid: history.count(f"paused: {MEMORY}") for wid, history in histories.items()}
    print(f"\nbaseline {baseline:,} B after {WARM_UP} results ({per_result:,} B each); maxmemory "
          f"{maxmemory:,} B, high {HIGH * maxmemory:,.0f}, low {LOW * maxmemory:,.0f}; paused "
          f"at {held} results, {at_pause:,} B; drained {drained:,} B; pauses {pauses}; OOM "
          f"refusals {_oom_refusals(caplog.records)}; {len(finalized(parts))} parts")
