"""The status view's counts that must agree with each other: outcomes, results, dead letters and
what is still to do (common/ops/crawl_progress.py splits them into done / failed / to do).

- outcomes and results recorded are read in one MULTI: the done-set's size and the results
  stream's ``entries-added`` (every result is appended once, in the script that marks it done;
  a sink's trimming does not lower the counter), so a result recorded meanwhile is in both or
  neither. On a Redis Cluster a MULTI stays in one slot: the done buckets and the stream's
  parts (one per shard, common/store/slots.py) are read in one pipeline, not atomically (a
  result recorded meanwhile may land in "other" for a moment), their figures summed;
- each registered sink's count of results written is its consumer group's: ``entries-read``
  (delivered to the group) minus ``pending`` (delivered, not yet acknowledged). A sink
  acknowledges an entry only once it is durably written (common/sink/reader.py), so this is
  exact, from the broker of record, whatever the sink's own files say; ``waiting`` is what it
  has yet to write;
- dead letters: ``now`` is what the failed queue holds (by reason: its messages browsed, up to
  DLQ_BROWSE_MAX, and returned in their order), ``ever`` the counters ``dead_lettered:{reason}``
  in ``stats:counters``, which replay, purge and the queue's 24 h TTL do not lower;
- to do: the work queues' ready messages, the hold queues' (delayed), the deferred ZSETs'
  members (waiting and being released: their cardinalities, not the per-domain counts) and the
  deliveries in flight at the workers;
- jobs: each job's current run from its own counters (common/jobs/progress.py); the default
  job's view is the rest of the snapshot, as before jobs;
- proxies: each proxy's requests served and failures (``proxy:stats``, redacted names only) and
  whether it rests now (its ``proxy:rest:{id}`` key), read in one pipeline.
"""

from __future__ import annotations

from typing import Any

import pika
import redis

from common.broker import topology
from common.jobs import progress as job_progress
from common.jobs.registry import JobRegistry
from common.ops import dlq
from common.store.keys import (
    COUNTERS,
    DONE_PREFIX,
    RESULTS_STREAM,
    SINKS,
    deferred_key,
    proxy_rest_key,
    sink_group,
)
from common.store.slots import cluster, parts
from common.web.proxies import read_stats

#: The most dead letters browsed for the "now" count by reason; a larger queue's reasons are
#: those of its first DLQ_BROWSE_MAX (``by_reason_of`` says how many were read).
DLQ_BROWSE_MAX = 500


def outcomes_and_results(client: redis.Redis) -> tuple[int, dict[str, Any]]:
    """URLs in the done-set and the ``results`` part of the snapshot (results recorded, still
    in the stream, written by each registered sink), read in one transaction (a pipeline on
    a cluster, every part of the stream summed)."""
    buckets = list(client.scan_iter(match=f"{DONE_PREFIX}*", count=1000))
    streams = parts(RESULTS_STREAM)
    try:
        replies = _read(client, buckets, streams, transaction=not cluster())
    except redis.exceptions.OutOfMemoryError:
        # Over maxmemory Redis refuses to queue any command of a MULTI, reads too: read them
        # one after the other (a URL finishing in between lands in "other"), as status must
        # work exactly when the fleet is paused for memory.
        replies = _read(client, buckets, streams, transaction=False)
    sizes, names, per_stream = replies[:len(buckets)], replies[len(buckets)], \
        replies[len(buckets) + 1:]
    sinks = sorted(_text(n) for n in names)
    recorded = in_stream = 0
    written: dict[str, int] = {}
    for info, groups in zip(per_stream[0::2], per_stream[1::2], strict=True):
        if isinstance(info, redis.ResponseError):  # no stream (part) yet: nothing recorded
            continue
        recorded += int(info["entries-added"])
        in_stream += int(info["length"])
        by_group = {_text(g["name"]): g for g in groups}
        for name in sinks:
            group = by_group.get(sink_group(name))
            read = None if group is None else group.get("entries-read")
            if read is not None:
                written[name] = written.get(name, 0) + max(0, int(read) - int(group["pending"]))
    by_sink: dict[str, dict[str, int | None]] = {}
    for name in sinks:
        done = written.get(name)
        by_sink[name] = {"written": done,
                         "waiting": None if done is None else max(0, recorded - done)}
    return sum(sizes), {"recorded": recorded, "in_stream": in_stream,
                        "source": "sinks" if by_sink else "stream", "sinks": by_sink}


def _read(client: redis.Redis, buckets: list[Any], streams: list[str], *,
          transaction: bool) -> list[Any]:
    pipe = client.pipeline(transaction=transaction)
    for key in buckets:
        pipe.scard(key)
    pipe.smembers(SINKS)
    for stream in streams:
        pipe.xinfo_stream(stream)
        pipe.xinfo_groups(stream)
    return pipe.execute(raise_on_error=False)


