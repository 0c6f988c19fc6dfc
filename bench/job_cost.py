"""What the job dimension costs a worker per page: CPU and Redis commands, default job vs. a job.

    .venv/bin/python -m bench.job_cost [--pages 3000] [--rounds 3] [--sites 4]

Starts RabbitMQ and Redis (devtools.services) and an nginx farm on loopback (bench/farm.py),
then alternates rounds: the farm's pages seeded without a job (the default job), then the same
pages seeded into a running job's run (no rules, the fleet's settings: only the job dimension
differs). Each round runs one :class:`common.work.worker.Worker` in this process until idle
and reads its CPU (getrusage) and the Redis round trips it made per page (packed sends
counted in this process: a pipeline or a script call is one). The target
(issue 26): the job costs at most 2 % CPU per page and no extra Redis round trip on the hot
path.
"""

from __future__ import annotations

import argparse
import logging
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.farm import Farm, NginxFarm  # noqa: E402
from common.core.config import Settings, load_settings  # noqa: E402
from common.intake.producer import Producer  # noqa: E402
from common.jobs.registry import JobRef, JobRegistry  # noqa: E402
from common.jobs.spec import parse_job  # noqa: E402
from common.work.loop_redis import worker_client  # noqa: E402
from common.work.processor import Processor  # noqa: E402
from common.work.worker import Worker  # noqa: E402
from devtools.services import fleet_services  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000, help="pages a round (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    parser.add_argument("--sites", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    RoundTrips()
    per_site = max(1, args.pages // args.sites)
    rows: dict[str, list[tuple[float, float, float]]] = {"default": [], "job": []}
    with tempfile.TemporaryDirectory(prefix="job-cost-") as tmp:
        farm = Farm.generate(Path(tmp), sites=args.sites, pages=per_site)
        with fleet_services() as services, NginxFarm(farm):
            settings = load_settings({
                "RABBITMQ_URL": services.rabbitmq_url, "REDIS_URL": services.redis_url,
                "IDLE_EXIT_S": "1.0", "LOG_LEVEL": "WARNING", "RATE_LIMIT": "100000/second",
                "CACHE_TTL_S": "0", "FETCH_ALLOW_NETWORKS": "127.0.0.0/8"})
            client = redis.Redis.from_url(services.redis_url)
            urls = [site.page_url(n) for site in farm.sites for n in range(1, per_site + 1)]
            registry = JobRegistry(client)
            for number in range(args.rounds):
                for kind in ("default", "job"):
                    client.flushdb()  # a fresh seen-set: every round fetches every page
                    job = None
                    if kind == "job":
                        registry.submit(parse_job({"name": "bench",
                                                   "seeds": {"urls": urls[:1]}}))
                        job = registry.start_run("bench")
                    row = one_round(settings, client, urls, job)
                    rows[kind].append(row)
                    print(f"round {number + 1} {kind:7}: CPU {row[0]:.0f} us/page, "
                          f"{row[1]:.2f} Redis round trips/page, {row[2]:.0f} pages/s",
                          flush=True)
    cpu = {k: statistics.median(r[0] for r in v) for k, v in rows.items()}
    cmds = {k: statistics.median(r[1] for r in v) for k, v in rows.items()}
    print(f"median CPU per page: default {cpu['default']:.0f} us, job {cpu['job']:.0f} us "
          f"({(cpu['job'] / cpu['default'] - 1) * 100:+.1f} %); Redis round trips per page: "
          f"default {cmds['default']:.2f}, job {cmds['job']:.2f}")
    return 0


class RoundTrips:
    """Counts what this process sends to Redis: one packed send is one round trip (a pipeline
    or a script call is one)."""

    sends = 0

    def __init__(self) -> None:
        original = redis.connection.AbstractConnection.send_packed_command

        def counted(connection, command, check_health=True):  # noqa: ANN001
            RoundTrips.sends += 1
            return original(connection, command, check_health)

        redis.connection.AbstractConnection.send_packed_command = counted


def one_round(settings: Settings, client: redis.Redis, urls: list[str],
              job: JobRef | None) -> tuple[float, float, float]:
    """Seed ``urls`` (into ``job``'s run, if any), run one worker until idle: its CPU per page
    (µs), the Redis round trips per page it made (its heartbeat, releaser and idle polls
    alike in both kinds), pages/s."""
    with Producer(settings, client) as producer:
        producer.submit(urls, job=job) if job is not None else producer.submit(urls)
    worker = Worker(settings, Processor(settings, worker_client(settings)))
    sends = RoundTrips.sends
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    worker.run()
    wall_s = time.perf_counter() - started - settings.idle_exit_s
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = max(1, worker.processed)
    cpu_us = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / n * 1e6
    return cpu_us, (RoundTrips.sends - sends) / n, n / max(wall_s, 1e-9)


if __name__ == "__main__":
    sys.exit(main())
