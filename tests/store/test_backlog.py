"""The fill reading against a real Redis: memory against maxmemory, and each registered sink's
backlog (lag + pending on both streams), in one round trip."""

from __future__ import annotations

from common.store.backlog import read_fill
from common.store.keys import ASSETS_STREAM, FAILURES_STREAM, RESULTS_STREAM, SINKS, sink_group


def _add(client, stream, count):
    return [client.xadd(stream, {"json": "{}"}) for _ in range(count)]


def test_no_sink_no_streams_no_limit(redis_client):
    fill = read_fill(redis_client)
    assert fill.sinks == {} and fill.backlog == 0 and fill.backlog_sink is None
    assert fill.lengths == {RESULTS_STREAM: 0, FAILURES_STREAM: 0, ASSETS_STREAM: 0}
    assert fill.used_memory > 0 and fill.maxmemory == 0 and fill.memory_ratio is None


def test_a_sinks_backlog_is_lag_plus_pending_over_both_streams(redis_client):
    for stream in (RESULTS_STREAM, FAILURES_STREAM):
        redis_client.xgroup_create(stream, sink_group("a"), id="0", mkstream=True)
    redis_client.sadd(SINKS, "a")
    _add(redis_client, RESULTS_STREAM, 7)
    _add(redis_client, FAILURES_STREAM, 2)
    assert read_fill(redis_client).sinks == {"a": 9}
    [(_stream, read)] = redis_client.xreadgroup(sink_group("a"), "c", {RESULTS_STREAM: ">"},
                                                count=4)
    assert read_fill(redis_client).sinks == {"a": 9}  # 3 lag + 4 pending + 2
    redis_client.xack(RESULTS_STREAM, sink_group("a"), *[i for i, _f in read])
    fill = read_fill(redis_client)
    assert fill.sinks == {"a": 5} and fill.backlog == 5 and fill.backlog_sink == "a"
    assert fill.figures()["sinks"] == {"a": 5} and fill.figures()["results_length"] == 7


def test_the_largest_sink_counts_and_a_sink_without_its_group_counts_the_whole_stream(
        redis_client):
    _add(redis_client, RESULTS_STREAM, 4)
    redis_client.xgroup_create(RESULTS_STREAM, sink_group("caught-up"), id="$")
    redis_client.sadd(SINKS, "caught-up", "new")
    fill = read_fill(redis_client)
    assert fill.sinks == {"caught-up": 0, "new": 4} and fill.backlog_sink == "new"


def test_an_unknown_lag_falls_back_to_the_stream_length(redis_client):
    ids = _add(redis_client, RESULTS_STREAM, 6)
    redis_client.xgroup_create(RESULTS_STREAM, sink_group("a"), id="0")
    redis_client.sadd(SINKS, "a")
    redis_client.xdel(RESULTS_STREAM, ids[2])  # a hole in the unread range: Redis loses lag
    assert redis_client.xinfo_groups(RESULTS_STREAM)[0]["lag"] is None
    assert read_fill(redis_client).sinks == {"a": 5}


def test_memory_against_maxmemory(redis_client):
    before = redis_client.config_get("maxmemory")["maxmemory"]
    try:
        redis_client.config_set("maxmemory", 100 * 1024 * 1024)
        fill = read_fill(redis_client)
        assert fill.maxmemory == 100 * 1024 * 1024
        assert fill.memory_ratio == fill.used_memory / fill.maxmemory
    finally:
        redis_client.config_set("maxmemory", before)
