"""Whether per-domain rate limits hold: crawl duration against the limit's bound, and sliding
windows over the limit.

Each domain is a loopback site of :mod:`devtools.testsite` with 200 ms latency and its own
``RATE_LIMITS`` entry; the figures come from each site's own request log. The default case is
issue 31's: 5 sites x 60 URLs at 2/s each, 4 worker processes. The bound is
:func:`bench.figures.min_duration_s` of a site's requests (its 60 pages and its robots.txt):
bursts of ``rate`` one window apart, (ceil(61 / 2) - 1) x 1 s = 30 s, which is also the issue's
ideal of pages / rate = 60 / 2 s.

Alone, without the farm or the other phases (one line of figures per run)::

    .venv/bin/python -m bench.politeness --runs 3 [--rate 2 --domains 5 --urls 60 --workers 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from bench.figures import min_duration_s, percentile, window_excess_s, windows_over_limit
from bench.procstat import Watched, wait_all
from bench.shared import (
    REPO_ROOT,
    Ctx,
    Sizes,
    fleet_env,
    log,
    reset,
    run_producer,
    write_lines,
)
from devtools.services import FleetServices, fleet_services
from devtools.testsite import start_sites

POLITE_FIRST_HOST = "127.0.1.1"
POLITE_LATENCY_S = 0.2
STARTUP_TIMEOUT_S = 60.0


def phase_politeness(ctx: Ctx) -> dict[str, Any]:
    """A per-domain limit on 200 ms-latency sites: duration vs the limit's bound, overruns."""
    return measure_politeness(ctx.services, ctx.sizes, ctx.work)


def measure_politeness(services: FleetServices, sizes: Sizes, work: Path) -> dict[str, Any]:
    """One polite crawl on freshly reset services; the figures of every site's request log."""
    reset(services)
    amount, window_s = sizes.polite_rate, 1.0
    sites = start_sites(sizes.polite_domains, POLITE_FIRST_HOST, pages=sizes.polite_urls,
                        latency_s=POLITE_LATENCY_S, robots_txt="User-agent: *\nAllow: /\n")
    try:
        urls = [site.page_url(n) for n in range(1, sizes.polite_urls + 1) for site in sites]
        overrides = ",".join(f"{site.host}={amount}/second" for site in sites)
        env = fleet_env(services, sizes.concurrency, RATE_LIMITS=overrides)
        bound_s = min_duration_s(sizes.polite_urls + 1, amount, window_s)
        log(f"politeness: {sizes.polite_domains} domains x {sizes.polite_urls} URLs at "
            f"{amount}/s each, latency {POLITE_LATENCY_S * 1000:.0f} ms, "
            f"{sizes.polite_workers} workers x {sizes.concurrency} (bound {bound_s:.1f}s)")
        # The sites run in this process, and their log is the verdict: it must record
        # arrivals as a remote server would. So, as tests/web/test_politeness.py does, the
        # workers run at nice 10 and this process collects no garbage during the crawl, and
        # the fleet is up before the crawl is submitted (four interpreters starting on two
        # cores delayed the sites' logging of the first requests; starting is no crawl's pace).
        logs = [work / f"polite-worker-{i + 1}.log" for i in range(sizes.polite_workers)]
        workers = [Watched.start(["nice", "-n", "10", sys.executable, "worker.py", "--idle-exit",
                                  str(sizes.idle_s + 2), "--concurrency", str(sizes.concurrency)],
                                 name=f"worker-{i + 1}", env=dict(env, WORKER_ID=f"polite-{i + 1}"),
                                 cwd=REPO_ROOT, log_path=path)
                   for i, path in enumerate(logs)]
        wait_consuming(workers, logs, STARTUP_TIMEOUT_S)
        gc.collect()
        gc.disable()
        try:
            run_producer(env, write_lines(work / "polite-urls.txt", urls))
            wait_all(workers, 60 + 4 * bound_s)
        finally:
            gc.enable()
        client = redis.Redis.from_url(services.redis_url)
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
            excess = window_excess_s(times, amount, window_s)
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
                # How much later than the limit allows each request came after the one
                # ``amount`` before it: where the time over the bound went.
                "excess_ms": {"sum": round(1000 * sum(excess)),
                              "p50": round(1000 * percentile(excess, 50), 1),
                              "p90": round(1000 * percentile(excess, 90), 1),
                              "max": round(1000 * max(excess, default=0.0), 1),
                              "min": round(1000 * min(excess, default=0.0), 1)},
                "arrivals_s": [round(t - times[0], 4) for t in times],
                "gaps_over_0_5_s": sum(1 for gap in gaps if gap > 0.5),
                "requests_per_s_by_second": per_second_counts(times),
            })
    finally:
        for site in sites:
            site.stop()
    complete = all(d["unique_pages"] == sizes.polite_urls for d in domains)
    return {
        "rate": f"{amount}/second per domain",
        "workers": sizes.polite_workers,
        "bound_s": min_duration_s(sizes.polite_urls + 1, amount, window_s),
        "latency_s": POLITE_LATENCY_S,
        "domains": domains,
        "complete": complete,
        "ratio": max(d["ratio"] for d in domains) if complete else math.nan,
        "windows_over": sum(d["windows_over"] for d in domains),
        "counters": counters,
    }


