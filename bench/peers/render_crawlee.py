"""The render bench's peer: Crawlee for Python's PlaywrightCrawler on Debian's Chromium.

    bench/.venv/bin/python -m bench.peers.render_crawlee --urls FILE --out FILE.jsonl
        [--concurrency 2] [--executable /usr/bin/chromium]

Renders the URLs of FILE (one a line) once each with Crawlee's defaults (one browser, its
fingerprints, its request queue and dataset in ``CRAWLEE_STORAGE_DIR``), robots.txt obeyed and
three retries like the fleet, ``--concurrency`` pages at once (autoscaling pinned there), the
same Chromium as the fleet's render workers (``executable_path``, headless, the fleet's
Chromium flags; Playwright cannot download its own here); ``--incognito``: a fresh context per
page, as the fleet (Crawlee's default shares one context between pages). Each page: wait for ``span.price``
(the rule's ``wait_for``), then the fields bench/render_cost.py's rule extracts, pushed to the
dataset and written to ``--out`` as JSON lines at the end. Prints the items pushed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path

from crawlee import ConcurrencySettings, Request
from crawlee.crawlers import PlaywrightCrawler, PlaywrightCrawlingContext

from common.web.browser import CHROMIUM_FLAGS


async def crawl(urls: list[str], out: Path, concurrency: int, executable: str,
                incognito: bool) -> int:
    args = [flag for flag in CHROMIUM_FLAGS if not flag.startswith("--headless")]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # as the fleet: Chromium's sandbox refuses root
    crawler = PlaywrightCrawler(
        browser_type="chromium", headless=True, use_incognito_pages=incognito,
        browser_launch_options={"executable_path": executable, "args": args},
        max_request_retries=3, respect_robots_txt_file=True,
        concurrency_settings=ConcurrencySettings(min_concurrency=concurrency,
                                                 desired_concurrency=concurrency,
                                                 max_concurrency=concurrency),
        request_handler_timeout=timedelta(seconds=30),
        configure_logging=False,
    )

    @crawler.router.default_handler
    async def handler(context: PlaywrightCrawlingContext) -> None:
        page = context.page
        await page.wait_for_selector("span.price", state="attached", timeout=30_000)
        price = await page.locator("span.price").first.text_content()
        await context.push_data({
            "url": context.request.url, "rendered": True,
            "data": {"name": await page.locator("h1.name").first.text_content(),
                     "price": float(price) if price else None,
                     "items": await page.locator("li.item").all_text_contents()}})

    await crawler.run([Request.from_url(url) for url in urls])
    items = (await crawler.get_data(limit=len(urls) * 2)).items
    out.write_text("".join(json.dumps(item) + "\n" for item in items))
    return len(items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--executable", default="/usr/bin/chromium")
    parser.add_argument("--incognito", action="store_true",
                        help="a fresh browser context per page (use_incognito_pages), as the "
                             "fleet's render workers do")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    urls = [line.strip() for line in args.urls.read_text().splitlines() if line.strip()]
    pushed = asyncio.run(crawl(urls, args.out, args.concurrency, args.executable,
                                args.incognito))
    print(f"pushed={pushed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
