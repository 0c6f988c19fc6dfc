"""Seed URLs into the fleet from sites' sitemaps and feeds.

    python sitemap_producer.py https://site.example/            # robots.txt Sitemap: lines,
                                                                 # else /sitemap.xml
    python sitemap_producer.py https://site.example/news.xml.gz # a sitemap or feed directly
    python sitemap_producer.py SITE [SITE ...] --since 2024-05-01 --max-urls 10000 --priority

URLs go through the same path as producer.py (common.intake.producer.Producer). Prints one summary
line per site (``site=… sitemaps=N errors=N filtered=N read=… new=…``); progress on stderr
while it runs (common.ops.progress: a bar on a terminal, a line every few seconds otherwise). Exits 0 when everything was read and published, 1 when some sitemap failed or
some URL could not be published, 2 on bad arguments or settings, 3 when RabbitMQ or Redis
cannot be reached. common/intake/sitemaps.py has the walk (discovery, indexes, --since),
common/intake/sitemap_files.py the formats and their limits.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from common.core.config import Settings
from common.core.errors import InvalidURL
from common.core.urls import canonicalize
from common.intake.producer import Producer, ProduceSummary
from common.intake.sitemaps import SitemapReader, SiteReport, parse_since, produce_site
from common.ops import cli
from common.ops.progress import Progress
from common.store.connection import connect_redis


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Seed URLs into the fleet from sitemaps.")
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


def main(settings: Settings) -> int:
    args = parse_args()
    redis_client = connect_redis(settings)
    reader = SitemapReader(settings, redis_client)
    reports: list[SiteReport] = []
    with Producer(settings, redis_client) as producer:
        for target in args.targets:
            with Progress(None, f"sitemaps {target}") as progress:
                report = produce_site(target, reader, producer, since=args.since,
                                      max_urls=args.max_urls, force_priority=args.priority,
                                      on_progress=_advancing(progress))
            print(json.dumps(report.as_dict()) if args.json else report.line(), flush=True)
            reports.append(report)
    if len(reports) > 1 and not args.json:
        total = ProduceSummary()
        for report in reports:
            total.merge(report.summary)
        print(f"total sites={len(reports)} sitemaps={sum(r.sitemaps for r in reports)} "
              f"errors={sum(len(r.errors) for r in reports)} "
              f"filtered={sum(r.filtered for r in reports)} {total.line()}")
    return cli.EXIT_PARTIAL if any(r.failed for r in reports) else cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
