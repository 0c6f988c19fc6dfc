"""The peer: a scrapy-redis RedisSpider extracting the fields the fleet records.

    bench/.venv/bin/python -m bench.peer_spider --redis-url redis://127.0.0.1:PORT/1 \
        [--key peer:start_urls] [--concurrency 16] [--idle-close-s 3] [--scheduler redis]

Reads start URLs (plain strings) from a Redis list, fetches each once (no link following),
and pushes one JSON item per page into ``peer:items`` with scrapy-redis's RedisPipeline:
url, status, title, description, canonical, language, links (absolute, de-duplicated, no
fragment), links_count, text_length; with ``--extract`` also ``data``, the fields the
bench's extraction rules give the fleet (bench/extract_rounds.py), read with Scrapy's
selectors. By default requests go through scrapy-redis's shared
scheduler and dupefilter, the distributed set-up its documentation describes (SCHEDULER_PERSIST
so one process closing does not flush the other's queue); ``--scheduler memory`` keeps Scrapy's
in-process scheduler instead. robots.txt is obeyed and retries are on,
like the fleet. The process closes once the list has been empty for ``--idle-close-s``.

Runs only in the bench venv (scrapy and scrapy-redis are not fleet dependencies); the bench
starts two of these processes on the same list.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from scrapy import Request
from scrapy.crawler import CrawlerProcess
from scrapy.exceptions import ScrapyDeprecationWarning
from scrapy.http import Response
from scrapy_redis.spiders import RedisSpider

from bench.peer_fields import page_record

NAME = "peer"
USER_AGENT = "scrapy-redis-peer/bench"


class PeerSpider(RedisSpider):
    name = NAME
    extract = False  # --extract: also the bench's extraction rules' fields, with Scrapy's own

    def make_request_from_data(self, data: bytes) -> Request:
        # A plain GET per URL; the stock method wraps non-JSON data in a FormRequest and logs
        # a deprecation warning per URL.
        return Request(data.decode(self.redis_encoding), dont_filter=True)

    def parse(self, response: Response, **_kwargs: Any) -> Iterator[dict[str, Any]]:
        yield page_record(response.selector, response.url, response.status, response.urljoin,
                          self.extract)


def settings_for(redis_url: str, key: str, concurrency: int, idle_close_s: int,
                 log_level: str, scheduler: str = "redis") -> dict[str, Any]:
    """Scrapy settings. ``scheduler="redis"`` is scrapy-redis's distributed set-up (shared
    request queue and dupefilter in Redis); ``"memory"`` keeps Scrapy's own scheduler and only
    the start URLs and items in Redis (a lighter peer, for comparison)."""
    shared = {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_PERSIST": True,
        "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue",
    } if scheduler == "redis" else {}
    return {
        "REDIS_URL": redis_url,
        "REDIS_START_URLS_KEY": key,
        **shared,
        "ITEM_PIPELINES": {"scrapy_redis.pipelines.RedisPipeline": 300},
        "REDIS_ITEMS_KEY": "%(spider)s:items",
        "MAX_IDLE_TIME_BEFORE_CLOSE": idle_close_s,
        "CONCURRENT_REQUESTS": concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": concurrency,
        "ROBOTSTXT_OBEY": True,
        "RETRY_ENABLED": True,
        "RETRY_TIMES": 3,
        "DOWNLOAD_TIMEOUT": 20,
        "USER_AGENT": USER_AGENT,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": log_level,
        "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--key", default=f"{NAME}:start_urls")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--idle-close-s", type=int, default=3)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--scheduler", choices=("redis", "memory"), default="redis")
    parser.add_argument("--extract", action="store_true",
                        help="also extract the bench rules' fields (bench/extract_rounds.py)")
    args = parser.parse_args(argv)
    PeerSpider.extract = args.extract
    # scrapy-redis 0.9.1 predates Scrapy 2.13's API changes: it works, with a warning per call
    # site that would only bury the bench's output.
    warnings.filterwarnings("ignore", category=ScrapyDeprecationWarning)
    process = CrawlerProcess(settings_for(args.redis_url, args.key, args.concurrency,
                                          args.idle_close_s, args.log_level, args.scheduler))
    process.crawl(PeerSpider)
    process.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
