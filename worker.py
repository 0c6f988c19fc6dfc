"""Scraper worker: consume priority_queue and url_queue_ttl, fetch, parse, record results.

    python worker.py [--concurrency N] [--idle-exit SECONDS]

Runs until SIGTERM/SIGINT (graceful: in-flight work finishes and is acked) or, with
--idle-exit, until no message arrived for that long. The compose service is `scraper`.
"""

from __future__ import annotations

import argparse

from common.core.config import Settings
from common.ops import cli
from common.store.connection import connect_redis
from common.work.processor import Processor
from common.work.worker import Worker


def parse_args(settings: Settings) -> Settings:
    parser = argparse.ArgumentParser(description="Run one scraper worker.")
    parser.add_argument("--concurrency", type=int, default=settings.concurrency,
                        help=f"parallel fetches (default {settings.concurrency})")
    parser.add_argument("--idle-exit", type=float, default=settings.idle_exit_s, metavar="SECONDS",
                        help="exit 0 after this long without a message (0 = never)")
    args = parser.parse_args()
    if args.concurrency < 1:
        parser.error("--concurrency must be >= 1")
    if args.idle_exit < 0:
        parser.error("--idle-exit must be >= 0")
    return settings.with_overrides(concurrency=args.concurrency, idle_exit_s=args.idle_exit)


def main(settings: Settings) -> int:
    settings = parse_args(settings)
    redis_client = connect_redis(settings)
    processor = Processor(settings, redis_client)
    worker = Worker(settings, processor)
    worker.install_signal_handlers()
    return worker.run()


if __name__ == "__main__":
    cli.run(main)
