"""Whether reading the control plane slows the crawl: pages/s and worker CPU per page, quiet vs.
a client polling a job's progress every second and streaming its results.

    .venv/bin/python -m bench.api_load [--pages 3000] [--rounds 3] [--sites 4]

Starts RabbitMQ and Redis (devtools.services), an nginx farm on loopback (bench/farm.py) and
the control plane (``python api.py`` on a free loopback port, its own process), then
alternates rounds on the same pages: ``quiet`` (nobody calls the API), ``progress`` (a client
process, ``python -m bench.api_load --poll``, asks ``GET /api/jobs/{name}/progress`` every
second) and ``polled`` (the same client also tails the run's results every second with
``GET /api/jobs/{name}/results?format=jsonl&after=`` the last id it read). Each round seeds
the farm's pages into a fresh run of a job and runs one :class:`common.work.worker.Worker` in
this process until idle: its CPU (getrusage; this process does nothing else meanwhile), its
pages/s, and the CPU of the API process and of the client (/proc, the client's from its first
answered calls on). The issue's target: the polled rounds within the quiet rounds' noise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.farm import Farm, NginxFarm  # noqa: E402
from bench.procstat import proc_cpu_s  # noqa: E402
from common.api.auth import Tokens  # noqa: E402
from common.core.config import Settings, load_settings  # noqa: E402
from common.intake.producer import Producer  # noqa: E402
from common.jobs.registry import JobRegistry  # noqa: E402
from common.jobs.spec import parse_job  # noqa: E402
from common.ops.servers import pick_port  # noqa: E402
from common.work.loop_redis import worker_client  # noqa: E402
from common.work.processor import Processor  # noqa: E402
from common.work.worker import Worker  # noqa: E402
from devtools.services import fleet_services  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
JOB = "bench"
TOKEN_VARIABLE = "BENCH_API_TOKEN"
POLL_EVERY_S = 1.0
#: Nobody calls; the progress alone every second; the progress and the results tail.
KINDS = ("quiet", "progress", "polled")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000, help="pages a round (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--poll", metavar="URL", help=argparse.SUPPRESS)  # the client process
    parser.add_argument("--no-results", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.poll:
        return poll(args.poll, os.environ[TOKEN_VARIABLE], results=not args.no_results)
    logging.basicConfig(level=logging.WARNING)
    per_site = max(1, args.pages // args.sites)
    rows: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="api-load-") as tmp:
        farm = Farm.generate(Path(tmp), sites=args.sites, pages=per_site)
        with fleet_services() as services, NginxFarm(farm):
            env = {"RABBITMQ_URL": services.rabbitmq_url, "REDIS_URL": services.redis_url,
                   "IDLE_EXIT_S": "1.0", "LOG_LEVEL": "WARNING", "RATE_LIMIT": "100000/second",
                   "CACHE_TTL_S": "0", "FETCH_ALLOW_NETWORKS": "127.0.0.0/8"}
            settings = load_settings(env)
            client = redis.Redis.from_url(services.redis_url)
            urls = [site.page_url(n) for site in farm.sites for n in range(1, per_site + 1)]
            port = pick_port(None)
            api = start_api(env, port, Path(tmp) / "api.log")
            try:
                for number in range(args.rounds):
                    # Rotated each round: no kind always runs first, or after another.
                    for kind in KINDS[number % len(KINDS):] + KINDS[:number % len(KINDS)]:
                        row = one_round(settings, client, urls, api, port, kind)
                        rows[kind].append(row)
                        print(f"round {number + 1} {kind:8}: {row['pages_s']:.0f} pages/s, "
                              f"worker CPU {row['cpu_us']:.0f} us/page, API CPU "
                              f"{row['api_cpu_ms']:.0f} ms, client CPU "
                              f"{row['client_cpu_ms']:.0f} ms, {row['calls']:.0f} calls, "
                              f"{row['records']:.0f} records streamed", flush=True)
            finally:
                api.terminate()
                api.wait(30)
    report(rows)
    return 0


def start_api(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """``python api.py`` on 127.0.0.1:``port``, ready when /api/health answers."""
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "api.py", "--host", "127.0.0.1", "--port",
                                 str(port)], cwd=REPO_ROOT, env={**os.environ, **env},
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                return proc
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the API did not answer /api/health in 60 s")


def one_round(settings: Settings, client: redis.Redis, urls: list[str],
              api: subprocess.Popen[bytes], port: int, kind: str) -> dict[str, float]:
    """Seed ``urls`` into a fresh run of the job, run one worker until idle (with the polling
    client unless ``kind`` is quiet): pages/s, the worker's CPU per page, the API's and the
    client's CPU and what the client did."""
    client.flushdb()  # a fresh seen-set: every round fetches every page
    token = Tokens(client).create("bench", "read")
    registry = JobRegistry(client)
    registry.submit(parse_job({"name": JOB, "seeds": {"urls": urls[:1]}}))
    job = registry.start_run(JOB)
    with Producer(settings, client) as producer:
        producer.submit(urls, job=job)
    poller, client_before = None, 0.0
    if kind != "quiet":
        poller = subprocess.Popen(
            [sys.executable, "-m", "bench.api_load", "--poll", f"http://127.0.0.1:{port}",
             *(["--no-results"] if kind == "progress" else [])],
            cwd=REPO_ROOT, env={**os.environ, TOKEN_VARIABLE: token}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, text=True)
        assert poller.stdout is not None
        ready = poller.stdout.readline()  # after its first calls: its start-up is not measured
        assert ready.strip() == "ready", ready
        client_before = proc_cpu_s(poller.pid) or 0.0
    worker = Worker(settings, Processor(settings, worker_client(settings)))
    api_before = proc_cpu_s(api.pid) or 0.0
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    worker.run()
    wall_s = time.perf_counter() - started - settings.idle_exit_s
    after = resource.getrusage(resource.RUSAGE_SELF)
    api_cpu_s = (proc_cpu_s(api.pid) or 0.0) - api_before
    done = {"calls": 0.0, "records": 0.0, "errors": 0.0, "client_cpu_ms": 0.0}
    if poller is not None:
        client_cpu_s = (proc_cpu_s(poller.pid) or 0.0) - client_before
        poller.send_signal(signal.SIGTERM)
        out, _ = poller.communicate(timeout=30)
        done = {**json.loads(out.strip().splitlines()[-1]), "client_cpu_ms": client_cpu_s * 1e3}
    n = max(1, worker.processed)
    cpu_us = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / n * 1e6
    return {"pages_s": n / max(wall_s, 1e-9), "cpu_us": cpu_us, "api_cpu_ms": api_cpu_s * 1e3,
            **{k: float(v) for k, v in done.items()}}


