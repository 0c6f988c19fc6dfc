"""Seed URLs into the fleet.

    python producer.py URL [URL ...]
    python producer.py -f urls.txt          # one URL a line, '#' starts a comment
    python producer.py -                    # URLs on stdin
    python producer.py --priority URL       # force the priority queue

Prints one summary line; exits 0 when every URL was handled, 1 when some could not be
published, 2 on bad arguments or settings, 3 when RabbitMQ or Redis cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator

from common.core.config import Settings
from common.intake.producer import Producer
from common.ops import cli
from common.ops.progress import Progress
from common.store.connection import connect_redis


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Seed URLs into the scraping fleet.")
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


def main(settings: Settings) -> int:
    args = parse_args()
    for path in args.file:
        if path != "-" and not os.path.isfile(path):
            print(f"error: no such file: {path}", file=sys.stderr)
            return cli.EXIT_CONFIG
    redis_client = connect_redis(settings)
    with Producer(settings, redis_client) as producer, Progress(None, "seeding") as progress:
        summary = producer.submit(progress.track(iter_inputs(args)),
                                  force_priority=args.priority, recrawl=args.recrawl)
    print(json.dumps(summary.as_dict()) if args.json else summary.line())
    return cli.EXIT_PARTIAL if summary.failed else cli.EXIT_OK


if __name__ == "__main__":
    cli.run(main)
