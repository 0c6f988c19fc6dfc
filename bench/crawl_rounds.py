"""The fleet against scrapy-redis on the same URLs, in alternating rounds: pages/s, worker CPU
and peak RSS, Redis round trips and system CPU per page.

The farm's URL list is cut into ``--rounds`` slices; for each slice the fleet (producer.py
seeds, N ``worker.py`` with every feature on drain) and then the peer (the same URLs in a Redis
list, N scrapy-redis spiders from bench/peer_spider.py in the bench venv) crawl it, each on
freshly flushed Redis and freshly declared queues, so load from elsewhere on a shared machine
falls on both alike. Pages/s come from nginx's log; CPU and peak RSS from the kernel (wait4);
Redis round trips are counted in the client (bench/probe) and cross-checked with Redis's own
``total_reads_processed``. After each fleet round the results stream is read back for the
record sizes and its memory per entry (bench/capacity.py), and after the last one, when the
sinks phase runs, copied to a file for it (bench/sink_rate.py). The rounds are merged into one
figure set per crawler.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from bench.capacity import record_summary, stream_figures
from bench.farm import LogLine
from bench.figures import rate_per_s
from bench.procstat import Watched, wait_all
from bench.shared import (
    FLEET_UA,
    REPO_ROOT,
    Ctx,
    cpu_delta,
    fleet_env,
    log,
    page_lines,
    profilers,
    queue_depths,
    redis_url_db,
    reset,
    run_producer,
    services_cpu,
    summarise_profile,
    write_lines,
)
from bench.sink_rate import capture_streams
from common.broker import topology

PROBE_DIR = REPO_ROOT / "bench" / "probe"
PEER_UA = "scrapy-redis-peer/bench"
PEER_KEY = "peer:start_urls"


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far, from INFO commandstats (commands run by scripts included)."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def page_figures(tag: str, urls: Sequence[str], pages: Sequence[LogLine]) -> dict[str, Any]:
    """What every round reports about its pages, fleet or peer, from nginx's log."""
    n = len(pages)
    return {
        "round": tag,
        "urls": len(urls),
        "pages_logged": n,
        "pages_ok": sum(1 for p in pages if p.status == 200),
        "duplicates": n - len({(p.addr, p.uri) for p in pages}),
        "span_s": round(max(p.time_s for p in pages) - min(p.time_s for p in pages), 3),
        "pages_per_s": rate_per_s([p.time_s for p in pages]),
    }


def first_request_s(lines: Sequence[LogLine]) -> float:
    return min(line.time_s - line.request_time_s for line in lines)


def logged_crawl(ctx: Ctx, offset: int, user_agent: str,
                 phase: str) -> tuple[list[LogLine], list[LogLine], float]:
    """nginx's log since ``offset``, its page lines for ``user_agent``, and the time of the
    first page request (crawler CPU is counted from then on: start-up left out)."""
    lines = ctx.server.read_log(offset)
    pages = page_lines(lines, user_agent)
    if not pages:
        raise RuntimeError(f"{phase} phase: nginx logged no page request; see {ctx.work}")
    return lines, pages, first_request_s(pages)


