"""How long a priority URL waits behind a backlog: from its publish to nginx's log line for it.

A backlog of ``--backlog`` URLs is seeded and N workers start draining it; once they are
fetching, ``--priority-samples`` priority URLs are published one every 0.3 s, and each wait is
read from nginx's log.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from bench.figures import percentile
from bench.procstat import Watched, wait_all
from bench.shared import (
    FLEET_UA,
    REPO_ROOT,
    Ctx,
    fleet_env,
    log,
    page_lines,
    queue_depths,
    reset,
    run_producer,
    write_lines,
)
from common.broker import topology
from common.core.config import load_settings
from common.intake.producer import Producer


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def phase_priority(ctx: Ctx) -> dict[str, Any]:
    """Priority URLs published while N workers drain a backlog: publish → nginx log line."""
    sizes = ctx.sizes
    reset(ctx.services)
    base = ctx.farm.urls()
    backlog = [f"{base[k % len(base)]}?b={k}" for k in range(sizes.backlog)]
    env = fleet_env(ctx.services, sizes.concurrency)
    run_producer(env, write_lines(ctx.work / "backlog-urls.txt", backlog))
    offset = ctx.server.log_offset()
    workers = [Watched.start([sys.executable, "worker.py", "--idle-exit", str(sizes.idle_s + 2),
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
