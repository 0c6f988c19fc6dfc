"""The commands that put URLs in: ``produce`` (producer.py), ``sitemap`` (sitemap_producer.py) and
``seed --job NAME`` (more URLs for a job's running run).

Each ``*_main`` is a command of common/ops/console.py and the body of its root script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterator

from common.core.config import Settings
from common.core.errors import InvalidURL
from common.core.urls import canonicalize
from common.intake.hosts import HostCheck
from common.intake.producer import Producer, ProduceSummary
from common.intake.sitemaps import SitemapReader, SiteReport, parse_since, produce_site
from common.jobs.registry import JobRegistry, JobStateError
from common.ops import cli
from common.ops.progress import Progress
from common.store.connection import connect_redis
from common.store.workers import alive_workers


def produce_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="Seed URLs into the scraping fleet.")
    parser.add_argument("urls", nargs="*", help="URLs to enqueue; '-' reads them from stdin")
    parser.add_argument("-f", "--file", action="append", default=[],
                        help="file with one URL a line ('#' comments); repeatable; '-' = stdin")
    parser.add_argument("--priority", action="store_true", help="send every URL to priority_queue")
    parser.add_argument("--recrawl", action="store_true",
                        help="enqueue URLs even if seen before (a refresh: a new result each; "
                             "the response cache answers repeats within CACHE_TTL_S)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_intermixed_args(argv)
    if not args.urls and not args.file:
        parser.error("give URLs, -f FILE or '-' for stdin")
    return args


_COMMENT = re.compile(r"(^|\s)#.*$")


def read_lines(path: str) -> Iterator[str]:
    """URLs from a file or stdin: blank lines and '#' comments (whole-line or after a space)
    are skipped; a '#' glued to a URL is its fragment and stays."""
    handle = sys.stdin if path == "-" else open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    with handle:
        for line in handle:
            url = _COMMENT.sub("", line).strip()
            if url:
                yield url


def iter_inputs(args: argparse.Namespace) -> Iterator[str]:
    for url in args.urls:
        if url == "-":
            yield from read_lines("-")
        else:
            yield url
    for path in args.file:
        yield from read_lines(path)


def produce_main(settings: Settings, argv: list[str] | None = None,
                 prog: str | None = None) -> int:
    """``producer.py`` / ``scrape-fleet produce``."""
    args = produce_args(argv, prog)
    for path in args.file:
        if path != "-" and not os.path.isfile(path):
            print(f"error: no such file: {path}", file=sys.stderr)
            return cli.EXIT_CONFIG
    redis_client = connect_redis(settings)
    hosts = HostCheck.for_fleet(settings, alive_workers(redis_client))
    with (Producer(settings, redis_client, hosts=hosts) as producer,
          Progress(None, "seeding") as progress):
        summary = producer.submit(progress.track(iter_inputs(args)),
                                  force_priority=args.priority, recrawl=args.recrawl)
    print(json.dumps(summary.as_dict()) if args.json else summary.line())
    return _refused_said(summary, hosts)


def _refused_said(summary: ProduceSummary, hosts: HostCheck) -> int:
    """Tell stderr which URLs the address guard refused and how to retry them; the exit
    code: partial when some URL was refused or not published."""
    if summary.refused.count:
        print(summary.refused.hint(hosts.guard.allow), file=sys.stderr)
    return cli.EXIT_PARTIAL if summary.failed or summary.refused.count else cli.EXIT_OK


def sitemap_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="Seed URLs into the fleet from sitemaps.")
    parser.add_argument("targets", nargs="+", metavar="URL",
                        help="a site root (https://host/) or a sitemap/feed URL")
    parser.add_argument("--since", type=cli.argument(parse_since), metavar="DATE",
                        help="keep entries dated at/after DATE (YYYY-MM-DD or ISO datetime, "
                             "UTC if no zone) and undated ones")
    parser.add_argument("--max-urls", type=cli.positive_int, metavar="N",
                        help="submit at most N URLs per site")
    parser.add_argument("--priority", action="store_true", help="send every URL to priority_queue")
    parser.add_argument("--json", action="store_true", help="print each summary as JSON")
    args = parser.parse_args(argv)
    for target in args.targets:
        try:
            canonicalize(target)
        except InvalidURL as exc:
            parser.error(f"not a site or sitemap URL: {target!r} ({exc})")
    return args


def _advancing(progress: Progress) -> Callable[[SiteReport], None]:
    """A produce_site callback that moves ``progress`` on by the URLs each sitemap gave."""
    def on_sitemap(report: SiteReport) -> None:
        progress.advance(report.summary.read - progress.count)

    return on_sitemap


def sitemap_main(settings: Settings, argv: list[str] | None = None,
                 prog: str | None = None) -> int:
    """``sitemap_producer.py`` / ``scrape-fleet sitemap``."""
    args = sitemap_args(argv, prog)
    redis_client = connect_redis(settings)
    reader = SitemapReader(settings, redis_client)
    reports: list[SiteReport] = []
    hosts = HostCheck.for_fleet(settings, alive_workers(redis_client))
    with Producer(settings, redis_client, hosts=hosts) as producer:
        for target in args.targets:
            with Progress(None, f"sitemaps {target}") as progress:
                report = produce_site(target, reader, producer, since=args.since,
                                      max_urls=args.max_urls, force_priority=args.priority,
                                      on_progress=_advancing(progress))
            print(json.dumps(report.as_dict()) if args.json else report.line(), flush=True)
            reports.append(report)
    total = ProduceSummary()
    for report in reports:
        total.merge(report.summary)
    if len(reports) > 1 and not args.json:
        print(f"total sites={len(reports)} sitemaps={sum(r.sitemaps for r in reports)} "
              f"errors={sum(len(r.errors) for r in reports)} "
              f"filtered={sum(r.filtered for r in reports)} {total.line()}")
    refused = _refused_said(total, hosts)
    return cli.EXIT_PARTIAL if any(r.failed for r in reports) else refused


def seed_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="Add URLs to a job's running run.")
    parser.add_argument("--job", required=True, metavar="NAME", help="the job (running)")
    parser.add_argument("urls", nargs="*", help="URLs to add; '-' reads them from stdin")
    parser.add_argument("-f", "--file", action="append", default=[],
                        help="file with one URL a line ('#' comments); repeatable; '-' = stdin")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_intermixed_args(argv)
    if not args.urls and not args.file:
        parser.error("give URLs, -f FILE or '-' for stdin")
    return args


def seed_main(settings: Settings, argv: list[str] | None = None,
              prog: str | None = None) -> int:
    """``scrape-fleet seed --job NAME URL...``: the URLs enter the job's current run, deduped
    within it, counted in its ``known`` and held to its ``limits.pages`` (``over_budget``).
    Refused unless the job is running: a created job's runner seeds it, a paused one would
    only park them, an ended run takes no URLs."""
    args = seed_args(argv, prog)
    for path in args.file:
        if path != "-" and not os.path.isfile(path):
            print(f"error: no such file: {path}", file=sys.stderr)
            return cli.EXIT_CONFIG
    redis_client = connect_redis(settings)
    registry = JobRegistry(redis_client)
    try:
        state = registry.state(args.job)
    except JobStateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_PARTIAL
    spec, ref = registry.spec(args.job), state.ref
    if state.state != "running" or ref is None or spec is None:
        print(f"error: job {args.job!r} is {state.state}, not running: `seed --job` adds URLs "
              "to a running run only (`scrape-fleet job show` tells its state)", file=sys.stderr)
        return cli.EXIT_PARTIAL
    hosts = HostCheck.for_fleet(settings, alive_workers(redis_client))
    with (Producer(settings, redis_client, hosts=hosts) as producer,
          Progress(None, f"seeding {ref.scope}") as progress):
        summary = producer.submit(progress.track(iter_inputs(args)), job=ref, job_spec=spec)
    print(json.dumps({"job": ref.name, "run": ref.run, **summary.as_dict()}) if args.json
          else f"job={ref.name} run={ref.run} {summary.line()}")
    return _refused_said(summary, hosts)