def phase_fleet(ctx: Ctx, urls: Sequence[str], tag: str, capture: Path | None = None,
                extra_env: dict[str, str] | None = None,
                workers: int | None = None) -> dict[str, Any]:
    """Seed ``urls``, then let N workers with every feature on drain them; with ``capture``,
    copy the round's records there afterwards for the sinks phase (bench/sink_rate.py);
    ``extra_env`` adds settings (the extract phase's EXTRACT_RULES, ARCHIVE); ``workers``
    replaces ``--workers`` (the scaling phase)."""
    sizes = ctx.sizes
    reset(ctx.services)
    empty_memory = used_memory(ctx)
    probe_dir = ctx.work / f"probe-fleet-{tag}"
    probe_dir.mkdir()
    env = fleet_env(ctx.services, sizes.concurrency, **(extra_env or {}))
    seeded, seed_s = run_producer(env, write_lines(ctx.work / f"farm-urls-{tag}.txt", urls))
    if seeded["new"] != len(urls):
        raise RuntimeError(f"fleet phase: producer accepted {seeded['new']} of {len(urls)}")
    count = workers or sizes.workers
    log(f"fleet: {len(urls)} URLs seeded in {seed_s:.1f}s; starting {count} workers")

    client = ctx.redis()
    commands_before = command_calls(client)
    stats_before = client.info("stats")
    cpu_before = services_cpu(ctx)
    busy_before, wall_before = machine_busy_s(), time.monotonic()
    offset = ctx.server.log_offset()
    worker_env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [
        str(PROBE_DIR), env.get("PYTHONPATH", "")])), BENCH_PROBE_DIR=str(probe_dir),
        # Shapes parsed for one round trip in 8 at full size; every one on a small farm,
        # where a sample would be too few to say which shapes happen once per page.
        BENCH_PROBE_SAMPLE="8" if len(urls) >= 5000 else "1")
    timeout_s = 120 + len(urls) / 20
    workers = [Watched.start([sys.executable, "worker.py", "--idle-exit", str(sizes.idle_s),
                              "--concurrency", str(sizes.concurrency)],
                             name=f"worker-{i + 1}", env=dict(worker_env, WORKER_ID=f"bench-{i + 1}"),
                             cwd=REPO_ROOT, log_path=ctx.work / f"fleet-{tag}-worker-{i + 1}.log")
               for i in range(count)]
    with profilers(ctx, workers, f"fleet-{tag}") as profiles:
        codes = wait_all(workers, timeout_s)
    busy_after, wall_after = machine_busy_s(), time.monotonic()
    stats_after = client.info("stats")
    commands_after = command_calls(client)
    cpu_after = services_cpu(ctx)
    results = int(client.xlen("results"))
    counters = {k.decode(): int(v) for k, v in client.hgetall("stats:counters").items()}
    memory_after = int(client.info("memory")["used_memory"])
    stream = stream_figures(client)
    captured = capture_streams(client, capture, ctx.sizes.sink_entries) if capture else None
    client.close()
    depths = queue_depths(ctx.services, [*topology.WORK_QUEUES, topology.FAILED_QUEUE])

    lines, pages, first = logged_crawl(ctx, offset, FLEET_UA, "fleet")
    worker_cpu_s = sum((w.cpu_s or 0.0) - w.cpu_at(first) for w in workers)
    probes = [json.loads(p.read_text()) for p in probe_dir.glob("*.json")]
    round_trips = sum(probe["round_trips"] for probe in probes)
    shapes: Counter[str] = Counter()
    for probe in probes:
        shapes.update(probe.get("shapes", {}))
    # The second INFO is itself one read and one command.
    reads = stats_after["total_reads_processed"] - stats_before["total_reads_processed"] - 1
    commands = (stats_after["total_commands_processed"]
                - stats_before["total_commands_processed"] - 1)
    system = cpu_delta(cpu_before, cpu_after)
    system["workers"] = round(sum(w.cpu_s or 0.0 for w in workers), 3)
    n = len(pages)
    return {
        **page_figures(tag, urls, pages),
        "robots_requests": sum(1 for line in lines if line.uri == "/robots.txt"
                               and line.user_agent == FLEET_UA),
        "results": results,
        "captured_for_sinks": captured,
        "counters": counters,
        **stream,
        # Everything the round left in Redis (results, seen and done sets of a small farm,
        # live cache entries, robots, counters) per page: a cross-check of the rows.
        "used_memory_per_page": (memory_after - empty_memory) / max(1, results),
        "queues_after": depths,
        "exit_codes": codes,
        "worker_cpu_s": round(worker_cpu_s, 3),
        "worker_cpu_startup_s": [round(w.cpu_at(first), 3) for w in workers],
        "cpu_ms_per_page": 1000 * worker_cpu_s / n,
        "worker_maxrss_mb": [round((w.maxrss_kb or 0) / 1024, 1) for w in workers],
        "rss_mb": max((w.maxrss_kb or 0) for w in workers) / 1024,
        "round_trips": round_trips,
        "round_trips_per_page": round_trips / n if round_trips else math.nan,
        "round_trip_shapes_per_page": {shape: round(count / n, 4)
                                       for shape, count in shapes.most_common(12)},
        "redis_calls_per_page": {name: round((calls - commands_before.get(name, 0)) / n, 4)
                                 for name, calls in sorted(commands_after.items(),
                                                           key=lambda kv: -kv[1])
                                 if calls - commands_before.get(name, 0) > 0},
        "redis_reads": reads,
        "redis_reads_per_page": reads / n,
        "redis_commands_per_page": commands / n,
        "system_cpu_s": system,
        "system_cpu_ms_per_page": 1000 * sum(system.values()) / n,
        "other_cpu_cores": other_cores(busy_after - busy_before, sum(system.values()),
                                       wall_after - wall_before),
        "profile_files": [str(p) for p in profiles],
    }


