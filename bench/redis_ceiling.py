"""One Redis node's ceiling for the fleet's hot path, and the Redis commands a page costs.

    .venv/bin/python -m bench.redis_ceiling [--pages 300] [--clients 3] [--seconds 10]

A fresh local Redis (devtools.services.LocalRedis), then two phases:

1. **Commands per page.** The worker's :class:`~common.work.processor.Processor` (no broker
   needed for a page whose outcome is a result) processes ``--pages`` farm pages
   (bench/farm_pages.py: ~30 KB, ~100 links) served on loopback, with the compose defaults
   (robots obeyed, response cache on). ``INFO commandstats`` before and after gives the
   commands per page, by name, and the requests the server read per page.
2. **Ceiling.** ``--clients`` processes each run the hot path's two scripts back to back,
   as a fetch thread does: ``ADMIT_LUA`` (done? cached? permit) then ``RECORD_LUA`` (result,
   cache value, counters, permit re-timed) with the records and cache values phase 1 left,
   for new URLs over 50 domains. Reported: admit+record pairs (pages) per second, and the
   Redis server's own CPU per page (``INFO cpu``), whose inverse is what one Redis core can
   carry when the clients are elsewhere (on this 2-core machine they compete with it).
   With ``--min-replicas N`` the node gets N replicas and the clients REDIS_MIN_REPLICAS=N:
   each record is pipelined with ``WAIT`` (common/store/results.py), the cost of confirming.

Nothing is compared with a baseline: the figures feed NOTES' capacity section.
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

import redis  # noqa: E402

from bench.farm_pages import Site, page_html, paragraph_pool  # noqa: E402
from common.broker.messages import WorkMessage  # noqa: E402
from common.core.config import Settings, load_settings  # noqa: E402
from common.store.connection import connect_redis  # noqa: E402
from common.store.dedupe import DoneSet  # noqa: E402
from common.store.keys import RESULTS_STREAM, content_key  # noqa: E402
from common.store.marks import Retime  # noqa: E402
from common.store.results import ResultStore  # noqa: E402
from common.web.ratelimit import RateLimiter  # noqa: E402
from devtools.services import LocalRedis  # noqa: E402
from devtools.testsite import TestSite  # noqa: E402

DOMAINS = 50
FARM_PAGES = 2000  # the farm's size the pages link into


def _env(redis_url: str, min_replicas: int = 0) -> dict[str, str]:
    # DEFER_LEAD_S 0: a Redis Cluster's setting (bench/redis_cluster_ceiling.py), idle here.
    return {"REDIS_URL": redis_url, "RATE_LIMIT": "1000000/second", "DEFER_LEAD_S": "0",
            "FETCH_ALLOW_NETWORKS": "127.0.0.0/8", "LOG_LEVEL": "WARNING",
            "REDIS_MIN_REPLICAS": str(min_replicas)}


def commandstats(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in client.info("commandstats").items()}


def server_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def per_page_commands(redis_url: str, pages: int) -> dict[str, Any]:
    """Phase 1: the Processor on ``pages`` farm pages; commands and reads per page."""
    from common.work.processor import Processor  # the worker's room: phase 1 only

    client = redis.Redis.from_url(redis_url)
    with TestSite() as site:
        farm = Site(0, site.host, site.port)
        pool = paragraph_pool()
        for n in range(1, pages + 1):
            body = page_html(farm, n, FARM_PAGES, [farm], pool).encode()
            site.route(f"/p/{n}.html", lambda _r, b=body: (200, {"Content-Type":
                                                                  "text/html; charset=utf-8"}, b))
        processor = Processor(load_settings(_env(redis_url)), client)
        # The first page fetches robots.txt (once per origin, then it is in memory).
        processor.process(WorkMessage(farm.page_url(pages)).to_json(), "url_queue_ttl")
        before, reads = commandstats(client), int(client.info("stats")["total_reads_processed"])
        kinds: dict[str, int] = {}
        for n in range(1, pages):
            outcome = processor.process(WorkMessage(farm.page_url(n)).to_json(), "url_queue_ttl")
            kinds[outcome.kind] = kinds.get(outcome.kind, 0) + 1
        after = commandstats(client)
        reads = int(client.info("stats")["total_reads_processed"]) - reads - 3  # our INFO x3
        processor.close()
    done = pages - 1
    calls = {name: (after[name] - before.get(name, 0)) / done for name in after
             if name != "info" and after[name] != before.get(name, 0)}
    return {"pages": done, "outcomes": kinds, "commands_per_page": calls,
            "total_per_page": round(sum(calls.values()), 2),
            "reads_per_page": round(reads / done, 2)}


def _payloads(client: redis.Redis) -> list[tuple[dict[str, Any], bytes]]:
    """The records and cache values phase 1 left: realistic sizes for phase 2."""
    out = []
    for _id, fields in client.xrange(RESULTS_STREAM, count=200):
        record = json.loads(fields[b"json"])
        out.append((record, client.get(content_key(record["url"])) or b""))
    return out


def _client_loop(redis_url: str, min_replicas: int, index: int, seconds: float,
                 payloads: list, start: Any, counts: Any) -> None:
    """One client process: admit then record, one page after the other, for ``seconds``."""
    settings: Settings = load_settings(_env(redis_url, min_replicas))
    client = connect_redis(settings)  # the fleet's client: with WAIT when min_replicas > 0
    limiter, store = RateLimiter(client, settings), ResultStore(client, 100_000)
    done = DoneSet(client, settings.seen_buckets)
    start.wait()
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        record, cached = payloads[n % len(payloads)]
        domain = f"d{n % DOMAINS}.c{index}.test"
        url = f"http://{domain}/p/{n}.html"
        mark = done.mark_for(url)
        admission = limiter.admit(domain, limiter.rate_for(domain), cache_url=url, done=mark)
        store.record({**record, "url": url}, cache=(cached, 60), counters={"cache_misses": 1},
                     done=mark, retime=Retime(admission.permit, time.time()))
        n += 1
    counts[index] = n


def ceiling(redis_url: str, clients: int, seconds: float,
            min_replicas: int = 0) -> dict[str, Any]:
    """Phase 2: ``clients`` processes on the two scripts; pages/s and Redis CPU per page."""
    client = redis.Redis.from_url(redis_url)
    payloads = _payloads(client)
    record_bytes = sorted(len(json.dumps(r)) for r, _c in payloads)[len(payloads) // 2]
    cache_bytes = sorted(len(c) for _r, c in payloads)[len(payloads) // 2]
    client.config_set("maxmemory", 0)
    context = multiprocessing.get_context("fork")
    start, counts = context.Event(), context.Array("l", clients)
    procs = [context.Process(target=_client_loop, args=(redis_url, min_replicas, i, seconds,
                                                        payloads, start, counts))
             for i in range(clients)]
    for proc in procs:
        proc.start()
    time.sleep(1.0)  # the clients have imported and connected
    cpu_before, t0 = server_cpu_s(client), time.monotonic()
    start.set()
    for proc in procs:
        proc.join()
    elapsed, cpu = time.monotonic() - t0, server_cpu_s(client) - cpu_before
    pages = sum(counts)
    return {"clients": clients, "min_replicas": min_replicas, "seconds": round(elapsed, 1),
            "pages": pages,
            "pages_per_s": round(pages / elapsed), "redis_cpu_s": round(cpu, 2),
            "redis_cpu_us_per_page": round(cpu / pages * 1e6, 1),
            "one_core_pages_per_s": round(pages / cpu) if cpu else None,
            "redis_core_busy": round(cpu / elapsed, 2),
            "record_bytes_median": record_bytes, "cache_value_bytes_median": cache_bytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=300, help="phase 1 pages (default 300)")
    parser.add_argument("--clients", type=int, default=3, help="phase 2 client processes")
    parser.add_argument("--seconds", type=float, default=10.0, help="phase 2 duration")
    parser.add_argument("--min-replicas", type=int, default=0,
                        help="phase 2 with this many replicas and WAIT for them (default 0)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(LocalRedis())
        for _ in range(args.min_replicas):
            stack.enter_context(LocalRedis(replicaof=(server.host, server.port)))
        report = {"per_page": per_page_commands(server.url, args.pages),
                  "ceiling": ceiling(server.url, args.clients, args.seconds, args.min_replicas),
                  "redis_version": redis.Redis.from_url(server.url).info()["redis_version"]}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
