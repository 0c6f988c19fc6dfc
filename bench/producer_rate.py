"""How many new URLs per second ``producer.py -f`` takes in (canonicalise, dedupe, confirmed
persistent publish).

One one-URL run first gives the start-up cost; then the timed run on fresh URLs, with the CPU
of the producer and of RabbitMQ, Redis and nginx around it. With ``--profile`` a second,
profiled run on fresh state follows, so the timed run stays clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from bench.capacity import queue_memory
from bench.procstat import Watched
from bench.shared import (
    REPO_ROOT,
    Ctx,
    cpu_delta,
    find_py_spy,
    fleet_env,
    log,
    queue_depths,
    reset,
    run_producer,
    services_cpu,
    summarise_profile,
    write_lines,
)
from common.broker import topology


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
    # Broker memory per queued URL, when the bench started the broker (rabbitmqctl).
    queue = queue_memory(ctx.services, topology.NORMAL_QUEUE)
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
        "queue_memory": queue,
        "queue_bytes_per_message": (queue["memory"] / queue["messages"]
                                    if queue and queue["messages"] else None),
        "new_per_s": summary["new"] / elapsed_s,
        "new_per_s_excluding_startup": summary["new"] / max(1e-9, elapsed_s - startup_s),
    }
