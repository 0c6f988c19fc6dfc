"""The fleet benchmark: one run, every figure, a small table.

    bash bench/run.sh [--small] [--skip-peer] [--json FILE] [--profile]     # the one command
    .venv/bin/python -m bench.run [...]                                      # once installed

Everything it talks to is on 127.0.0.0/8: RabbitMQ and Redis from
:func:`devtools.services.fleet_services`, a farm of static sites served by nginx on
127.0.0.2..N (:mod:`bench.farm`), and for the politeness phase the loopback test site of
:mod:`devtools.testsite`. Every loop is bounded in count and time.

This module parses the arguments, starts the services and runs the phases in order, each on
freshly flushed Redis and freshly declared queues; each phase lives in its own module:

1. fleet      bench/crawl_rounds.py: producer.py seeds the URLs, then N ``worker.py``
              processes with every feature on drain them; pages/s, worker CPU and peak RSS,
              Redis round trips per page, result record sizes and the stream's memory per
              record (bench/capacity.py). Fleet and peer alternate over ``--rounds`` slices
              of the farm's URL list, so both meet the same background load.
2. peers      bench/peer_rounds.py: the same URLs, alternating with the fleet: ``peer``, N
              scrapy-redis spider processes (bench/peer_spider.py, bench venv; its shared
              Redis scheduler); ``peer_memory``, the same with Scrapy's in-memory scheduler;
              ``crawlee``, two Crawlee ParselCrawler processes (bench/crawlee_peer.py) each
              given half the URLs; pages/s and the ratios.
3. sinks      bench/sink_rate.py: the last fleet round's records (copied after that round),
              drained end to end by ``sink.py files`` and ``sink.py postgres`` (a PostgreSQL
              the phase starts), each a fresh sink retired afterwards; rows/s, and rows/s per
              fleet page/s. Needs the fleet phase.
4. extract    bench/extract_rounds.py: on a quarter of the farm, alternating rounds of the
              plain fleet, the fleet with extraction rules (five fields, one list), the fleet
              with ARCHIVE=warc, and scrapy-redis extracting the same fields; each against
              plain, rules against the peer, and the two crawlers' data compared.
   It also runs the plain fleet at LOG_LEVEL=WARNING: the cost of the default INFO.
5. scaling    bench/scaling.py: 1, 2 and 4 workers; pages/s, worker, RabbitMQ and Redis CPU
              per page.
6. producer   bench/producer_rate.py: ``producer.py -f`` with fresh URLs, new URLs per second.
7. seen       bench/seen_memory.py: Redis bytes per seen URL, and exactness.
8. priority   bench/priority_wait.py: publish-to-fetch time of priority URLs behind a backlog.
9. politeness bench/politeness.py: per-domain limits, duration against the limit's bound.

Before and after the phases, bench/machine_speed.py times a reference parse; bench/report.py
turns the results into the table (stdout) and ``bench/out/bench-<time>.json`` (and --json);
bench/shared.py holds the plumbing they share.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # `python bench/run.py` as well as `python -m bench.run`
    sys.path.insert(0, _ROOT)

from bench.extract_rounds import phase_extract  # noqa: E402
from bench.farm import Farm, NginxFarm  # noqa: E402
from bench.machine_speed import reference_parse_us  # noqa: E402
from bench.peer_rounds import PEERS, phase_crawl  # noqa: E402
from bench.politeness import phase_politeness  # noqa: E402
from bench.priority_wait import phase_priority  # noqa: E402
from bench.producer_rate import phase_producer  # noqa: E402
from bench.report import FIGURES, write_report  # noqa: E402
from bench.scaling import phase_scaling  # noqa: E402
from bench.seen_memory import phase_seen  # noqa: E402
from bench.shared import FLEET_ENV_OVERRIDES, OUT_DIR, REPO_ROOT, Ctx, Sizes, log  # noqa: E402
from bench.sink_rate import phase_sinks  # noqa: E402
from devtools.services import fleet_services  # noqa: E402

__all__ = ["FIGURES", "main", "parse_args"]

DEFAULT_BENCH_PYTHON = REPO_ROOT / "bench" / ".venv" / "bin" / "python"


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
    parser.add_argument("--phases", default="fleet,peer,peer_memory,crawlee,sinks,extract,"
                        "scaling,producer,seen,priority,politeness",
                        help="comma-separated subset to run (fleet and peer first, the rest in "
                             "the order given; sinks needs fleet)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, farm)")
    parser.add_argument("--fleet-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for every fleet process (repeatable), e.g. "
                             "PREFETCH=64; recorded in the JSON")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternate fleet and peer this many times, each on a slice of the "
                             "URL list (default 4; 1 with --small; NOTES #20)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent fetches per worker")
    parser.add_argument("--spiders", type=int, default=2)
    parser.add_argument("--peer-concurrency", type=int, default=16,
                        help="CONCURRENT_REQUESTS per spider (Scrapy's default)")
    parser.add_argument("--peer-scheduler", choices=("redis", "memory"), default="redis",
                        help="scrapy-redis's shared Redis scheduler (its distributed set-up) or "
                             "Scrapy's in-process one")
    for name in ("sites", "pages", "producer-urls", "seen-urls", "seen-probe", "backlog",
                 "priority-samples", "polite-domains", "polite-urls", "sink-entries"):
        parser.add_argument(f"--{name}", type=int, default=None)
    return parser.parse_args(argv)


def compile_sources() -> None:
    """Compile the fleet's modules to bytecode, as the image does at build (Dockerfile): with
    PYTHONDONTWRITEBYTECODE set, as here and in the image, a process never writes it, and each
    worker would compile every module it imports that has none (or a stale one) at its start,
    ~0.1 s of CPU counted in the bench's worker CPU."""
    for path in [REPO_ROOT / "common", REPO_ROOT / "scrape_fleet", *REPO_ROOT.glob("*.py")]:
        ok = (compileall.compile_dir(path, quiet=1) if path.is_dir()
              else compileall.compile_file(path, quiet=1))
        if not ok:
            raise SystemExit(f"bench: could not compile {path}")


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
        # Whatever of the farm's 600 MB is still unwritten goes to disk now, not during the
        # first round (the fleet's); it took 0.4 s on 2026-11-23, so it was not much.
        synced = time.monotonic()
        os.sync()
        log(f"farm: mean page {farm.page_bytes_mean} bytes, written to disk in "
            f"{time.monotonic() - synced:.1f}s; starting nginx, RabbitMQ, Redis")
        reference_us = [reference_parse_us(farm)]
        compile_sources()
        with NginxFarm(farm) as server, fleet_services() as services:
            ctx = Ctx(args, sizes, work, farm, server, services)
            steps: dict[str, Callable[[Ctx], dict[str, Any]]] = {
                "sinks": phase_sinks, "producer": phase_producer, "seen": phase_seen,
                "priority": phase_priority, "politeness": phase_politeness,
                "extract": phase_extract, "scaling": phase_scaling}
            unknown = set(wanted) - set(steps) - {"fleet", *PEERS}
            if unknown:
                raise SystemExit(f"unknown phase(s) {sorted(unknown)}; known: fleet, "
                                 f"{', '.join([*PEERS, *steps])}")
            if {"fleet", *PEERS} & set(wanted):
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
    write_report(args, sizes, phases, farm, stamp, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
