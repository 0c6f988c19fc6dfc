"""The second peer: Crawlee for Python's ParselCrawler recording what the fleet records.

    bench/.venv/bin/python -m bench.crawlee_peer --urls FILE [--concurrency 16] [--extract]

Crawls the URLs of FILE (one a line) once each with Crawlee's defaults — its HTTP client,
request queue and dataset in the default file-system storage (``CRAWLEE_STORAGE_DIR``, which
the bench sets per process) — robots.txt obeyed and three retries, like the fleet, and pushes
one item per page (bench/peer_fields.py: the same record as scrapy-redis's, and with
``--extract`` the extract phase's fields). Crawlee has no shared queue between processes, so
the bench starts two of these, each given half the URL list. Prints the items pushed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path
from urllib.parse import urljoin

from crawlee import ConcurrencySettings, Request
from crawlee.crawlers import ParselCrawler, ParselCrawlingContext

from bench.peer_fields import page_record

USER_AGENT = "crawlee-peer/bench"


async def crawl(urls: list[str], concurrency: int, extract: bool) -> int:
    crawler = ParselCrawler(
        max_request_retries=3,
        respect_robots_txt_file=True,
        concurrency_settings=ConcurrencySettings(min_concurrency=concurrency,
                                                 desired_concurrency=concurrency,
                                                 max_concurrency=concurrency),
        request_handler_timeout=timedelta(seconds=20),
        configure_logging=False,
    )
    pushed = 0

    @crawler.router.default_handler
    async def handler(context: ParselCrawlingContext) -> None:
        nonlocal pushed
        response = context.http_response
        url = context.request.loaded_url or context.request.url
        await context.push_data(page_record(context.selector, url, response.status_code,
                                            partial(urljoin, url), extract))
        pushed += 1

    await crawler.run([Request.from_url(url, headers={"User-Agent": USER_AGENT})
                       for url in urls])
    return pushed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--extract", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    urls = [line.strip() for line in args.urls.read_text().splitlines() if line.strip()]
    pushed = asyncio.run(crawl(urls, args.concurrency, args.extract))
    print(f"pushed={pushed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
