"""Redis Cluster's CPU per page, per primary, for the fleet's hot path (issue 31).

    .venv/bin/python -m bench.redis_cluster_ceiling [--clients 3] [--seconds 10] [--min-replicas 0]
        [--primaries 3]

As bench/redis_ceiling.py's phase 2, on a loopback Redis Cluster of 3 (``--primaries``)
primaries with a replica each (devtools/services/redis_cluster.py): ``--clients`` processes run the worker's two hot-path
scripts back to back (``ADMIT_LUA`` then ``RECORD_LUA``, through the fleet's own cluster client,
keys tagged per domain shard) for new URLs over 50 domains, with the records and cache values
a single-node phase 1 left (bench/redis_ceiling.py). Reported: pages/s, each primary's CPU
(``INFO cpu``, user + sys) per page and its share of the pages, the cluster's CPU per page,
and the same run against one single-node Redis for comparison. The per-primary figure, with the
shards spread evenly, is what the capacity estimate of docs/design-redis-cluster.md builds on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redis_ceiling import (  # noqa: E402
    _client_loop,
    _payloads,
    ceiling,
    per_page_commands,
)
from devtools.services import LocalRedis  # noqa: E402
from devtools.services.redis_cluster import RedisClusterGroup  # noqa: E402


def cluster_ceiling(cluster: RedisClusterGroup, payloads: list, clients: int, seconds: float,
                    min_replicas: int) -> dict[str, Any]:
    context = multiprocessing.get_context("fork")
    start, counts = context.Event(), context.Array("l", clients)
    procs = [context.Process(target=_client_loop, args=(cluster.url, min_replicas, i, seconds,
                                                        payloads, start, counts))
             for i in range(clients)]
    idle_before, t_idle = cluster.cpu_s(), time.monotonic()
    time.sleep(seconds)  # the cluster's own idle cost (cron, cluster bus, replication pings)
    idle_s = sum(cluster.cpu_s().values()) - sum(idle_before.values())
    idle_per_s = idle_s / (time.monotonic() - t_idle)
    for proc in procs:
        proc.start()
    time.sleep(1.5)  # the clients have imported and connected
    before, t0 = cluster.cpu_s(), time.monotonic()
    start.set()
    for proc in procs:
        proc.join()
    elapsed, after = time.monotonic() - t0, cluster.cpu_s()
    pages = sum(counts)
    used = {f"{h}:{p}": after[(h, p)] - before[(h, p)] for h, p in after}
    total = sum(used.values())
    return {"clients": clients, "min_replicas": min_replicas, "seconds": round(elapsed, 1),
            "pages": pages, "pages_per_s": round(pages / elapsed),
            "cpu_us_per_page_by_primary": {k: round(v / pages * 1e6, 1) for k, v in used.items()},
            "cluster_cpu_us_per_page": round(total / pages * 1e6, 1),
            "idle_cpu_per_s": round(idle_per_s, 4),
            "cluster_cpu_us_per_page_less_idle": round((total - idle_per_s * elapsed)
                                                       / pages * 1e6, 1),
            "busiest_primary_share": round(max(used.values()) / total, 2) if total else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3, help="client processes")
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's duration")
    parser.add_argument("--primaries", type=int, default=3, help="cluster primaries (3)")
    parser.add_argument("--min-replicas", type=int, default=0,
                        help="REDIS_MIN_REPLICAS of the clients (0 or 1: one replica each)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        single = stack.enter_context(LocalRedis())
        commands = per_page_commands(single.url, 100)
        import redis

        payloads = _payloads(redis.Redis.from_url(single.url))
        baseline = ceiling(single.url, args.clients, args.seconds)
        cluster = stack.enter_context(RedisClusterGroup(primaries=args.primaries))
        report = {"single_node": baseline, "commands_per_page": commands.get("commands_per_page"),
                  "cluster": cluster_ceiling(cluster, payloads, args.clients, args.seconds,
                                             args.min_replicas)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