def counters(client: redis.Redis) -> dict[str, int]:
    """``stats:counters`` with, on a cluster, every shard's part summed in (the record and
    expire scripts write their shard's part; plain HINCRBYs the hash itself): one HGETALL
    outside cluster mode, one pipeline on a cluster."""
    if not cluster():
        return {_text(k): int(v) for k, v in client.hgetall(COUNTERS).items()}
    pipe = client.pipeline(transaction=False)
    for name in [COUNTERS, *parts(COUNTERS)]:
        pipe.hgetall(name)
    total: dict[str, int] = {}
    for found in pipe.execute():
        for key, value in found.items():
            total[_text(key)] = total.get(_text(key), 0) + int(value)
    return total


def dead_letters(connection: pika.BlockingConnection, counters: dict[str, int],
                 queued: int, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dead letters now (in the failed queue) and ever (counters), each by reason.

    Args:
        previous: the last refresh's figures (``--watch``): while neither count moved, its
            reasons are kept instead of browsing the queue again (a browse holds the messages
            it reads for a moment, which a ``dlq replay`` running then would not see).
    """
    ever = {k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("dead_lettered:")}
    now_by_reason: dict[str, int] = {}
    read = 0
    if previous and (previous["now"], previous["ever"]) == (queued, sum(ever.values())):
        now_by_reason, read = previous["now_by_reason"], previous["by_reason_of"]
    elif queued:
        letters = dlq.browse(connection, DLQ_BROWSE_MAX)
        now_by_reason, read = dlq.count_by_reason(letters), len(letters)
    return {"now": queued, "now_by_reason": now_by_reason, "by_reason_of": read,
            "ever": sum(ever.values()),
            "ever_by_reason": dict(sorted(ever.items(), key=lambda kv: (-kv[1], kv[0])))}


def to_do(client: redis.Redis, queues: dict[str, dict[str, Any]], delayed: int,
          workers: list[dict[str, Any]], *, seen: int, finished: int) -> dict[str, int]:
    """What is still pending, by where it waits; ``total`` is their sum.

    In flight is what the management API last sampled as unacknowledged (else what the
    heartbeats last said), but never more than the URLs known and not otherwise accounted for
    (seen - finished - ready - delayed - deferred, when that is not negative: a recrawl's
    refreshes make it so). Both samples are up to 5 s old (the management API's statistics
    interval, the heartbeat's): right after a crawl they may still hold a prefetch's worth,
    in local mode 2 workers x 16 = 32, likely the "32 to do" of a finished crawl in issue 24.
    """
    unacked = [queues[name]["unacked"] for name in topology.CONSUMED_QUEUES]
    reported = (sum(unacked) if None not in unacked
                else sum(w.get("in_flight", 0) for w in workers))
    pipe = client.pipeline(transaction=False)
    pipe.zcard(deferred_key())
    pipe.zcard(deferred_key("inflight"))
    waiting, releasing = pipe.execute()
    parts = {"ready": sum(queues[name]["ready"] for name in topology.CONSUMED_QUEUES),
             "delayed": delayed, "deferred": int(waiting) + int(releasing)}
    unaccounted = seen - finished - sum(parts.values())
    in_flight = min(reported, unaccounted) if unaccounted >= 0 else reported
    return {**parts, "in_flight": in_flight, "total": sum(parts.values()) + in_flight,
            "in_flight_reported": reported}


def jobs(client: redis.Redis) -> list[dict[str, Any]]:
    """Every job (a deleted one is gone from the registry) with its current run's figures:
    state, run, known, done, failed, pages/s (from the readings earlier calls stored; none
    on a first call, which does not wait for a second reading)."""
    states = JobRegistry(client).states()
    return [p.as_dict() for p in job_progress.measure(client, states)] if states else []


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def proxies(client: redis.Redis) -> list[dict[str, Any]]:
    """Every proxy the fleet has used (common/web/proxies.py's counters): its redacted URL,
    requests served, failures, and the seconds it still rests (0: healthy), busiest first."""
    stats = read_stats(client)
    if not stats:
        return []
    pipe = client.pipeline(transaction=False)
    for proxy_id in stats:
        pipe.pttl(proxy_rest_key(proxy_id))
    rests = pipe.execute()
    rows = [{"proxy": entry["name"], "served": entry["served"], "failed": entry["failed"],
             "resting_s": round(max(rest, 0) / 1000, 1)}
            for entry, rest in zip(stats.values(), rests, strict=True)]
    return sorted(rows, key=lambda row: (-row["served"], row["proxy"]))
