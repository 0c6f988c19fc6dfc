"""``scheduler.py`` / ``scrape-fleet schedule``: recrawls on an adaptive schedule (the command
line; the schedule is common/intake/schedule.py, the leader's loop common/intake/recrawler.py)
and, in ``run``, the job runner (common/jobs/runner.py) beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import uuid
from functools import partial

from common.core.config import Settings
from common.core.errors import InvalidURL
from common.core.values import parse_duration
from common.intake import recrawler as rc
from common.intake.producer import Producer
from common.intake.schedule import Schedule
from common.intake.sitemaps import SitemapReader
from common.jobs.runner import JobRunner, JobsLease
from common.ops import cli
from common.ops.cli_seed import iter_inputs
from common.sink.reader import SinkReader, run_sink
from common.store import slots
from common.store.connection import connect_redis

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="Recrawl URLs on an adaptive schedule.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="run the scheduler and the job runner (of several replicas one leads)")
    add = commands.add_parser("add", help="schedule URLs (canonicalised)")
    add.add_argument("urls", nargs="*", help="URLs; '-' reads them from stdin")
    add.add_argument("-f", "--file", action="append", default=[], help="one URL a line")
    add.add_argument("--interval", type=cli.argument(parse_duration), metavar="DURATION",
                     help="first interval: 90s, 15m, 6h, 1d, 2w (default SCHEDULE_INTERVAL_S)")
    add.add_argument("--delay", type=cli.argument(partial(parse_duration, minimum=0)),
                     default=0, metavar="DURATION", help="first visit after this (default 0)")
    add.add_argument("--keep", action="store_true", help="leave scheduled URLs as they are")
    site = commands.add_parser("sitemap", help="seed and schedule the URLs of sitemaps")
    site.add_argument("targets", nargs="+", metavar="URL", help="a site root or a sitemap URL")
    site.add_argument("--max-urls", type=cli.positive_int, metavar="N", help="per site")
    commands.add_parser("show", help="the schedule, or URLs' entries").add_argument(
        "urls", nargs="*")
    commands.add_parser("remove", help="unschedule URLs").add_argument("urls", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "add" and not (args.urls or args.file):
        parser.error("give URLs, -f FILE or '-' for stdin")
    return args


def run(settings: Settings, schedule: Schedule) -> int:
    """The recrawl scheduler and, in a thread beside it, the job runner (each leads through
    its own lease); a job runner that fails stops the process (exit 1), never leaving a
    scheduler up that no longer runs jobs. On a Redis Cluster, where jobs are refused
    (common/ops/cli_job.py), the scheduler alone."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    client = schedule.client
    owner = f"{settings.worker_id}/{uuid.uuid4().hex[:8]}"
    failed: list[BaseException] = []

    def run_jobs() -> None:
        runner = JobRunner(settings, client, JobsLease(
            client, int(settings.schedule_lease_s * 1000), owner=owner))
        try:
            runner.run(stop)
        except BaseException as exc:
            logger.exception("job runner failed; stopping the scheduler")
            failed.append(exc)
            stop.set()

    jobs = threading.Thread(target=run_jobs, name="jobs")
    if slots.cluster():
        logger.info("Redis Cluster: the recrawl scheduler runs without the job runner (%s)",
                    slots.NO_JOBS_ON_CLUSTER)
    else:
        jobs.start()

    def learn(done: threading.Event) -> None:
        reader = SinkReader(client, rc.SINK_NAME, batch=settings.sink_batch)
        run_sink(reader, rc.Learner(schedule), done)

    lease = rc.Lease(client, int(settings.schedule_lease_s * 1000), owner=owner)
    try:
        with rc.RecrawlProducer(settings, client) as producer:
            code = rc.Recrawler(settings, schedule, lease, producer, learn).run(stop)
    finally:
        stop.set()
        if jobs.is_alive():
            jobs.join()
    return 1 if failed else code


def schedule_main(settings: Settings, argv: list[str] | None = None,
                  prog: str | None = None) -> int:
    """``scheduler.py`` / ``scrape-fleet schedule``."""
    args = parse_args(argv, prog)
    schedule = Schedule(connect_redis(settings), settings)
    if args.command == "run":
        return run(settings, schedule)
    if args.command == "add":
        interval_s = args.interval or settings.schedule_interval_s
        if schedule.clamp(interval_s) != interval_s:
            print(f"note: interval {interval_s} s is outside SCHEDULE_MIN/MAX_INTERVAL_S; "
                  f"{schedule.clamp(interval_s)} s used")
        summary = schedule.add(((url, interval_s, args.delay) for url in iter_inputs(args)),
                               replace=not args.keep)
        print(summary.line())
        return cli.EXIT_PARTIAL if summary.invalid else cli.EXIT_OK
    if args.command == "sitemap":
        reader, failed = SitemapReader(settings, schedule.client), False
        with Producer(settings, schedule.client) as producer:
            for target in args.targets:
                report, added = rc.schedule_site(target, reader, producer, schedule,
                                                 args.max_urls)
                print(f"{report.line()} scheduled: {added.line()}", flush=True)
                failed = failed or report.failed
        return cli.EXIT_PARTIAL if failed else cli.EXIT_OK
    try:
        if args.command == "remove":
            print(f"removed={schedule.remove(args.urls)}")
        elif args.urls:
            print(json.dumps([schedule.entry(u) or {"url": u, "scheduled": False}
                              for u in args.urls], indent=2))
        else:
            print(json.dumps(schedule.status(), indent=2))
    except InvalidURL as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_CONFIG
    return cli.EXIT_OK

