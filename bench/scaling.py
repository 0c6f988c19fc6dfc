"""The scaling phase: how cost grows with the number of workers on this machine.

On a quarter of the farm per round (all of it with ``--small``), the fleet crawls with 1, 2 and
4 worker processes in turn, two rounds alternating; for each count: pages/s, worker CPU per
page, and RabbitMQ's and Redis's CPU per page (from /proc), so it shows which component
saturates first as workers are added (NOTES, capacity).
"""

from __future__ import annotations

from typing import Any

from bench.crawl_rounds import merge_rounds, phase_fleet
from bench.shared import Ctx, log

WORKER_COUNTS = (1, 2, 4)


def phase_scaling(ctx: Ctx) -> dict[str, Any]:
    urls = ctx.farm.urls()
    rounds = 1 if ctx.args.small else 2
    share = 1 if ctx.args.small else 4
    by_count: dict[int, list[dict[str, Any]]] = {n: [] for n in WORKER_COUNTS}
    for r in range(rounds):
        chunk = urls[r::rounds * share]
        for n in WORKER_COUNTS:
            result = phase_fleet(ctx, chunk, f"s{r + 1}-w{n}", workers=n)
            by_count[n].append(result)
            log(f"scaling round {r + 1}/{rounds}, {n} worker(s): "
                f"{result['pages_per_s']:.0f} pages/s")
    out: dict[str, Any] = {"urls_per_round": len(urls[::rounds * share])}
    for n, results in by_count.items():
        merged = merge_rounds(results, "worker_cpu_s")
        pages = merged["pages_logged"]
        per_service = {name: round(1000 * sum(r["system_cpu_s"].get(name, 0.0)
                                              for r in results) / pages, 3)
                       for name in ("rabbitmq", "redis", "nginx")}
        out[str(n)] = {"pages_per_s": merged["pages_per_s"],
                       "cpu_ms_per_page": merged["cpu_ms_per_page"],
                       "service_cpu_ms_per_page": per_service,
                       "other_cpu_cores": merged["other_cpu_cores"]}
    return out