def wait_consuming(workers: Sequence[Watched], logs: Sequence[Path], timeout_s: float) -> None:
    """Until every worker has logged that it consumes (common/work/worker.py).

    Raises:
        RuntimeError: a worker exited first, or the timeout passed.
    """
    deadline = time.monotonic() + timeout_s
    waiting = list(zip(workers, logs, strict=True))
    while waiting:
        for worker, path in list(waiting):
            if worker.proc.poll() is not None:
                raise RuntimeError(f"{worker.name} exited {worker.proc.returncode} before "
                                   f"consuming; see {path}")
            if path.exists() and b" consuming " in path.read_bytes():
                waiting.remove((worker, path))
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not consuming after {timeout_s:.0f}s: "
                               f"{[w.name for w, _p in waiting]}")
        time.sleep(0.1)


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the politeness phase alone ``--runs`` times; one JSON line of figures per run."""
    parser = argparse.ArgumentParser(description="The bench's politeness phase, alone.")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--rate", type=int, default=None, help="requests per second per site")
    parser.add_argument("--domains", type=int, default=None)
    parser.add_argument("--urls", type=int, default=None, help="pages per site")
    parser.add_argument("--workers", type=int, default=None, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="fetches per worker")
    parser.add_argument("--small", action="store_true", help="the CI sizes")
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the workers' logs here (kept) instead of a temporary dir")
    args = parser.parse_args(argv)
    # The full bench's sizes (bench/run.py's options left unset: their defaults).
    unset = dict.fromkeys(("sites", "pages", "producer_urls", "seen_urls", "seen_probe",
                           "backlog", "priority_samples", "polite_domains", "polite_urls",
                           "sink_entries"))
    sizes = Sizes.from_args(argparse.Namespace(
        small=args.small, workers=2, concurrency=args.concurrency, spiders=2,
        peer_concurrency=16, **unset))
    given = {"polite_rate": args.rate, "polite_domains": args.domains,
             "polite_urls": args.urls, "polite_workers": args.workers}
    sizes = dataclasses.replace(sizes, **{k: v for k, v in given.items() if v is not None})
    runs = []
    with fleet_services() as services, tempfile.TemporaryDirectory(prefix="polite-") as tmp:
        for run in range(1, args.runs + 1):
            work = Path(tmp) if args.keep is None else args.keep / f"run-{run}"
            work.mkdir(parents=True, exist_ok=True)
            figures = measure_politeness(services, sizes, work)
            runs.append(figures)
            durations = [d["duration_s"] for d in figures["domains"]]
            print(json.dumps({"run": run, "ratio": round(figures["ratio"], 4),
                              "bound_s": figures["bound_s"],
                              "longest_s": max(durations, default=math.nan),
                              "windows_over": figures["windows_over"],
                              "complete": figures["complete"],
                              "excess_ms": [d["excess_ms"]["sum"] for d in figures["domains"]],
                              "durations_s": durations}), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
