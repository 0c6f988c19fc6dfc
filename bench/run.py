"""The fleet benchmark: one run, every figure, a small table.

    bash bench/run.sh [--small] [--skip-peer] [--json FILE] [--profile]     # the one command
    .venv/bin/python -m bench.run [...]                                      # once installed

Everything it talks to is on 127.0.0.0/8: RabbitMQ and Redis from
:func:`devtools.services.fleet_services`, a farm of static sites served by nginx on
127.0.0.2..N (:mod:`bench.farm`), and for the politeness phase the loopback test site of
:mod:`devtools.testsite`. Every loop is bounded in count and time.

Phases, each on freshly flushed Redis and freshly declared queues (fleet and peer alternate
over ``--rounds`` slices of the farm's URL list, so both meet the same background load):

1. fleet      producer.py seeds the URLs, then N ``worker.py`` processes with every feature on
              drain them. pages/s from the nginx log; worker CPU and peak RSS from the kernel
              (wait4); Redis round trips counted in the client (bench/probe) and, as a
              cross-check, Redis's own ``total_reads_processed``.
2. peer       the same URLs into a Redis list, N scrapy-redis spider processes
              (bench/peer_spider.py, bench venv). pages/s from the nginx log; the ratio.
3. producer   ``producer.py -f`` with fresh URLs: dedupe + confirmed persistent publishes.
4. seen-set   Redis ``used_memory`` before/after SeenSet.add_many of 1M fingerprints, and a
              check that 100k non-members are all reported absent (exactness).
5. priority   a 10,000-URL backlog being drained; a priority URL published every 0.3 s; the
              time from publish to nginx's log line.
6. politeness a 200 ms-latency site per domain, per-domain RATE_LIMITS, duration against the
              limit's bound and sliding windows over the limit, from the site's request log.

Results: the table on stdout, the details in ``bench/out/bench-<time>.json`` (and --json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # `python bench/run.py` as well as `python -m bench.run`
    sys.path.insert(0, str(REPO_ROOT))

import pika  # noqa: E402
import redis  # noqa: E402

from bench.farm import Farm, LogLine, NginxFarm  # noqa: E402
from bench.figures import (  # noqa: E402
    Row,
    judge,
    min_duration_s,
    percentile,
    rate_per_s,
    render_table,
    windows_over_limit,
)
from bench.procstat import Watched, group_cpu_s, proc_cpu_s, wait_all  # noqa: E402
from common.broker import topology  # noqa: E402
from common.core.config import KNOBS, load_settings  # noqa: E402
from common.core.urls import fingerprint  # noqa: E402
from common.intake.producer import Producer  # noqa: E402
from common.store.dedupe import SeenSet  # noqa: E402
from common.work.parse import parse_html  # noqa: E402
from devtools.services import FleetServices, fleet_services, reset_state  # noqa: E402
from devtools.testsite import start_sites  # noqa: E402

OUT_DIR = REPO_ROOT / "bench" / "out"
PROBE_DIR = REPO_ROOT / "bench" / "probe"
DEFAULT_BENCH_PYTHON = REPO_ROOT / "bench" / ".venv" / "bin" / "python"
FLEET_UA = "scrape-fleet/0.1 (bench)"
PEER_UA = "scrapy-redis-peer/bench"
PEER_KEY = "peer:start_urls"
POLITE_FIRST_HOST = "127.0.1.1"
POLITE_LATENCY_S = 0.2

# Targets from the issue (2-core machine).
TARGET_RATIO = 3.0
TARGET_CPU_MS = 2.5
TARGET_RSS_MB = 80.0
TARGET_ROUND_TRIPS = 2.0
TARGET_PRODUCER_PER_S = 5000.0
TARGET_SEEN_BYTES = 16.0
TARGET_PRIORITY_P95_S = 2.0
TARGET_POLITE_RATIO = 1.05

#: Row labels, in table order; tests/test_bench.py checks every one is printed.
FIGURES: tuple[str, ...] = (
    "fleet pages/s",
    "scrapy-redis pages/s",
    "fleet / scrapy-redis",
    "worker CPU per page",
    "worker peak RSS",
    "Redis round trips per page, hot path",
    "Redis round trips per page, all",
    "Redis reads per page (server)",
    "system CPU per page, fleet",
    "system CPU per page, scrapy-redis",
    "producer new URLs/s",
    "seen-set bytes per URL",
    "seen-set false positives",
    "priority wait p50",
    "priority wait p95",
    "politeness duration / bound",
    "politeness windows over limit",
    "machine speed: reference parse",
)


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Sizes:
    """How big each phase is; ``--small`` shrinks all of them for CI."""

    sites: int
    pages: int
    workers: int
    concurrency: int
    spiders: int
    peer_concurrency: int
    producer_urls: int
    seen_urls: int
    seen_probe: int
    backlog: int
    priority_samples: int
    priority_interval_s: float
    polite_domains: int
    polite_urls: int
    polite_rate: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Sizes:
        small = args.small

        def pick(name: str, full: Any, tiny: Any) -> Any:
            given = getattr(args, name)
            return given if given is not None else (tiny if small else full)

        return cls(
            sites=pick("sites", 10, 2), pages=pick("pages", 2000, 100),
            workers=args.workers, concurrency=args.concurrency, spiders=args.spiders,
            peer_concurrency=args.peer_concurrency,
            producer_urls=pick("producer_urls", 50_000, 5_000),
            seen_urls=pick("seen_urls", 1_000_000, 50_000),
            seen_probe=pick("seen_probe", 100_000, 10_000),
            backlog=pick("backlog", 10_000, 1_500),
            priority_samples=pick("priority_samples", 20, 5), priority_interval_s=0.3,
            polite_domains=pick("polite_domains", 3, 2), polite_urls=pick("polite_urls", 100, 15),
            polite_rate=5)


@dataclass
class Ctx:
    args: argparse.Namespace
    sizes: Sizes
    work: Path
    farm: Farm
    server: NginxFarm
    services: FleetServices

    def redis(self, db: int | None = None) -> redis.Redis:
        return redis.Redis.from_url(redis_url_db(self.services.redis_url, db)
                                    if db is not None else self.services.redis_url)


def redis_url_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


# -- plumbing ---------------------------------------------------------------------------------

def fleet_env(services: FleetServices, concurrency: int, **extra: str) -> dict[str, str]:
    """The environment of every fleet process: every knob reset, then the bench's values."""
    knob_names = {knob.env for knob in KNOBS}
    env = {k: v for k, v in os.environ.items() if k not in knob_names}
    env.update({
        "RABBITMQ_URL": services.rabbitmq_url,
        "REDIS_URL": services.redis_url,
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
        "USER_AGENT": FLEET_UA,
        # Every feature on; the rate limit high enough not to bind.
        "RATE_LIMIT": "100000/second",
        "ROBOTS_ENABLED": "true",
        "CACHE_TTL_S": "60",
        "MAX_RETRIES": "3",
        "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
        "WORKER_CONCURRENCY": str(concurrency),
    })
    env.update(FLEET_ENV_OVERRIDES)
    env.update(extra)
    return env