class _Stop(Exception):
    """SIGTERM in the polling client: print what it did and exit."""


def poll(base: str, token: str, *, results: bool = True) -> int:
    """The client: every second the run's progress, then the results after the last id read;
    "ready" once the first calls are answered; on SIGTERM one JSON line: calls made, records
    read, errors."""

    def stop(_signum: int, _frame: Any) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    headers = {"Authorization": f"Bearer {token}"}
    counts = {"calls": 0, "records": 0, "errors": 0}
    last = None
    first = True
    try:
        while True:
            began = time.monotonic()
            paths = [f"/api/jobs/{JOB}/progress"]
            if results:
                paths.append(f"/api/jobs/{JOB}/results?format=jsonl"
                             + (f"&after={last}" if last else ""))
            for path in paths:
                try:
                    with urllib.request.urlopen(urllib.request.Request(
                            base + path, headers=headers), timeout=30) as answer:
                        body = answer.read()
                except (urllib.error.URLError, OSError):
                    counts["errors"] += 1
                    continue
                counts["calls"] += 1
                if "results" in path:
                    lines = body.splitlines()
                    counts["records"] += len(lines)
                    if lines:
                        last = json.loads(lines[-1])["id"]
            if first:
                print("ready", flush=True)
                first = False
            time.sleep(max(0.0, POLL_EVERY_S - (time.monotonic() - began)))
    except _Stop:
        print(json.dumps(counts), flush=True)
    return 0


def report(rows: dict[str, list[dict[str, float]]]) -> None:
    """Medians of each kind, their ratios to the quiet rounds and the quiet rounds' spread."""
    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[kind])

    quiet_rates = [r["pages_s"] for r in rows["quiet"]]
    spread = (max(quiet_rates) - min(quiet_rates)) / statistics.median(quiet_rates) * 100
    print(f"quiet rounds' pages/s spread (max - min) / median: {spread:.1f} %")
    print("| kind | pages/s | ratio | worker CPU us/page | ratio | API CPU ms/round | "
          "client CPU ms/round | calls | records streamed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in KINDS:
        print(f"| {kind} | {median(kind, 'pages_s'):.0f} | "
              f"{median(kind, 'pages_s') / median('quiet', 'pages_s'):.3f} | "
              f"{median(kind, 'cpu_us'):.0f} | "
              f"{median(kind, 'cpu_us') / median('quiet', 'cpu_us'):.3f} | "
              f"{median(kind, 'api_cpu_ms'):.0f} | {median(kind, 'client_cpu_ms'):.0f} | "
              f"{median(kind, 'calls'):.0f} | {median(kind, 'records'):.0f} |")


if __name__ == "__main__":
    sys.exit(main())
