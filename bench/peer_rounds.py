"""The crawl phase's orchestra: the fleet and every peer on the same URLs, in alternating
rounds, and the second peer's round (Crawlee for Python).

Each round is a slice of the farm's URL list; in each, the fleet crawls it, then scrapy-redis
(its shared Redis scheduler, the distributed set-up), then — when asked for — scrapy-redis
with Scrapy's in-memory scheduler (the lightest Scrapy set-up) and Crawlee's ParselCrawler (two
processes, each given half the slice: Crawlee has no shared queue). Load from elsewhere on a
shared machine falls on all alike; each crawler's rounds merge into one figure set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from bench.crawl_rounds import (
    merge_rounds,
    peer_unavailable,
    phase_fleet,
    phase_peer,
    watch_peer,
)
from bench.procstat import Watched
from bench.shared import REPO_ROOT, Ctx, log, reset
from bench.sink_rate import CAPTURE_FILE

CRAWLEE_UA = "crawlee-peer/bench"
#: Peers by phase name: what each runs on a round's URLs.
PEERS: dict[str, Callable[[Ctx, Sequence[str], str], dict[str, Any]]] = {
    "peer": lambda ctx, urls, tag: phase_peer(ctx, urls, tag),
    "peer_memory": lambda ctx, urls, tag: phase_peer(ctx, urls, tag, scheduler="memory"),
    "crawlee": lambda ctx, urls, tag: phase_crawlee(ctx, urls, tag),
}


def phase_crawlee(ctx: Ctx, urls: Sequence[str], tag: str, extract: bool = False
                  ) -> dict[str, Any]:
    """The same URLs, two Crawlee processes each with half of them (default storage)."""
    python = REPO_ROOT / ctx.args.bench_python  # absolute (they run in their own dirs); not
    # resolve(): that would follow the venv's symlink to the base interpreter
    reset(ctx.services)
    halves = [urls[0::2], urls[1::2]]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    homes = [ctx.work / f"crawlee-{tag}-{i + 1}" for i in range(len(halves))]

    def start() -> list[Watched]:
        procs = []
        for i, (home, half) in enumerate(zip(homes, halves, strict=True)):
            home.mkdir()
            (home / "urls.txt").write_text("\n".join(half) + "\n")
            procs.append(Watched.start(
                [str(python), "-m", "bench.crawlee_peer", "--urls", str(home / "urls.txt"),
                 "--concurrency", str(ctx.sizes.peer_concurrency),
                 *(["--extract"] if extract else [])],
                name=f"crawlee-{i + 1}", env=dict(env, CRAWLEE_STORAGE_DIR=str(home / "storage")),
                cwd=home, log_path=ctx.work / f"crawlee-{tag}-{i + 1}.log"))
        return procs

    figures = watch_peer(ctx, urls, tag, CRAWLEE_UA, "crawlee", 120 + len(urls) / 10, start)
    figures["items"] = sum(len(list((home / "storage" / "datasets" / "default").glob("0*.json")))
                           for home in homes)
    return figures


def phase_crawl(ctx: Ctx, wanted: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The fleet and the wanted peers on the same URLs, alternating in rounds."""
    urls = ctx.farm.urls()
    rounds = max(1, ctx.args.rounds if ctx.args.rounds else (1 if ctx.args.small else 4))
    fleet_rounds: list[dict[str, Any]] = []
    peers = [name for name in PEERS if name in wanted]
    skipped = peer_unavailable(ctx)
    by_peer: dict[str, list[dict[str, Any]]] = {name: [] for name in peers}
    for r in range(rounds):
        chunk = urls[r::rounds]
        if "fleet" in wanted:
            # The sinks phase drains the last fleet round's records (the peer flushes Redis).
            capture = ctx.work / CAPTURE_FILE if "sinks" in wanted and r == rounds - 1 else None
            fleet_rounds.append(phase_fleet(ctx, chunk, f"r{r + 1}", capture))
            log(f"fleet round {r + 1}/{rounds}: {fleet_rounds[-1]['pages_per_s']:.0f} pages/s")
        for name in peers if skipped is None else ():
            by_peer[name].append(PEERS[name](ctx, chunk, f"r{r + 1}"))
            log(f"{name} round {r + 1}/{rounds}: {by_peer[name][-1]['pages_per_s']:.0f} pages/s")
    out: dict[str, dict[str, Any]] = {}
    if fleet_rounds:
        out["fleet"] = merge_rounds(fleet_rounds, "worker_cpu_s")
    for name in peers:
        out[name] = (merge_rounds(by_peer[name], "spider_cpu_s") if by_peer[name]
                     else {"skipped": skipped})
    return out
