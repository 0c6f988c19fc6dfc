"""How full Redis is: memory against ``maxmemory`` and what the result sinks have not exported
yet, read in one round trip (a pipeline of INFO memory, SMEMBERS sinks, XLEN and XINFO GROUPS
of ``results`` and ``failures``).

A sink's backlog is, over both streams, its consumer group's ``lag`` (entries not delivered to
the group yet; Redis >= 7.0) plus its ``pending`` entries (delivered, not acknowledged). When
Redis cannot tell the lag (XDEL inside the unread range) or the sink has no group on a stream
yet, the stream's length stands in: with sinks registered the streams are trimmed only below
what every sink acknowledged, so it is an upper bound. The fleet's backlog is the largest over
the registered sinks. Workers read this every PRESSURE_CHECK_S (common/work/pressure.py), the
status view once per snapshot. On a Redis Cluster: every shard's part of each stream (summed per
stream and per sink), and the memory of the fullest primary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from common.store.keys import ASSETS_STREAM, FAILURES_STREAM, RESULTS_STREAM, SINKS, sink_group
from common.store.slots import cluster, parts, whole

STREAMS = (RESULTS_STREAM, FAILURES_STREAM, ASSETS_STREAM)  # what the sinks read


@dataclass(frozen=True)
class Fill:
    """One reading of Redis's fill."""

    used_memory: int  #: INFO memory ``used_memory``, bytes
    maxmemory: int  #: 0: no limit
    lengths: dict[str, int]  #: XLEN of ``results`` and ``failures``
    sinks: dict[str, int] = field(default_factory=dict)  #: sink name -> unexported entries

    @property
    def memory_ratio(self) -> float | None:
        """``used_memory / maxmemory``; None without a limit."""
        return self.used_memory / self.maxmemory if self.maxmemory else None

    @property
    def backlog(self) -> int:
        """The largest sink backlog (0 without sinks)."""
        return max(self.sinks.values(), default=0)

    @property
    def backlog_sink(self) -> str | None:
        """The sink with the largest backlog (None without sinks)."""
        return max(sorted(self.sinks), key=self.sinks.__getitem__) if self.sinks else None

    def figures(self) -> dict[str, Any]:
        """JSON-ready figures, for heartbeats and the status view."""
        ratio = self.memory_ratio
        return {"used_memory": self.used_memory, "maxmemory": self.maxmemory,
                "memory_ratio": None if ratio is None else round(ratio, 4),
                "backlog": self.backlog, "backlog_sink": self.backlog_sink,
                "sinks": dict(sorted(self.sinks.items())),
                "results_length": self.lengths.get(RESULTS_STREAM, 0)}


def read_fill(client: redis.Redis) -> Fill:
    """One round trip (a non-transactional pipeline).

    Raises:
        redis.RedisError: Redis unreachable, or an error reply other than a missing stream.
    """
    streams = [name for stream in STREAMS for name in parts(stream)]  # a cluster's: per shard
    pipe = client.pipeline(transaction=False)
    if not cluster():
        pipe.info("memory")
    pipe.smembers(SINKS)
    for stream in streams:
        pipe.xlen(stream)
    for stream in streams:
        pipe.xinfo_groups(stream)
    replies = pipe.execute(raise_on_error=False)
    info = replies.pop(0) if not cluster() else _fullest(client)
    names, rest = replies[0], replies[1:]
    lengths_raw, groups_raw = rest[:len(streams)], rest[len(streams):]
    for reply in (info, names, *lengths_raw):
        if isinstance(reply, Exception):
            raise reply
    part_lengths = dict(zip(streams, (int(n) for n in lengths_raw), strict=True))
    groups = {stream: _groups(reply) for stream, reply in zip(streams, groups_raw, strict=True)}
    sinks = {}
    for name in sorted(_text(n) for n in names):
        total = 0
        for stream in streams:
            group = groups[stream].get(sink_group(name))
            if group is None:
                total += part_lengths[stream]  # no group yet: the sink may read everything
                continue
            lag = group.get("lag")
            total += int(group.get("pending") or 0) + (
                part_lengths[stream] if lag is None else int(lag))
        sinks[name] = total
    lengths = dict.fromkeys(STREAMS, 0)
    for stream, length in part_lengths.items():
        lengths[whole(stream)] += length
    return Fill(int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)), lengths, sinks)


def _fullest(client: Any) -> dict[str, Any]:
    """INFO memory of the cluster's primary closest to its maxmemory (the most used without
    limits): the one that refuses writes first."""
    infos = client.info("memory", target_nodes=client.PRIMARIES)
    infos = infos.values() if isinstance(infos, dict) and "used_memory" not in infos else [infos]
    return max(infos, key=lambda i: (int(i.get("used_memory", 0)) / int(i["maxmemory"])
                                     if int(i.get("maxmemory", 0)) else 0.0,
                                     int(i.get("used_memory", 0))))


def _groups(reply: Any) -> dict[str, dict[str, Any]]:
    """XINFO GROUPS by group name; a missing stream (``no such key``) has none."""
    if isinstance(reply, redis.ResponseError) and "no such key" in str(reply).lower():
        return {}
    if isinstance(reply, Exception):
        raise reply
    return {_text(g["name"]): g for g in reply}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
