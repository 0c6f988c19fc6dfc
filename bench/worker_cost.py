"""What one worker process costs per page, user and kernel time apart, with context switches.

    .venv/bin/python -m bench.worker_cost [--pages 4000] [--sites 4] [--concurrency 8]
                                          [--env KEY=VALUE ...]

Starts RabbitMQ and Redis (devtools.services), an nginx farm on loopback (bench/farm.py),
seeds the farm's URLs and runs one :class:`common.work.worker.Worker` in this process until it is
idle, then prints per page: CPU (user + system), voluntary and involuntary context switches,
page faults and the wall time. In-process, so `getrusage` sees only the worker (RabbitMQ, Redis
and nginx are child processes and are not counted). The full bench (bench/run.sh) compares the fleet
with scrapy-redis; this is the quick loop for the worker's own cost (NOTES #26), where kernel
time and context switches show GIL trading between threads.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.farm import Farm, NginxFarm  # noqa: E402
from common.core.config import Settings, load_settings  # noqa: E402
from common.intake.producer import Producer  # noqa: E402
from common.work.loop_redis import worker_client  # noqa: E402
from common.work.processor import Processor  # noqa: E402
from common.work.worker import Worker  # noqa: E402
from devtools.services import fleet_services  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=4000, help="pages in all (default 4000)")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8, help="WORKER_CONCURRENCY")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="more fleet settings, e.g. FETCH_LOOPS=2")
    args = parser.parse_args(argv)
    extra = dict(pair.split("=", 1) for pair in args.env)
    logging.basicConfig(level=logging.WARNING)
    per_site = max(1, args.pages // args.sites)
    with tempfile.TemporaryDirectory(prefix="worker-cost-") as tmp:
        farm = Farm.generate(Path(tmp), sites=args.sites, pages=per_site)
        with fleet_services() as services, NginxFarm(farm):
            settings = load_settings({
                "RABBITMQ_URL": services.rabbitmq_url, "REDIS_URL": services.redis_url,
                "IDLE_EXIT_S": "1.0", "WORKER_CONCURRENCY": str(args.concurrency),
                "LOG_LEVEL": "WARNING", "RATE_LIMIT": "100000/second",
                "FETCH_ALLOW_NETWORKS": "127.0.0.0/8", **extra})
            client = redis.Redis.from_url(services.redis_url)
            urls = [site.page_url(n) for site in farm.sites for n in range(1, per_site + 1)]
            with ThreadClock() as threads:
                worker, before, after, wall_s = run_one_worker(settings, client, urls, threads)
    n = max(1, worker.processed)
    user_us = (after.ru_utime - before.ru_utime) / n * 1e6
    system_us = (after.ru_stime - before.ru_stime) / n * 1e6
    print(f"{worker.processed} messages {worker.outcomes}, concurrency {args.concurrency} "
          f"{' '.join(args.env)}")
    print(f"per page: CPU {user_us + system_us:.0f} us (user {user_us:.0f}, system "
          f"{system_us:.0f}), context switches {(after.ru_nvcsw - before.ru_nvcsw) / n:.1f} "
          f"voluntary {(after.ru_nivcsw - before.ru_nivcsw) / n:.1f} involuntary, page faults "
          f"{(after.ru_minflt - before.ru_minflt) / n:.1f}; "
          f"{n / wall_s:.0f} pages/s")
    by_thread = ", ".join(f"{name} {ticks / TICKS_PER_S / n * 1e6:.0f}"
                          for name, ticks in sorted(threads.items(), key=lambda kv: -kv[1])
                          if ticks)
    print(f"per page by thread (us): {by_thread}")
    return 0


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class ThreadClock(dict):
    """CPU ticks (user + system) per thread name while it is entered: /proc/self/task read
    every 0.2 s, so a thread that ends keeps its last reading. Threads of one name add up."""

    def __enter__(self) -> ThreadClock:
        self._last: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-clock", daemon=True)
        return self

    def begin(self) -> None:
        """Start counting (after the seeding, which the main thread does)."""
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for name, ticks in self._last.values():
            self[name] = self.get(name, 0) + ticks

    def _run(self) -> None:
        start = self._read()
        while not self._stop.wait(0.2):
            for tid, (name, ticks) in self._read().items():
                self._last[tid] = (name, ticks - start.get(tid, (name, 0))[1])

    @staticmethod
    def _read() -> dict[int, tuple[str, int]]:
        names = {thread.native_id: thread.name for thread in threading.enumerate()}
        found = {}
        for task in Path("/proc/self/task").iterdir():
            try:
                fields = (task / "stat").read_text().rpartition(")")[2].split()
            except FileNotFoundError:
                continue  # the thread ended between the listing and the read
            tid = int(task.name)
            name = re.sub(r"[-_]?\d+$", "", names.get(tid, "native"))
            found[tid] = (name, int(fields[11]) + int(fields[12]))
        return found


def run_one_worker(settings: Settings, client: redis.Redis, urls: list[str],
                   clock: ThreadClock | None = None) -> tuple[Worker, Any, Any, float]:
    """Seed ``urls``, run one worker in this process until it idles out: the worker, this
    process's rusage before and after, and the wall time without the idle wait. ``clock``
    starts counting threads' CPU once the URLs are seeded."""
    with Producer(settings, client) as producer:
        producer.submit(urls)
    worker = Worker(settings, Processor(settings, worker_client(settings)))
    if clock is not None:
        clock.begin()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    worker.run()
    wall_s = time.perf_counter() - started - settings.idle_exit_s
    return worker, before, resource.getrusage(resource.RUSAGE_SELF), wall_s


if __name__ == "__main__":
    sys.exit(main())