def peer_unavailable(ctx: Ctx) -> str | None:
    """Why the peer cannot run, or None."""
    if ctx.args.skip_peer:
        return "--skip-peer"
    if not Path(ctx.args.bench_python).exists():
        return f"{ctx.args.bench_python} missing: bench/run.sh builds the bench venv"
    return None


def phase_peer(ctx: Ctx, urls: Sequence[str], tag: str, extract: bool = False,
               scheduler: str | None = None) -> dict[str, Any]:
    """The same URLs, N scrapy-redis spider processes (``extract``: with the extract phase's
    fields, bench/peer_spider.py's ``--extract``; ``scheduler``: redis or memory, default
    ``--peer-scheduler``)."""
    scheduler = scheduler or ctx.args.peer_scheduler
    sizes = ctx.sizes
    python = Path(ctx.args.bench_python)
    reset(ctx.services)
    peer_url = redis_url_db(ctx.services.redis_url, 1)
    client = redis.Redis.from_url(peer_url)
    for start in range(0, len(urls), 10_000):
        client.rpush(PEER_KEY, *urls[start:start + 10_000])
    log(f"peer: {len(urls)} URLs in {PEER_KEY}; starting {sizes.spiders} scrapy-redis spiders")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    figures = watch_peer(ctx, urls, tag, PEER_UA, "peer", 120 + len(urls) / 10, lambda: [
        Watched.start([str(python), "-m", "bench.peer_spider", "--redis-url", peer_url,
                       "--key", PEER_KEY, "--concurrency", str(sizes.peer_concurrency),
                       "--idle-close-s", str(sizes.idle_s), "--scheduler", scheduler,
                       *(["--extract"] if extract else [])],
                      name=f"spider-{i + 1}", env=env, cwd=REPO_ROOT,
                      log_path=ctx.work / f"peer-{scheduler}-{tag}-spider-{i + 1}.log")
        for i in range(sizes.spiders)])
    figures.update(scheduler=scheduler, items=int(client.llen("peer:items")),
                   left_in_list=int(client.llen(PEER_KEY)))
    client.close()
    return figures


