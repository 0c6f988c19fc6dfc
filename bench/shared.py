"""What every bench phase measures with: its sizes, the run's context, the fleet's
environment, services' CPU, queue depths and py-spy profiles.

Nothing here runs a phase; each phase module (bench/crawl_rounds.py, bench/producer_rate.py,
...) takes a :class:`Ctx` and uses these helpers, and bench/run.py builds the context.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import redis

from bench.farm import Farm, LogLine, NginxFarm
from bench.procstat import Watched, group_cpu_s, proc_cpu_s
from common.core.config import KNOBS
from devtools.services import FleetServices, reset_state

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "bench" / "out"
FLEET_UA = "scrape-fleet/0.1 (bench)"


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
    #: Worker processes of the politeness phase (issue 31's case: 4, each ``concurrency``).
    polite_workers: int
    sink_entries: int
    #: How long a fleet worker or a scrapy-redis spider waits on an empty queue before it
    #: exits (after the round's last page, so no figure counts it): 1 s on a small farm.
    idle_s: int = 3  # the politeness and priority phases wait 2 s more (hold hops)

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
            # Issue 31's polite crawl: 5 sites x 60 URLs at 2/s each, 4 workers (ideal 30 s).
            polite_domains=pick("polite_domains", 5, 2), polite_urls=pick("polite_urls", 60, 15),
            polite_rate=5 if small else 2, polite_workers=2 if small else 4,
            sink_entries=pick("sink_entries", 10_000, 200),
            idle_s=1 if small else 3)


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


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 3) for name in after}


def page_lines(lines: Sequence[LogLine], agent: str) -> list[LogLine]:
    return [line for line in lines if line.user_agent == agent and line.uri.startswith("/p/")]


# -- profiles ---------------------------------------------------------------------------------

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
