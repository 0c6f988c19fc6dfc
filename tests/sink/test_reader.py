"""The sink reader against a real Redis: pending entries replayed after a consumer dies, acks,
trimming only below what every registered sink acknowledged, retiring, a Redis restart."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from common.sink.reader import Entry, SinkReader, retire, run_sink, trim_floor
from common.store.keys import ASSETS_STREAM, FAILURES_STREAM, RESULTS_STREAM, SINKS, sink_group
from common.store.results import ResultStore
from tests.helpers import wait_for


def _append(client: redis.Redis, count: int, stream: str = RESULTS_STREAM,
            maxlen: int = 1_000_000) -> list[str]:
    store = ResultStore(client, maxlen)
    for n in range(count):
        record = {"url": f"https://example.test/{stream}/{n}", "n": n}
        if stream == FAILURES_STREAM:
            record["outcome"] = "dead_letter"
        store.record(record, stream=stream)
    return [raw.decode() for raw, _f in client.xrange(stream)][-count:]


def _first_id(client: redis.Redis, stream: str = RESULTS_STREAM) -> str | None:
    entries = client.xrange(stream, count=1)
    return entries[0][0].decode() if entries else None


def _take(reader: SinkReader, stop: threading.Event | None = None) -> list[Entry]:
    return next(reader.batches(stop or threading.Event()))


def test_pending_entries_are_replayed_after_the_consumer_dies_then_new_ones_follow(
        redis_client):
    reader = SinkReader(redis_client, "files", batch=3)
    reader.register()
    results = _append(redis_client, 5)
    failures = _append(redis_client, 1, FAILURES_STREAM)

    first = _take(reader)  # one XREADGROUP over both streams, COUNT per stream
    assert [(e.stream, e.id) for e in first] == (
        [(RESULTS_STREAM, i) for i in results[:3]] + [(FAILURES_STREAM, failures[0])])
    assert first[0].record == {"url": "https://example.test/results/0", "n": 0}
    # The process dies before it acks: a new reader of the same sink gets them again, first.
    again = SinkReader(redis_client, "files", batch=3)
    replayed = _take(again)
    assert [e.id for e in replayed] == [e.id for e in first]
    again.ack(replayed)
    batches = again.batches(threading.Event())
    assert [e.id for e in next(batches)] == results[3:]
    assert next(batches) == []  # a read that waited BLOCK_MS for nothing
    assert redis_client.xpending(RESULTS_STREAM, sink_group("files"))["pending"] == 2
    assert redis_client.xpending(FAILURES_STREAM, sink_group("files"))["pending"] == 0
    assert redis_client.smembers(SINKS) == {b"files"}


def test_the_streams_are_trimmed_only_below_what_every_registered_sink_acknowledged(
        redis_client):
    ahead, behind = (SinkReader(redis_client, name, batch=4) for name in ("ahead", "behind"))
    ahead.register()
    behind.register()
    ids = _append(redis_client, 10)
    failure_ids = _append(redis_client, 3, FAILURES_STREAM)

    everything = _take(SinkReader(redis_client, "ahead", batch=100))
    ahead.ack(everything)
    taken = _take(behind)  # results 0..3 and failures 0..2 delivered
    behind.ack([e for e in taken if e.id in ids[:2] or e.stream == FAILURES_STREAM])

    assert ahead.trim() == {RESULTS_STREAM: ids[2], FAILURES_STREAM: _next(failure_ids[2]),
                            ASSETS_STREAM: "0-1"}  # empty: nothing delivered, nothing kept
    assert _first_id(redis_client) == ids[2]  # behind's oldest pending entry stays
    assert redis_client.xlen(RESULTS_STREAM) == 8
    assert redis_client.xlen(FAILURES_STREAM) == 0

    behind.ack([e for e in taken if e.id in ids[2:4]])
    behind.trim()
    assert _first_id(redis_client) == ids[4]  # nothing pending: kept from after its last read
    rest = _take(SinkReader(redis_client, "behind", batch=100))
    behind.ack(rest)
    behind.trim()
    assert redis_client.xlen(RESULTS_STREAM) == 0


def _next(stream_id: str) -> str:
    ms, seq = stream_id.split("-")
    return f"{ms}-{int(seq) + 1}"


def test_a_registered_sink_that_never_runs_holds_the_trimming_until_it_is_retired(
        redis_client, run_cli, small_stream_nodes):
    SinkReader(redis_client, "files").register()
    SinkReader(redis_client, "forgotten").register()
    ids = _append(redis_client, 6)
    reader = SinkReader(redis_client, "files")
    reader.ack(_take(reader))

    reader.trim()
    assert redis_client.xlen(RESULTS_STREAM) == 6
    # What the status view shows (common/store/backlog.py): the forgotten sink's lag.
    groups: dict[bytes, Any] = {g["name"]: g for g in redis_client.xinfo_groups(RESULTS_STREAM)}
    assert (groups[b"sink:forgotten"]["lag"], groups[b"sink:forgotten"]["pending"]) == (6, 0)
    assert (groups[b"sink:files"]["lag"], groups[b"sink:files"]["pending"]) == (0, 0)
    assert groups[b"sink:files"]["last-delivered-id"].decode() == ids[-1]

    retired = run_cli("sink.py", "retire", "forgotten")
    assert retired.returncode == 0, retired.stderr
    assert redis_client.smembers(SINKS) == {b"files"}
    assert {g["name"] for g in redis_client.xinfo_groups(RESULTS_STREAM)} == {b"sink:files"}
    reader.trim()
    assert redis_client.xlen(RESULTS_STREAM) == 0
    assert run_cli("sink.py", "retire", "forgotten").returncode == 1

    # With the last sink retired the workers' MAXLEN cap applies again.
    assert retire(redis_client, "files")
    assert trim_floor(redis_client, RESULTS_STREAM) is None
    _append(redis_client, 30, maxlen=5)
    assert redis_client.xlen(RESULTS_STREAM) <= 5 + small_stream_nodes


def test_a_sink_registered_before_its_group_exists_holds_the_trimming(redis_client):
    SinkReader(redis_client, "files").register()
    _append(redis_client, 3)
    redis_client.sadd(SINKS, "starting")  # registered; its XGROUP CREATE has not run yet
    reader = SinkReader(redis_client, "files")
    reader.ack(_take(reader))
    assert reader.trim() == {RESULTS_STREAM: None, FAILURES_STREAM: None, ASSETS_STREAM: None}
    assert redis_client.xlen(RESULTS_STREAM) == 3


class _ListSink:
    """Remembers what it was given, like a sink that writes durably at once."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.written: list[Entry] = []
        self.closed = False

    def write(self, entries: list[Entry]) -> None:
        seen = {(e.stream, e.id) for e in self.written}
        self.written += [e for e in entries if (e.stream, e.id) not in seen]

    def close(self) -> None:
        self.closed = True


def test_run_sink_keeps_going_through_a_redis_restart_and_loses_nothing(services):
    from devtools.services.redis_server import LocalRedis

    try:
        server = LocalRedis(appendonly=True).start()
    except Exception as exc:  # noqa: BLE001 - no local redis-server binary here
        pytest.skip(f"no local redis-server to restart: {exc}")
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        writer = redis.Redis.from_url(server.url)
        sink, stop = _ListSink(), threading.Event()
        reader = SinkReader(client, sink.name, batch=7)
        thread = threading.Thread(target=lambda: run_sink(reader, sink, stop), daemon=True)
        thread.start()
        assert wait_for(lambda: writer.sismember(SINKS, "memory"), 10)
        first = _append(writer, 20)
        assert wait_for(lambda: len(sink.written) == 20, 20)
        server.restart(kill=False)
        second = _append(writer, 20)
        assert wait_for(lambda: len(sink.written) == 40, 60), len(sink.written)
        assert wait_for(lambda: writer.xlen(RESULTS_STREAM) == 0, 20)
        stop.set()
        thread.join(20)
        assert not thread.is_alive() and sink.closed
        assert [e.id for e in sink.written] == first + second
    finally:
        server.stop()