def watch_peer(ctx: Ctx, urls: Sequence[str], tag: str, user_agent: str, phase: str,
               timeout_s: float, start: Callable[[], list[Watched]]) -> dict[str, Any]:
    """Start a peer's processes, wait for them, and its figures: pages from nginx's log (its
    User-Agent), CPU and peak RSS from the kernel, counted from its first page request."""
    cpu_before = services_cpu(ctx, rabbitmq=False)
    busy_before, wall_before = machine_busy_s(), time.monotonic()
    offset = ctx.server.log_offset()
    procs = start()
    with profilers(ctx, procs, f"{phase}-{tag}") as profiles:
        codes = wait_all(procs, timeout_s)
    busy_after, wall_after = machine_busy_s(), time.monotonic()
    cpu_after = services_cpu(ctx, rabbitmq=False)
    _lines, pages, first = logged_crawl(ctx, offset, user_agent, phase)
    cpu_s = sum((p.cpu_s or 0.0) - p.cpu_at(first) for p in procs)
    system = cpu_delta(cpu_before, cpu_after)
    system["spiders"] = round(sum(p.cpu_s or 0.0 for p in procs), 3)
    n = len(pages)
    return {
        **page_figures(tag, urls, pages),
        "exit_codes": codes,
        "spider_cpu_s": round(cpu_s, 3),
        "cpu_ms_per_page": 1000 * cpu_s / n,
        "spider_maxrss_mb": [round((p.maxrss_kb or 0) / 1024, 1) for p in procs],
        "system_cpu_s": system,
        "system_cpu_ms_per_page": 1000 * sum(system.values()) / n,
        "other_cpu_cores": other_cores(busy_after - busy_before, sum(system.values()),
                                       wall_after - wall_before),
        "profile_files": [str(p) for p in profiles],
    }


def merge_rounds(rounds: Sequence[dict[str, Any]], cpu_key: str) -> dict[str, Any]:
    """One figure set from several rounds: sums over sums (pages over seconds, CPU over pages)."""
    n = sum(r["pages_logged"] for r in rounds)
    span = sum(r["span_s"] for r in rounds)
    system = sum(sum(r["system_cpu_s"].values()) for r in rounds)
    merged: dict[str, Any] = {
        "pages_logged": n,
        "span_s": round(span, 3),
        "pages_per_s": n / span if span else math.nan,
        "cpu_ms_per_page": 1000 * sum(r[cpu_key] for r in rounds) / n,
        "system_cpu_ms_per_page": 1000 * system / n,
        "other_cpu_cores": [r["other_cpu_cores"] for r in rounds],
        "rounds": [{k: v for k, v in r.items() if k not in ("profile_files", "record_sizes")}
                   for r in rounds],
    }
    if "record_sizes" in rounds[0]:
        merged.update(record_summary([size for r in rounds for size in r["record_sizes"]]))
        entries = sum(r["stream_entries"] for r in rounds)
        merged["stream_bytes_per_record"] = (sum(r["stream_bytes"] for r in rounds) / entries
                                             if entries else None)
        cache = [r["cache_bytes_per_entry"] for r in rounds if r["cache_bytes_per_entry"]]
        merged["cache_bytes_per_entry"] = sum(cache) / len(cache) if cache else None
    if "rss_mb" in rounds[0]:
        merged["rss_mb"] = max(r["rss_mb"] for r in rounds)
        trips = sum(r["round_trips"] for r in rounds)
        merged["round_trips_per_page"] = trips / n if trips else math.nan
        merged["redis_reads_per_page"] = sum(r["redis_reads"] for r in rounds) / n
        shapes: Counter[str] = Counter()
        for r in rounds:
            for shape, per_page in r["round_trip_shapes_per_page"].items():
                shapes[shape] += per_page * r["pages_logged"]
        merged["round_trip_shapes_per_page"] = {k: round(v / n, 4)
                                                for k, v in shapes.most_common(12)}
        # The hot path: round-trip shapes that happen for (nearly) every page. The rest are
        # once per process or per domain (connection hand-shakes, heartbeats, robots.txt).
        merged["hot_round_trips_per_page"] = sum(
            v / n for v in shapes.values() if v / n >= 0.5)
    profiles = [Path(p) for r in rounds for p in r.get("profile_files", [])]
    merged["profile"] = summarise_profile(profiles) if profiles else None
    return merged


def used_memory(ctx: Ctx) -> int:
    client = ctx.redis()
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def other_cores(busy_s: float, ours_s: float, wall_s: float) -> float:
    """Average cores used by processes other than the measured ones during a phase."""
    return round(max(0.0, busy_s - ours_s) / wall_s, 2) if wall_s > 0 else math.nan
