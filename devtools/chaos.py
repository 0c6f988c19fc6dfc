"""Chaos run: a crawl on local servers while workers are killed and RabbitMQ and Redis restart.

    python -m devtools.chaos [--urls 3000] [--workers 3] [--duration-cap 300]

Starts its own RabbitMQ node and an append-only Redis (never the ones RABBITMQ_URL/REDIS_URL
name: it has to restart them), demo sites on loopback with a small latency, seeds URLs with
producer.py (pages, some 404s, some flaky pages that answer 503 twice, some that always answer
503) and starts N worker processes. As the crawl passes set fractions of the URLs it
``kill -9``s a random worker and starts a replacement (several times), restarts RabbitMQ
(``stop_app``/``start_app``) and kills Redis and starts it again from its AOF. When every work
and hold queue is empty and no delivery is unacked, it stops the workers and prints:

    URLs in, results, dead-lettered, lost (URLs with neither; must be 0),
    duplicates (outcomes beyond one per URL; must be 0), duplicate fetches (site logs).

Exits 0 iff lost == 0 and duplicates == 0. Everything it talks to is on 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import redis

from common.broker import topology
from common.core.urls import canonicalize
from common.ops.dlq import browse
from devtools.services import LocalRabbitMQ, LocalRedis
from devtools.testsite import TestSite, start_sites

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_RETRIES = 3
FLAKY_FAILURES = 2
#: Queues a URL can sit in while it still has work ahead of it (failed_urls is an outcome).
PENDING_QUEUES = frozenset((*topology.WORK_QUEUES, topology.EXPIRED_QUEUE,
                            *(topology.hold_name(level) for level in topology.HOLD_LEVELS_MS)))


def say(message: str) -> None:
    print(message, flush=True)


@dataclass
class Seeds:
    """The seeded URLs (canonical) and how many fetches each should take without faults."""

    urls: list[str]
    expected_fetches: dict[tuple[str, str], int]  # (host:port, request target) -> fetches


def build_seeds(sites: list[TestSite], total: int) -> Seeds:
    """``total`` URLs over ``sites``: mostly pages, 1% 404, 1% flaky, 0.3% always 503."""
    not_found = max(1, total // 100)
    flaky = max(1, total // 100)
    failing = max(1, total // 300)
    pages = total - not_found - flaky - failing
    if pages < 1:
        raise SystemExit("--urls is too small")
    targets: list[tuple[TestSite, str, int]] = []
    for i in range(pages):
        site = sites[i % len(sites)]
        targets.append((site, f"/page/{i // len(sites) + 1}", 1))
    for i in range(not_found):
        targets.append((sites[i % len(sites)], f"/status/404?c={i}", 1))
    for i in range(flaky):
        targets.append((sites[i % len(sites)], f"/flaky/k{i}/{FLAKY_FAILURES}",
                        FLAKY_FAILURES + 1))
    for i in range(failing):
        targets.append((sites[i % len(sites)], f"/status/503?c={i}", MAX_RETRIES + 1))
    random.shuffle(targets)
    urls = [canonicalize(site.url(target)) for site, target, _n in targets]
    # The worker requests the canonical URL, which is what the site logs.
    expected = {(site.netloc, _target_of(url)): n
                for (site, _t, n), url in zip(targets, urls, strict=True)}
    return Seeds(urls, expected)


def _target_of(url: str) -> str:
    rest = url.split("://", 1)[1]
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/"


@dataclass
class Fleet:
    """The worker processes: start, kill -9, replace, stop."""

    env: dict[str, str]
    concurrency: int
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    started: int = 0

    def start(self) -> str:
        self.started += 1
        worker_id = f"chaos-{self.started}"
        log = (self.log_dir / f"{worker_id}.log").open("w")
        self.procs[worker_id] = subprocess.Popen(
            [sys.executable, "worker.py", "--concurrency", str(self.concurrency)],
            cwd=REPO_ROOT, env=dict(self.env, WORKER_ID=worker_id), stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child has its own descriptor
        return worker_id

    def alive(self) -> list[str]:
        return [wid for wid, proc in self.procs.items() if proc.poll() is None]

    def kill_one(self) -> str:
        victim = random.choice(self.alive())
        proc = self.procs[victim]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        return victim

    def stop(self, timeout_s: float = 60.0) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        return {wid: proc.returncode for wid, proc in self.procs.items()}


class Probe:
    """Counts seen from outside, each on a fresh short-timeout connection (services restart)."""

    def __init__(self, broker: LocalRabbitMQ, redis_url: str) -> None:
        self.broker = broker
        self.redis_url = redis_url
        self.last = (0, 0)

    def outcomes(self) -> tuple[int, int]:
        """(results, dead letters) now, or the last known values while a service is away."""
        results, dead = self.last
        try:
            client = redis.Redis.from_url(self.redis_url, socket_timeout=2,
                                          socket_connect_timeout=2)
            try:
                results = int(client.xlen("results"))
            finally:
                client.close()
        except redis.RedisError as exc:
            logger.debug("results not sampled, Redis away: %s", exc)
        try:
            connection = pika.BlockingConnection(self.broker.connection_parameters(
                connection_attempts=1, socket_timeout=2, blocked_connection_timeout=2))
            try:
                dead = connection.channel().queue_declare(
                    topology.FAILED_QUEUE, passive=True).method.message_count
            finally:
                connection.close()
        except pika.exceptions.AMQPError as exc:
            logger.debug("dead letters not sampled, broker away: %s", exc)
        self.last = (results, dead)
        return self.last

    def pending(self) -> tuple[int, int] | None:
        """(ready, unacked) over every work, hold and expired queue; None if unknown."""
        try:
            listing = self.broker.ctl("list_queues", "-q", "--no-table-headers", "name",
                                      "messages_ready", "messages_unacknowledged",
                                      timeout_s=30).stdout
        except RuntimeError:
            return None
        ready = unacked = 0
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] in PENDING_QUEUES:
                ready += int(parts[1])
                unacked += int(parts[2])
        return ready, unacked


def restart_rabbitmq(broker: LocalRabbitMQ) -> str:
    started = time.monotonic()
    broker.stop_app()
    time.sleep(2.0)
    broker.start_app()
    return f"RabbitMQ back after {time.monotonic() - started:.1f}s"


def restart_redis(server: LocalRedis) -> str:
    """kill -9 the server, leave it down a moment, start it again from its AOF."""
    client = redis.Redis.from_url(server.url)
    try:
        pid = int(client.info("server")["process_id"])
    finally:
        client.close()
    started = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.running and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2.0)
    server.start()  # same port and directory: replays the append-only file
    return f"Redis back after {time.monotonic() - started:.1f}s"


@dataclass
class Event:
    at_fraction: float
    name: str
    action: Callable[[], str]


def schedule(args: argparse.Namespace, fleet: Fleet, broker: LocalRabbitMQ,
             server: LocalRedis) -> list[Event]:
    def kill() -> str:
        victim = fleet.kill_one()
        return f"killed {victim} (kill -9), started {fleet.start()}"

    events = [Event(0.22, "restart RabbitMQ", lambda: restart_rabbitmq(broker)),
              Event(0.50, "restart Redis (kill -9, AOF)", lambda: restart_redis(server))]
    for i in range(args.kills):
        at = 0.08 + (0.75 - 0.08) * (i / max(1, args.kills - 1))
        events.append(Event(round(at, 3), "kill -9 a worker", kill))
    return sorted(events, key=lambda e: e.at_fraction)


def crawl(args: argparse.Namespace, seeds: Seeds, fleet: Fleet, probe: Probe,
          events: list[Event], started: float) -> tuple[bool, list[str]]:
    """Run the schedule, then wait until nothing is pending. Returns (drained, event log)."""
    total = len(seeds.urls)
    happened: list[str] = []
    next_report = 0.0
    quiet_checks = 0
    last_outcomes = (-1, -1)
    while True:
        elapsed = time.monotonic() - started
        if elapsed > args.duration_cap:
            say(f"t={elapsed:5.1f}s duration cap reached: stopping")
            return False, happened
        results, dead = probe.outcomes()
        fraction = (results + dead) / total
        if events and fraction >= events[0].at_fraction:
            event = events.pop(0)
            say(f"t={elapsed:5.1f}s at {fraction:4.0%}: {event.name} ...")
            detail = event.action()
            happened.append(f"{event.name} at {fraction:.0%}: {detail}")
            say(f"t={time.monotonic() - started:5.1f}s   {detail}")
            continue
        if elapsed >= next_report:
            say(f"t={elapsed:5.1f}s results={results} dead={dead} ({fraction:.0%}) "
                f"workers={len(fleet.alive())}")
            next_report = elapsed + 5.0
        if not events and (results, dead) == last_outcomes:
            pending = probe.pending()
            quiet_checks = quiet_checks + 1 if pending == (0, 0) else 0
            if quiet_checks >= 2:
                say(f"t={elapsed:5.1f}s queues empty, nothing unacked: crawl over")
                return True, happened
        last_outcomes = (results, dead)
        time.sleep(1.0)


def tally(seeds: Seeds, broker: LocalRabbitMQ, server: LocalRedis,
          sites: list[TestSite]) -> dict[str, Any]:
    client = redis.Redis.from_url(server.url)
    try:
        per_result: Counter[str] = Counter()
        for _id, fields in client.xrange("results"):
            per_result[json.loads(fields[b"json"])["url"]] += 1
    finally:
        client.close()
    connection = pika.BlockingConnection(broker.connection_parameters())
    try:
        letters = browse(connection)
    finally:
        connection.close()
    per_dead = Counter(letter.url for letter in letters)
    reasons = Counter(letter.reason for letter in letters)

    seeded = set(seeds.urls)
    ended = set(per_result) | set(per_dead)
    duplicates = (sum(n - 1 for n in per_result.values()) + sum(n - 1 for n in per_dead.values())
                  + len(set(per_result) & set(per_dead)))
    fetches: Counter[tuple[str, str]] = Counter()
    for site in sites:
        for record in site.log:
            if record.path != "/robots.txt":
                fetches[(site.netloc, record.path)] += 1
    extra_fetches = sum(max(0, n - seeds.expected_fetches.get(key, 0))
                        for key, n in fetches.items())
    return {
        "urls_in": len(seeded),
        "results": sum(per_result.values()),
        "dead_lettered": sum(per_dead.values()),
        "reasons": dict(reasons.most_common()),
        "lost": len(seeded - ended),
        "lost_sample": sorted(seeded - ended)[:5],
        "duplicates": duplicates,
        "duplicate_sample": sorted(u for u in ended if per_result[u] + per_dead[u] > 1)[:5],
        "strays": len(ended - seeded),
        "duplicate_fetches": extra_fetches,
        "never_fetched": sum(1 for key in seeds.expected_fetches if fetches[key] == 0),
    }


def scan_logs(log_dir: Path) -> dict[str, int]:
    """How often the worker logs mention the faults and anything unexpected."""
    marks = {"reconnects": "broker connection lost", "redis_waits": "Redis unavailable",
             "worker_errors": "worker_error", "tracebacks": "Traceback"}
    counts = dict.fromkeys(marks, 0)
    for path in log_dir.glob("*.log"):
        text = path.read_text(errors="replace")
        for name, needle in marks.items():
            counts[name] += text.count(needle)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=3000, help="URLs to seed")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4, help="fetch threads per worker")
    parser.add_argument("--kills", type=int, default=3, help="workers to kill -9 and replace")
    parser.add_argument("--sites", type=int, default=3, help="demo sites (127.0.0.1, .2, ...)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per response")
    parser.add_argument("--duration-cap", type=float, default=300,
                        help="give up (and report) after this many seconds of crawling")
    parser.add_argument("--seed", type=int, default=None, help="random seed (victims, order)")
    parser.add_argument("--keep-logs", action="store_true", help="keep worker logs on success")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.kills < 0 or args.urls < 10:
        parser.error("need --workers >= 1, --kills >= 0 and --urls >= 10")
    random.seed(args.seed)

    log_dir = Path(tempfile.mkdtemp(prefix="fleet-chaos-"))
    say(f"chaos: starting RabbitMQ, Redis (append-only) and {args.sites} demo site(s); "
        f"logs in {log_dir}")
    with ExitStack() as stack:
        broker = stack.enter_context(LocalRabbitMQ())
        server = stack.enter_context(LocalRedis(appendonly=True))
        pages_per_site = math.ceil(args.urls / args.sites)
        sites = start_sites(args.sites, pages=pages_per_site, latency_s=args.latency)
        for site in sites:
            stack.callback(site.stop)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RABBITMQ_", "REDIS_"))}
        env.update(RABBITMQ_URL=broker.url, REDIS_URL=server.url, PYTHONUNBUFFERED="1",
                   LOG_LEVEL="INFO", FETCH_ALLOW_NETWORKS="127.0.0.0/8",
                   RATE_LIMIT="100000/second", MAX_RETRIES=str(MAX_RETRIES),
                   RETRY_BASE_S="0.2", RETRY_MAX_S="2", CONNECT_RETRY_S="60")

        seeds = build_seeds(sites, args.urls)
        listing = log_dir / "seeds.txt"
        listing.write_text("\n".join(seeds.urls) + "\n")
        produced = subprocess.run([sys.executable, "producer.py", "--json", "-f", str(listing)],
                                  cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                  timeout=300, check=False)
        if produced.returncode != 0:
            say(f"producer failed ({produced.returncode}):\n{produced.stderr[-3000:]}")
            return 2
        summary = json.loads(produced.stdout)
        say(f"seeded: {summary}")

        fleet = Fleet(env, args.concurrency, log_dir)
        stack.callback(fleet.stop)
        for _ in range(args.workers):
            fleet.start()
        started = time.monotonic()
        say(f"started {args.workers} workers (concurrency {args.concurrency}); "
            f"{args.kills} kills, one RabbitMQ restart, one Redis restart to come")
        events = schedule(args, fleet, broker, server)
        drained, happened = crawl(args, seeds, fleet, Probe(broker, server.url), events, started)
        crawl_s = time.monotonic() - started
        codes = fleet.stop()
        report = tally(seeds, broker, server, sites)
        logs = scan_logs(log_dir)

    bound = (args.kills + args.workers) * args.concurrency
    say("")
    say("chaos summary")
    for line in happened:
        say(f"  event:            {line}")
    say(f"  crawl time:       {crawl_s:.1f}s ({'drained' if drained else 'NOT drained'})")
    say(f"  worker exits:     {codes}")
    say(f"  worker logs:      {logs}")
    say(f"  URLs in:          {report['urls_in']}  (producer: new={summary['new']})")
    say(f"  results:          {report['results']}")
    say(f"  dead-lettered:    {report['dead_lettered']}  {report['reasons']}")
    say(f"  lost:             {report['lost']}  {report['lost_sample'] or ''}")
    say(f"  duplicates:       {report['duplicates']}  {report['duplicate_sample'] or ''}")
    say(f"  duplicate fetches: {report['duplicate_fetches']}  (beyond the retries each URL "
        f"needs; in flight at the kills and the Redis outage: at most {bound})")
    if report["strays"]:
        say(f"  outcomes for URLs never seeded: {report['strays']}")
    ok = report["lost"] == 0 and report["duplicates"] == 0
    if ok and not args.keep_logs:
        for path in log_dir.iterdir():
            path.unlink()
        log_dir.rmdir()
    else:
        say(f"  logs kept in {log_dir}")
    say("chaos: PASS" if ok else "chaos: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
