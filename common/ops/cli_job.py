"""``scrape-fleet job``: submit a job file, follow its runs, pause, resume, cancel, read its
results, delete it (the jobs themselves: common/jobs/; what is printed: cli_job_view.py).

Exit codes: 0 ok; 1 the job's state does not allow the command (the registry's message), or
no such job; 2 a bad job file (the field named; nothing is stored); 3 RabbitMQ or Redis
unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import islice
from typing import Any

import redis

from common.core.config import Settings
from common.core.urls import domain_of
from common.jobs import progress as job_progress
from common.jobs.registry import JobRef, JobRegistry, JobStateError, dumps
from common.jobs.spec import BadJob, load_job_file
from common.ops import cli
from common.ops import cli_job_view as view
from common.ops.export import FORMATS, Exporter, read_entries
from common.store.connection import connect_redis
from common.store.keys import deferred_key, job_seeds_key
from common.store.results import ResultStore
from common.web.ratelimit import RateLimiter
from common.work.job_check import check_job

#: A rate for `job show`/`job list` when no reading of the last minute is stored: read the
#: counters again this much later.
SAMPLE_S = 2.0
#: Seeds whose domains `job show` looks at (the fleet's throttle and deferred URLs there).
DOMAIN_SEEDS, DOMAINS_MAX = 1000, 20


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog, description="Jobs: many crawls on one fleet, each with its own seeds, "
        "settings, limits, schedule, progress and results (docs/jobs.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    submit = sub.add_parser("submit", help="validate a job file and store it (created); the "
                            "job runner (`scrape-fleet schedule run`) starts it; a bad file: "
                            "exit 2, the field named, nothing stored")
    submit.add_argument("file", help="the job file (YAML or JSON); - reads it from standard "
                        "input (`docker compose run --rm -T tools python job.py submit - < "
                        "job.yml`)")
    submit.add_argument("--replace", action="store_true",
                        help="replace a job of that name that is not running or paused")
    sub.add_parser("list", help="every job: state, run, progress, rate, ETA").add_argument(
        "--json", action="store_true", help="JSON, one object per job")
    show = sub.add_parser("show", help="a job's definition, state and current run's progress")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    for action, text in (("pause", "running -> paused: pages in flight finish, the next "
                          "are parked until resume"),
                         ("resume", "paused -> running: the parked pages go back to work"),
                         ("cancel", "stop the job for good: its queued pages are dropped as "
                          "cancelled")):
        one = sub.add_parser(action, help=text)
        one.add_argument("name")
        if action == "cancel":
            one.add_argument("--reason", default="cancelled by a user")
    runs = sub.add_parser("runs", help="each run's counters, start and end")
    runs.add_argument("name")
    runs.add_argument("--json", action="store_true")
    results = sub.add_parser(
        "results", help="a run's results from the results stream",
        description="A run's results, read from the results stream. A sink trims that stream "
        "to what it has not written yet, so with a sink running this may show only the last "
        "few: `scrape-fleet export --job NAME` reads them from where they are complete.")
    results.add_argument("name")
    results.add_argument("--run", type=cli.positive_int, help="default: the current run")
    results.add_argument("--format", choices=FORMATS, default="jsonl")
    results.add_argument("--limit", type=cli.positive_int, metavar="N")
    sub.add_parser("delete", help="forget a job that is not running or paused (its results "
                   "stay)").add_argument("name")
    return parser.parse_args(argv)


def job_main(settings: Settings, argv: list[str] | None = None,
             prog: str | None = None) -> int:
    """``scrape-fleet job``."""
    args = parse_args(argv, prog)
    client = connect_redis(settings, not_on_cluster="jobs")
    registry = JobRegistry(client)
    try:
        if args.command == "submit":
            return submit(settings, registry, args.file, args.replace)
        if args.command == "list":
            return list_jobs(registry, args.json)
        if args.command == "show":
            return show(settings, registry, args.name, args.json)
        if args.command in ("pause", "resume", "cancel"):
            return move(registry, args)
        if args.command == "runs":
            return runs(registry, args.name, args.json)
        if args.command == "results":
            return results(settings, registry, args)
        registry.delete(args.name)
        print(f"job {args.name} deleted (its results stay in the results stream and sinks)")
        return cli.EXIT_OK
    except JobStateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_PARTIAL


def submit(settings: Settings, registry: JobRegistry, path: str, replace: bool) -> int:
    """Validate the whole file (load_job_file: every field; check_job: the rules compile, a
    live worker has its router, its webhooks' hosts are allowed), then store it."""
    try:
        spec = load_job_file(path)
    except BadJob as exc:
        print(f"error: bad job file {path}: {cli.escape_controls(str(exc))}", file=sys.stderr)
        return cli.EXIT_CONFIG
    problems = check_job(spec, registry.client, settings)
    if problems:
        for problem in problems:
            print(f"error: bad job file {path}: {cli.escape_controls(problem)}",
                  file=sys.stderr)
        return cli.EXIT_CONFIG
    state = registry.submit(spec, replace=replace)
    print(f"job {state.name}: {state.state} ({len(spec.seed_urls):,} seed URLs, "
          f"{len(spec.sitemaps)} sitemaps)")
    print("the job runner (`scrape-fleet schedule run`) starts it; follow it with "
          f"`scrape-fleet job show {state.name}`, its results with "
          f"`scrape-fleet job results {state.name}`")
    return cli.EXIT_OK


def list_jobs(registry: JobRegistry, as_json: bool) -> int:
    states = registry.states()
    specs = registry.specs()
    measured = job_progress.measure(registry.client, states, sample_s=SAMPLE_S)
    if as_json:
        for progress in measured:
            spec = specs.get(progress.name)
            print(json.dumps({**progress.as_dict(),
                              "priority": spec.priority if spec else None,
                              "schedule": view.schedule_text(spec)}))
        return cli.EXIT_OK
    print(view.LIST_HEADER)
    for progress in measured:
        print(view.list_row(progress, specs.get(progress.name)))
    if not measured:
        print("(no jobs: `scrape-fleet job submit FILE`)")
    return cli.EXIT_OK


def show(settings: Settings, registry: JobRegistry, name: str, as_json: bool) -> int:
    state = registry.state(name)
    spec = registry.spec(name)
    [progress] = job_progress.measure(registry.client, [state], sample_s=SAMPLE_S)
    domains = job_domains(settings, registry.client, name)
    seeds = registry.client.llen(job_seeds_key(name))
    if as_json:
        print(json.dumps({"state": json.loads(dumps(state)),
                          "definition": spec.shown() if spec else None,
                          "seeds": seeds, "progress": progress.as_dict(),
                          "domains": domains}, indent=2))
        return cli.EXIT_OK
    print("\n".join(view.show_lines(state, spec, seeds, progress, domains)))
    return cli.EXIT_OK


def job_domains(settings: Settings, client: redis.Redis, name: str) -> list[dict[str, Any]]:
    """The domains of the job's first seeds, each with the fleet's throttle there (or None)
    and its deferred URLs (politeness is per domain for the whole fleet, not per job)."""
    seeds = client.lrange(job_seeds_key(name), 0, DOMAIN_SEEDS - 1)
    names = list(dict.fromkeys(domain_of(url.decode()) for url in seeds))[:DOMAINS_MAX]
    if not names:
        return []
    throttled = {row["domain"]: row["text"] for row in RateLimiter(client, settings).throttled()}
    deferred = client.hmget(deferred_key("counts"), names)
    return [{"domain": domain, "throttle": throttled.get(domain), "deferred": int(n or 0)}
            for domain, n in zip(names, deferred, strict=True)]


def move(registry: JobRegistry, args: argparse.Namespace) -> int:
    if args.command == "cancel":
        to = registry.cancel(args.name, args.reason)
    else:
        to = getattr(registry, args.command)(args.name)
    notes = {"paused": "pages in flight finish; the next ones are parked until "
                       f"`scrape-fleet job resume {args.name}`",
             "running": "its parked pages go back to the workers",
             "cancelled": "its queued pages are dropped as the workers meet them"}
    print(f"job {args.name}: {to} ({notes.get(to, '')})")
    return cli.EXIT_OK


def runs(registry: JobRegistry, name: str, as_json: bool) -> int:
    state = registry.state(name)
    every = [(n, registry.counters(JobRef(name, n))) for n in range(1, state.run + 1)]
    if as_json:
        for n, counters in every:
            print(json.dumps({"run": n, **counters}))
        return cli.EXIT_OK
    for n, counters in every:
        print(view.run_line(n, counters))
    if not every:
        print(f"job {name} has no run yet ({state.state})")
    return cli.EXIT_OK


def results(settings: Settings, registry: JobRegistry, args: argparse.Namespace) -> int:
    run = args.run or registry.state(args.name).run
    if not run:
        print(f"job {args.name} has no run yet", file=sys.stderr)
        return cli.EXIT_OK
    store = ResultStore(registry.client, settings.results_maxlen)
    mine = ((entry_id, record) for entry_id, record in read_entries(store)
            if record.get("job") == args.name and record.get("run") == run)
    exporter = Exporter(sys.stdout, args.format)
    exporter.write_all(islice(mine, args.limit))
    print(f"{exporter.count:,} results of job {args.name} run {run} from the results stream "
          "(a sink trims it: `scrape-fleet export --job` reads them where they are complete)",
          file=sys.stderr)
    return cli.EXIT_OK
