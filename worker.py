"""Scraper worker: consume priority_queue and url_queue_ttl, fetch, parse, record results.

    python worker.py [--concurrency N] [--idle-exit SECONDS]

Runs until SIGTERM/SIGINT (graceful: in-flight work finishes and is acked) or, with
--idle-exit, until no message arrived for that long. The compose service is `scraper`.
"""

from __future__ import annotations

from common.ops import cli
from common.ops.cli_run import work_main

if __name__ == "__main__":
    cli.run(work_main)
