"""Whether per-domain rate limits hold: crawl duration against the limit's bound, and sliding
windows over the limit.

Each domain is a loopback site of :mod:`devtools.testsite` with 200 ms latency and its own
``RATE_LIMITS`` entry; the figures come from each site's own request log.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from bench.figures import min_duration_s, windows_over_limit
from bench.procstat import Watched, wait_all
from bench.shared import REPO_ROOT, Ctx, fleet_env, log, reset, run_producer, write_lines
from devtools.testsite import start_sites

POLITE_FIRST_HOST = "127.0.1.1"
POLITE_LATENCY_S = 0.2


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
        workers = [Watched.start([sys.executable, "worker.py", "--idle-exit", str(sizes.idle_s + 2),
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