#: --fleet-env KEY=VALUE pairs: experiments (PREFETCH=64, ...) without editing the bench.
FLEET_ENV_OVERRIDES: dict[str, str] = {}


def reset(services: FleetServices) -> None:
    """Flush every Redis database and re-create the queues empty."""
    reset_state(services.rabbitmq_url, services.redis_url, all_databases=True)


def queue_depths(services: FleetServices, names: Sequence[str]) -> dict[str, int]:
    connection = pika.BlockingConnection(pika.URLParameters(services.rabbitmq_url))
    try:
        channel = connection.channel()
        return {name: channel.queue_declare(queue=name, passive=True).method.message_count
                for name in names}
    finally:
        connection.close()


def run_producer(env: dict[str, str], path: Path, *args: str,
                 timeout_s: float = 600) -> tuple[dict[str, Any], float]:
    """``producer.py --json -f PATH``: its summary and its wall time in seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "producer.py", "--json", *args, "-f", str(path)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"producer.py exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), elapsed


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def services_cpu(ctx: Ctx, *, rabbitmq: bool = True) -> dict[str, float]:
    """CPU seconds so far of nginx, Redis and (optionally) RabbitMQ, when they run here."""
    cpu: dict[str, float] = {}
    if ctx.server.pid is not None:
        cpu["nginx"] = group_cpu_s(ctx.server.pid)
    if ctx.services.redis is not None:
        client = ctx.redis()
        try:
            pid = int(client.info("server")["process_id"])
        finally:
            client.close()
        cpu["redis"] = proc_cpu_s(pid) or 0.0
    rabbit = ctx.services.rabbitmq
    if rabbitmq and rabbit is not None and rabbit.dir is not None:
        try:
            beam = int((rabbit.dir / "pid").read_text().strip())
            cpu["rabbitmq"] = proc_cpu_s(beam) or 0.0
        except (OSError, ValueError):
            pass
    return cpu


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far, from INFO commandstats (commands run by scripts included)."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 3) for name in after}


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


def page_lines(lines: Sequence[LogLine], agent: str) -> list[LogLine]:
    return [line for line in lines if line.user_agent == agent and line.uri.startswith("/p/")]


def first_request_s(lines: Sequence[LogLine]) -> float:
    return min(line.time_s - line.request_time_s for line in lines)


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


@contextmanager
def profilers(ctx: Ctx, children: Sequence[Watched], tag: str) -> Iterator[list[Path]]:
    """With --profile: py-spy attached to each child, sampling only the thread holding the GIL,
    so the profile shows where the process's Python CPU goes, not where threads wait."""
    outputs: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []
    spy = find_py_spy(ctx.args.bench_python) if ctx.args.profile else None
    if ctx.args.profile and spy is None:
        log("--profile: py-spy not found (bench/.venv has it after bench/run.sh); not profiling")
    if spy is not None:
        for child in children:
            out = ctx.work / f"{tag}-{child.name}.folded"
            outputs.append(out)
            procs.append(subprocess.Popen(
                [spy, "record", "--pid", str(child.pid), "--rate", "200", "--gil",
                 "--format", "raw", "--output", str(out)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        yield outputs
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=30)  # py-spy stops when its target exits
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def find_py_spy(bench_python: Path) -> str | None:
    beside = Path(bench_python).parent / "py-spy"
    if beside.is_file():
        return str(beside)
    return shutil.which("py-spy")


def summarise_profile(paths: Sequence[Path], top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [frame for frame in stack.split(";") if frame]
            # The first frame is the thread ("process 123:\"python\""/thread name) with py-spy.
            frames = [f for f in frames if not f.startswith(("process ", "thread "))]
            if not frames:
                continue
            total += count
            own[_short(frames[-1])] += count
            for name in {_short(f) for f in frames}:
                inclusive[name] += count
    if not total:
        return {"samples": 0}
    return {
        "samples": total,
        "self": [(name, round(100 * n / total, 1)) for name, n in own.most_common(top)],
        "inclusive": [(name, round(100 * n / total, 1))
                      for name, n in inclusive.most_common(top * 2)],
    }


def _short(frame: str) -> str:
    """'parse_html (common/work/parse.py:123)' -> 'parse_html (common/work/parse.py)'."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    path = path.replace(str(REPO_ROOT) + "/", "")
    return f"{name} ({path})" if path else name


# -- phases ---------------------------------------------------------------------------------------

def logged_crawl(ctx: Ctx, offset: int, user_agent: str,
                 phase: str) -> tuple[list[LogLine], list[LogLine], float]:
    """nginx's log since ``offset``, its page lines for ``user_agent``, and the time of the
    first page request (crawler CPU is counted from then on: start-up left out)."""
    lines = ctx.server.read_log(offset)
    pages = page_lines(lines, user_agent)
    if not pages:
        raise RuntimeError(f"{phase} phase: nginx logged no page request; see {ctx.work}")
    return lines, pages, first_request_s(pages)


def phase_fleet(ctx: Ctx, urls: Sequence[str], tag: str) -> dict[str, Any]:
    """Seed ``urls``, then let N workers with every feature on drain them."""
    sizes = ctx.sizes
    reset(ctx.services)
    probe_dir = ctx.work / f"probe-fleet-{tag}"
    probe_dir.mkdir()
    env = fleet_env(ctx.services, sizes.concurrency)
    seeded, seed_s = run_producer(env, write_lines(ctx.work / f"farm-urls-{tag}.txt", urls))
    if seeded["new"] != len(urls):
        raise RuntimeError(f"fleet phase: producer accepted {seeded['new']} of {len(urls)}")
    log(f"fleet: {len(urls)} URLs seeded in {seed_s:.1f}s; starting {sizes.workers} workers")

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
    workers = [Watched.start([sys.executable, "worker.py", "--idle-exit", "3",
                              "--concurrency", str(sizes.concurrency)],
                             name=f"worker-{i + 1}", env=dict(worker_env, WORKER_ID=f"bench-{i + 1}"),
                             cwd=REPO_ROOT, log_path=ctx.work / f"fleet-{tag}-worker-{i + 1}.log")
               for i in range(sizes.workers)]
    with profilers(ctx, workers, f"fleet-{tag}") as profiles:
        codes = wait_all(workers, timeout_s)
    busy_after, wall_after = machine_busy_s(), time.monotonic()
    stats_after = client.info("stats")
    commands_after = command_calls(client)
    cpu_after = services_cpu(ctx)
    results = int(client.xlen("results"))
    counters = {k.decode(): int(v) for k, v in client.hgetall("stats:counters").items()}
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
        "counters": counters,
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


def phase_peer(ctx: Ctx, urls: Sequence[str], tag: str) -> dict[str, Any]:
    """The same URLs, N scrapy-redis spider processes."""
    sizes = ctx.sizes
    python = Path(ctx.args.bench_python)
    reset(ctx.services)
    peer_url = redis_url_db(ctx.services.redis_url, 1)
    client = redis.Redis.from_url(peer_url)
    for start in range(0, len(urls), 10_000):
        client.rpush(PEER_KEY, *urls[start:start + 10_000])
    log(f"peer: {len(urls)} URLs in {PEER_KEY}; starting {sizes.spiders} scrapy-redis spiders")
    cpu_before = services_cpu(ctx, rabbitmq=False)
    busy_before, wall_before = machine_busy_s(), time.monotonic()
    offset = ctx.server.log_offset()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    timeout_s = 120 + len(urls) / 10
    spiders = [Watched.start([str(python), "bench/peer_spider.py", "--redis-url", peer_url,
                              "--key", PEER_KEY, "--concurrency", str(sizes.peer_concurrency),
                              "--idle-close-s", "3", "--scheduler", ctx.args.peer_scheduler],
                             name=f"spider-{i + 1}", env=env, cwd=REPO_ROOT,
                             log_path=ctx.work / f"peer-{tag}-spider-{i + 1}.log")
               for i in range(sizes.spiders)]
    with profilers(ctx, spiders, f"peer-{tag}") as profiles:
        codes = wait_all(spiders, timeout_s)
    busy_after, wall_after = machine_busy_s(), time.monotonic()
    cpu_after = services_cpu(ctx, rabbitmq=False)
    items = int(client.llen("peer:items"))
    left = int(client.llen(PEER_KEY))
    client.close()
    lines, pages, first = logged_crawl(ctx, offset, PEER_UA, "peer")
    spider_cpu_s = sum((s.cpu_s or 0.0) - s.cpu_at(first) for s in spiders)
    system = cpu_delta(cpu_before, cpu_after)
    system["spiders"] = round(sum(s.cpu_s or 0.0 for s in spiders), 3)
    n = len(pages)
    return {
        **page_figures(tag, urls, pages),
        "scheduler": ctx.args.peer_scheduler,
        "items": items,
        "left_in_list": left,
        "exit_codes": codes,
        "spider_cpu_s": round(spider_cpu_s, 3),
        "cpu_ms_per_page": 1000 * spider_cpu_s / n,
        "spider_maxrss_mb": [round((s.maxrss_kb or 0) / 1024, 1) for s in spiders],
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
        "rounds": [{k: v for k, v in r.items() if k != "profile_files"} for r in rounds],
    }
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


def phase_crawl(ctx: Ctx, wanted: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The fleet and the peer on the same URLs, alternating in rounds (each round a slice of
    the list), so load from elsewhere on a shared machine falls on both alike."""
    urls = ctx.farm.urls()
    rounds = max(1, ctx.args.rounds if ctx.args.rounds else (1 if ctx.args.small else 2))
    fleet_rounds: list[dict[str, Any]] = []
    peer_rounds: list[dict[str, Any]] = []
    skipped = peer_unavailable(ctx) if "peer" in wanted else "not requested"
    for r in range(rounds):
        chunk = urls[r::rounds]
        if "fleet" in wanted:
            fleet_rounds.append(phase_fleet(ctx, chunk, f"r{r + 1}"))
            log(f"fleet round {r + 1}/{rounds}: {fleet_rounds[-1]['pages_per_s']:.0f} pages/s")
        if skipped is None:
            peer_rounds.append(phase_peer(ctx, chunk, f"r{r + 1}"))
            log(f"peer round {r + 1}/{rounds}: {peer_rounds[-1]['pages_per_s']:.0f} pages/s")
    out: dict[str, dict[str, Any]] = {}
    if fleet_rounds:
        out["fleet"] = merge_rounds(fleet_rounds, "worker_cpu_s")
    if "peer" in wanted:
        out["peer"] = (merge_rounds(peer_rounds, "spider_cpu_s") if peer_rounds
                       else {"skipped": skipped})
    return out


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def other_cores(busy_s: float, ours_s: float, wall_s: float) -> float:
    """Average cores used by processes other than the measured ones during a phase."""
    return round(max(0.0, busy_s - ours_s) / wall_s, 2) if wall_s > 0 else math.nan


def phase_producer(ctx: Ctx) -> dict[str, Any]:
    """``producer.py -f`` with fresh URLs: canonicalise, dedupe, confirmed persistent publish."""
    reset(ctx.services)
    n = ctx.sizes.producer_urls
    sites = ctx.farm.sites
    urls = [f"{sites[i % len(sites)].base_url}/p/{i % ctx.farm.pages + 1}.html?id={i}&src=bench"
            for i in range(n)]
    env = fleet_env(ctx.services, ctx.sizes.concurrency)
    _, startup_s = run_producer(env, write_lines(ctx.work / "producer-one.txt",
                                                 [f"{sites[0].base_url}/p/1.html?warm=1"]))
    seeds = write_lines(ctx.work / "producer-urls.txt", urls)
    cpu_before = services_cpu(ctx)
    output = ctx.work / "producer-run.log"
    started = time.perf_counter()
    child = Watched.start([sys.executable, "producer.py", "--json", "-f", str(seeds)],
                          name="producer", env=env, cwd=REPO_ROOT, log_path=output)
    code = child.wait(600)
    elapsed_s = time.perf_counter() - started
    cpu_after = services_cpu(ctx)
    lines = [ln for ln in output.read_text().splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        raise RuntimeError(f"producer.py exited {code}: {output.read_text()[-2000:]}")
    summary = json.loads(lines[-1])
    cpu = cpu_delta(cpu_before, cpu_after)
    cpu["producer"] = round(child.cpu_s or 0.0, 3)
    depth = queue_depths(ctx.services, [topology.NORMAL_QUEUE])[topology.NORMAL_QUEUE]
    log(f"producer: {summary['new']} new URLs in {elapsed_s:.2f}s (queue depth {depth})")
    profile = None
    spy = find_py_spy(ctx.args.bench_python) if ctx.args.profile else None
    if spy is not None:  # a second, profiled run on fresh state; the timed run stays clean
        reset(ctx.services)
        folded = ctx.work / "producer.folded"
        subprocess.run([spy, "record", "--rate", "200", "--gil", "--format", "raw", "--output",
                        str(folded), "--", sys.executable, "producer.py", "--json", "-f",
                        str(ctx.work / "producer-urls.txt")], cwd=REPO_ROOT, env=env,
                       capture_output=True, timeout=600, check=False)
        profile = summarise_profile([folded])
    return {
        "profile": profile,
        "urls": n,
        "summary": summary,
        "elapsed_s": round(elapsed_s, 3),
        "one_url_run_s": round(startup_s, 3),
        "cpu_s": cpu,
        "producer_cpu_share_of_wall": round((child.cpu_s or 0.0) / elapsed_s, 2),
        "queue_depth": depth,
        "new_per_s": summary["new"] / elapsed_s,
        "new_per_s_excluding_startup": summary["new"] / max(1e-9, elapsed_s - startup_s),
    }


def phase_seen(ctx: Ctx) -> dict[str, Any]:
    """Redis memory per seen URL at ``seen_urls`` fingerprints, and exactness."""
    reset(ctx.services)
    n, probe = ctx.sizes.seen_urls, ctx.sizes.seen_probe
    settings = load_settings(fleet_env(ctx.services, ctx.sizes.concurrency))
    meter = ctx.redis()
    loader = ctx.redis()
    seen = SeenSet(loader, settings.seen_buckets)
    before = int(meter.info("memory")["used_memory"])
    added = 0
    batch = 10_000
    for start in range(0, n, batch):
        fps = [fingerprint(f"http://seen.bench.invalid/u/{i}") for i in range(start,
                                                                             min(n, start + batch))]
        added += sum(seen.add_many(fps))
    loader.close()  # frees the loader's query buffer before the second reading
    time.sleep(0.2)
    after = int(meter.info("memory")["used_memory"])
    keys = int(meter.dbsize())
    checker = SeenSet(meter, settings.seen_buckets)
    false_positives = 0
    missing = 0
    for start in range(0, probe, batch):
        stop = min(probe, start + batch)
        absent = [fingerprint(f"http://seen.bench.invalid/absent/{i}") for i in range(start, stop)]
        false_positives += sum(checker.contains_many(absent))
        step = max(1, n // probe)
        present = [fingerprint(f"http://seen.bench.invalid/u/{i * step}")
                   for i in range(start, stop) if i * step < n]
        missing += sum(1 for hit in checker.contains_many(present) if not hit)
    count = checker.count()
    meter.close()
    log(f"seen-set: {n} URLs, {(after - before) / n:.2f} bytes each, "
        f"{false_positives} false positives in {probe}")
    return {
        "urls": n,
        "added_new": added,
        "count": count,
        "buckets": settings.seen_buckets,
        "keys": keys,
        "used_memory_before": before,
        "used_memory_after": after,
        "bytes_per_url": (after - before) / n,
        "non_members_checked": probe,
        "false_positives": false_positives,
        "members_checked": probe,
        "members_missing": missing,
    }


def phase_priority(ctx: Ctx) -> dict[str, Any]:
    """Priority URLs published while N workers drain a backlog: publish → nginx log line."""
    sizes = ctx.sizes
    reset(ctx.services)
    base = ctx.farm.urls()
    backlog = [f"{base[k % len(base)]}?b={k}" for k in range(sizes.backlog)]
    env = fleet_env(ctx.services, sizes.concurrency)
    run_producer(env, write_lines(ctx.work / "backlog-urls.txt", backlog))
    offset = ctx.server.log_offset()
    workers = [Watched.start([sys.executable, "worker.py", "--idle-exit", "5",
                              "--concurrency", str(sizes.concurrency)],
                             name=f"worker-{i + 1}", env=dict(env, WORKER_ID=f"prio-{i + 1}"),
                             cwd=REPO_ROOT, log_path=ctx.work / f"priority-worker-{i + 1}.log")
               for i in range(sizes.workers)]
    sent: dict[str, float] = {}
    depths: list[int] = []
    try:
        draining = wait_for(lambda: len(page_lines(ctx.server.read_log(offset), FLEET_UA)) >= 20,
                            timeout_s=60)
        if not draining:
            raise RuntimeError("priority phase: the workers fetched nothing within 60 s")
        log(f"priority: backlog of {sizes.backlog} draining; publishing "
            f"{sizes.priority_samples} priority URLs")
        client = ctx.redis()
        settings = load_settings(env)
        with Producer(settings, client) as producer:
            for k in range(sizes.priority_samples):
                url = f"{base[(k * 7) % len(base)]}?prio={k}"
                depths.append(queue_depths(ctx.services, [topology.NORMAL_QUEUE])
                              [topology.NORMAL_QUEUE])
                started = time.time()
                summary = producer.submit([url], force_priority=True)
                if summary.new != 1:
                    raise RuntimeError(f"priority URL {url} not published: {summary.line()}")
                parts = urlsplit(url)
                sent[f"{parts.path}?{parts.query}"] = started
                time.sleep(sizes.priority_interval_s)
        client.close()
        wait_for(lambda: sent.keys() <= {line.uri for line in ctx.server.read_log(offset)},
                 timeout_s=30)
    finally:
        for worker in workers:
            worker.terminate()
        wait_all(workers, 60)
    fetched = {line.uri: line.time_s for line in ctx.server.read_log(offset) if line.uri in sent}
    waits = [fetched[uri] - started for uri, started in sent.items() if uri in fetched]
    missing = len(sent) - len(waits)
    return {
        "backlog": sizes.backlog,
        "samples": len(sent),
        "missing": missing,
        "backlog_depth_first_sample": depths[0] if depths else None,
        "backlog_depth_last_sample": depths[-1] if depths else None,
        "waits_s": [round(w, 4) for w in waits],
        "p50_s": percentile(waits, 50) if not missing else math.nan,
        "p95_s": percentile(waits, 95) if not missing else math.nan,
        "max_s": max(waits) if waits and not missing else math.nan,
    }


def phase_politeness(ctx: Ctx) -> dict[str, Any]:
    """A per-domain limit on 200 ms-latency sites: duration vs the limit's bound, overruns."""
    sizes = ctx.sizes
    reset(ctx.services)
    amount, window_s = sizes.polite_rate, 1.0
    sites = start_sites(sizes.polite_domains, POLITE_FIRST_HOST, pages=sizes.polite_urls,
                        latency_s=POLITE_LATENCY_S, robots_txt="User-agent: *\nAllow: /\n")
    try:
        urls = [site.page_url(n) for n in range(1, sizes.polite_urls + 1) for site in sites]
        overrides = ",".join(f"{site.host}={amount}/second" for site in sites)
        env = fleet_env(ctx.services, sizes.concurrency, RATE_LIMITS=overrides)
        run_producer(env, write_lines(ctx.work / "polite-urls.txt", urls))
        bound_s = min_duration_s(sizes.polite_urls + 1, amount, window_s)
        log(f"politeness: {sizes.polite_domains} domains x {sizes.polite_urls} URLs at "
            f"{amount}/s each, latency {POLITE_LATENCY_S * 1000:.0f} ms (bound {bound_s:.1f}s)")
        workers = [Watched.start([sys.executable, "worker.py", "--idle-exit", "5",
                                  "--concurrency", str(sizes.concurrency)],
                                 name=f"worker-{i + 1}", env=dict(env, WORKER_ID=f"polite-{i + 1}"),
                                 cwd=REPO_ROOT, log_path=ctx.work / f"polite-worker-{i + 1}.log")
                   for i in range(sizes.workers)]
        wait_all(workers, 60 + 4 * bound_s)
        client = ctx.redis()
        counters = {k.decode(): int(v) for k, v in client.hgetall("stats:counters").items()}
        client.close()
        domains = []
        for site in sites:
            records = site.log
            times = sorted(r.monotonic_s for r in records)
            pages = [r for r in records if r.path.startswith("/page/")]
            n = len(times)
            gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
            bound = min_duration_s(n, amount, window_s)
            duration = times[-1] - times[0] if n > 1 else 0.0
            domains.append({
                "host": site.host,
                "requests": n,
                "pages": len(pages),
                "unique_pages": len({r.path for r in pages}),
                "duration_s": round(duration, 3),
                "bound_s": bound,
                "ratio": duration / bound if bound else math.nan,
                "windows_over": windows_over_limit(times, amount, window_s),
                "max_in_window": max_in_window(times, window_s),
                "longest_gap_s": round(max(gaps, default=0.0), 3),
                "gaps_over_0_5_s": sum(1 for gap in gaps if gap > 0.5),
                "requests_per_s_by_second": per_second_counts(times),
            })
    finally:
        for site in sites:
            site.stop()
    complete = all(d["unique_pages"] == sizes.polite_urls for d in domains)
    return {
        "rate": f"{amount}/second per domain",
        "latency_s": POLITE_LATENCY_S,
        "domains": domains,
        "complete": complete,
        "ratio": max(d["ratio"] for d in domains) if complete else math.nan,
        "windows_over": sum(d["windows_over"] for d in domains),
        "counters": counters,
    }


def per_second_counts(times: Sequence[float]) -> list[int]:
    """Requests in each whole second since the first one."""
    if not times:
        return []
    counts = [0] * (int(times[-1] - times[0]) + 1)
    for t in times:
        counts[int(t - times[0])] += 1
    return counts


def max_in_window(times: Sequence[float], window_s: float) -> int:
    best = 0
    end = 0
    for start, t in enumerate(times):
        end = max(end, start)
        while end < len(times) and times[end] < t + window_s:
            end += 1
        best = max(best, end - start)
    return best


# -- the table ----------------------------------------------------------------------------------

def figure_phase(figure: str) -> str:
    """Which phase measures ``figure``."""
    prefixes = (("scrapy-redis", "peer"), ("fleet /", "peer"),
                ("system CPU per page, scrapy", "peer"), ("producer", "producer"),
                ("seen-set", "seen"), ("priority", "priority"), ("politeness", "politeness"),
                ("machine", "machine"))
    for prefix, phase in prefixes:
        if figure.startswith(prefix):
            return phase
    return "fleet"


def reference_parse_us(farm: Farm, calls: int = 300) -> float:
    """CPU microseconds for one ``parse_html`` of a farm page in this process: a fixed piece
    of work that tells how fast the (shared) machine is right now. Every per-page CPU figure
    moves with it; compare runs through it."""
    page = farm.sites[0]
    body = (farm.root / f"site{page.index}" / "p" / "1.html").read_bytes()
    url = page.page_url(1)
    parse_html(body, url, "text/html; charset=utf-8")
    started = time.process_time()
    for _ in range(calls):
        parse_html(body, url, "text/html; charset=utf-8")
    return round((time.process_time() - started) / calls * 1e6, 1)


def build_rows(ctx_sizes: Sizes, phases: dict[str, dict[str, Any]]) -> list[Row]:
    fleet, peer = phases.get("fleet", {}), phases.get("peer", {})
    producer, seen = phases.get("producer", {}), phases.get("seen", {})
    prio, polite = phases.get("priority", {}), phases.get("politeness", {})
    workers, spiders = ctx_sizes.workers, ctx_sizes.spiders
    peer_skipped = "skipped" in peer or not peer
    rows: list[Row] = []

    def add(figure: str, value: float | None, unit: str, target: str, verdict: str,
            digits: int = 2) -> None:
        if value is None and verdict != "skipped":
            verdict = "skipped" if figure_phase(figure) not in phases else "FAIL"
        rows.append(Row(figure, value, unit, target, verdict, digits))

    add("fleet pages/s", fleet.get("pages_per_s"), f"pages/s, {workers} workers", "", "info", 0)
    if peer_skipped:
        add("scrapy-redis pages/s", None, f"pages/s, {spiders} spiders", "", "skipped", 0)
        add("fleet / scrapy-redis", None, "x", f">= {TARGET_RATIO:g}", "skipped")
    else:
        ratio = (fleet["pages_per_s"] / peer["pages_per_s"]
                 if peer.get("pages_per_s") and fleet.get("pages_per_s") else None)
        add("scrapy-redis pages/s", peer.get("pages_per_s"), f"pages/s, {spiders} spiders", "",
            "info", 0)
        add("fleet / scrapy-redis", ratio, "x", f">= {TARGET_RATIO:g}",
            judge(ratio, at_least=TARGET_RATIO))
    cpu = fleet.get("cpu_ms_per_page")
    add("worker CPU per page", cpu, "ms", f"<= {TARGET_CPU_MS:g}", judge(cpu, at_most=TARGET_CPU_MS))
    rss = fleet.get("rss_mb")
    add("worker peak RSS", rss, "MB", f"<= {TARGET_RSS_MB:g}", judge(rss, at_most=TARGET_RSS_MB), 1)
    hot = fleet.get("hot_round_trips_per_page")
    hot = None if hot is None else round(hot, 2)  # per-domain extras (robots) are < 0.01
    add("Redis round trips per page, hot path", hot, "client-counted, per-page shapes",
        f"<= {TARGET_ROUND_TRIPS:g}", judge(hot, at_most=TARGET_ROUND_TRIPS))
    add("Redis round trips per page, all", fleet.get("round_trips_per_page"),
        "incl. connects, heartbeats, robots", "", "info")
    add("Redis reads per page (server)", fleet.get("redis_reads_per_page"),
        "INFO total_reads_processed", "", "info")
    add("system CPU per page, fleet", fleet.get("system_cpu_ms_per_page"),
        "ms (workers+RabbitMQ+Redis+nginx)", "", "info")
    add("system CPU per page, scrapy-redis",
        None if peer_skipped else peer.get("system_cpu_ms_per_page"),
        "ms (spiders+Redis+nginx)", "", "skipped" if peer_skipped else "info")
    rate = producer.get("new_per_s")
    add("producer new URLs/s", rate, f"URLs/s, {producer.get('urls', 0):,} new, confirmed",
        f">= {TARGET_PRODUCER_PER_S:,.0f}", judge(rate, at_least=TARGET_PRODUCER_PER_S), 0)
    per_url = seen.get("bytes_per_url")
    exact = seen.get("false_positives") == 0 and seen.get("members_missing") == 0
    add("seen-set bytes per URL", per_url, f"bytes at {seen.get('urls', 0):,} URLs",
        f"<= {TARGET_SEEN_BYTES:g}", judge(per_url, at_most=TARGET_SEEN_BYTES))
    add("seen-set false positives", seen.get("false_positives"),
        f"of {seen.get('non_members_checked', 0):,} non-members", "0 (exact)",
        "pass" if exact else "FAIL", 0)
    add("priority wait p50", prio.get("p50_s"), f"s, behind {prio.get('backlog', 0):,} URLs",
        "", "info", 3)
    p95 = prio.get("p95_s")
    add("priority wait p95", p95, f"s, {prio.get('samples', 0)} samples",
        f"<= {TARGET_PRIORITY_P95_S:g}", judge(p95, at_most=TARGET_PRIORITY_P95_S), 3)
    ratio_polite = polite.get("ratio")
    add("politeness duration / bound", ratio_polite,
        f"x, {ctx_sizes.polite_rate}/s per domain, 200 ms latency",
        f"<= {TARGET_POLITE_RATIO:g}", judge(ratio_polite, at_most=TARGET_POLITE_RATIO), 3)
    over = polite.get("windows_over")
    add("politeness windows over limit", over, "1 s sliding windows", "0",
        "pass" if over == 0 else "FAIL", 0)
    reference = phases.get("machine", {}).get("reference_parse_us") or []
    add("machine speed: reference parse", sum(reference) / len(reference) if reference else None,
        "us, one farm page, before/after " + "/".join(f"{v:.0f}" for v in reference),
        "", "info", 0)
    return rows


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _clean(value: Any) -> Any:
    """NaN → None, recursively, so the JSON is standard."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark the fleet against scrapy-redis.")
    parser.add_argument("--small", action="store_true",
                        help="tiny sizes for CI (2 sites x 100 pages, 50k seen URLs, ...)")
    parser.add_argument("--skip-peer", action="store_true", help="do not run scrapy-redis")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--profile", action="store_true",
                        help="attach py-spy to workers and spiders; summary in the JSON")
    parser.add_argument("--bench-python", type=Path, default=DEFAULT_BENCH_PYTHON,
                        help="python of the bench venv (scrapy, scrapy-redis)")
    parser.add_argument("--phases", default="fleet,peer,producer,seen,priority,politeness",
                        help="comma-separated subset to run")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, farm)")
    parser.add_argument("--fleet-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for every fleet process (repeatable), e.g. "
                             "PREFETCH=64; recorded in the JSON")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternate fleet and peer this many times, each on a slice of the "
                             "URL list (default 2; 1 with --small)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="fetch threads per worker")
    parser.add_argument("--spiders", type=int, default=2)
    parser.add_argument("--peer-concurrency", type=int, default=16,
                        help="CONCURRENT_REQUESTS per spider (Scrapy's default)")
    parser.add_argument("--peer-scheduler", choices=("redis", "memory"), default="redis",
                        help="scrapy-redis's shared Redis scheduler (its distributed set-up) or "
                             "Scrapy's in-process one")
    for name in ("sites", "pages", "producer-urls", "seen-urls", "seen-probe", "backlog",
                 "priority-samples", "polite-domains", "polite-urls"):
        parser.add_argument(f"--{name}", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes.from_args(args)
    for pair in args.fleet_env:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--fleet-env expects KEY=VALUE, got {pair!r}")
        FLEET_ENV_OVERRIDES[key] = value
    wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    work = Path(tempfile.mkdtemp(prefix=f"bench-{stamp}-"))
    started = time.monotonic()
    phases: dict[str, dict[str, Any]] = {}
    try:
        log(f"generating {sizes.sites} sites x {sizes.pages} pages in {work}")
        farm = Farm.generate(work / "farm", sites=sizes.sites, pages=sizes.pages)
        log(f"farm: mean page {farm.page_bytes_mean} bytes; starting nginx, RabbitMQ, Redis")
        reference_us = [reference_parse_us(farm)]
        with NginxFarm(farm) as server, fleet_services() as services:
            ctx = Ctx(args, sizes, work, farm, server, services)
            steps: dict[str, Callable[[Ctx], dict[str, Any]]] = {
                "producer": phase_producer, "seen": phase_seen, "priority": phase_priority,
                "politeness": phase_politeness}
            unknown = set(wanted) - set(steps) - {"fleet", "peer"}
            if unknown:
                raise SystemExit(f"unknown phase(s) {sorted(unknown)}; known: fleet, peer, "
                                 f"{', '.join(steps)}")
            if {"fleet", "peer"} & set(wanted):
                phase_started = time.monotonic()
                phases.update(phase_crawl(ctx, wanted))
                log(f"fleet and peer: done in {time.monotonic() - phase_started:.1f}s")
            for name in (n for n in wanted if n in steps):
                phase_started = time.monotonic()
                phases[name] = steps[name](ctx)
                phases[name]["phase_s"] = round(time.monotonic() - phase_started, 1)
                log(f"{name}: done in {phases[name]['phase_s']}s")
        reference_us.append(reference_parse_us(farm))
        phases["machine"] = {"reference_parse_us": reference_us}
    finally:
        if args.keep:
            log(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    rows = build_rows(sizes, phases)
    table = render_table(rows)
    elapsed_s = time.monotonic() - started
    report = {
        "started_utc": stamp,
        "elapsed_s": round(elapsed_s, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "sizes": sizes.__dict__,
        "fleet_env_overrides": FLEET_ENV_OVERRIDES,
        "farm": {"sites": sizes.sites, "pages": sizes.pages,
                 "mean_page_bytes": farm.page_bytes_mean},
        "rows": [row.as_dict() for row in rows],
        "phases": phases,
        "table": table,
    }
    text = json.dumps(_clean(report), indent=2, default=_json_default)
    out = OUT_DIR / f"bench-{stamp}.json"
    out.write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    print(f"\n== bench: {sizes.sites} sites x {sizes.pages} pages, {sizes.workers} workers vs "
          f"{sizes.spiders} spiders, {elapsed_s:.0f}s ({out.relative_to(REPO_ROOT)}) ==")
    print(table, flush=True)
    profile = phases.get("fleet", {}).get("profile")
    if profile and profile.get("samples"):
        print("\nworker profile (py-spy, share of samples, self):")
        for name, share in profile["self"][:10]:
            print(f"  {share:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
