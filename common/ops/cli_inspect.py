"""The commands that look at the fleet: ``status`` (stats.py) and ``dlq`` (dlq.py); ``export``
is common/ops/cli_export.py.

Each ``*_main`` is a command of common/ops/console.py and the body of its root script.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from common.broker.connection import connect_rabbitmq
from common.core.config import Settings
from common.ops import cli, dlq, stats
from common.ops.status_view import fitted_size
from common.store.connection import connect_redis

logger = logging.getLogger(__name__)


def status_main(settings: Settings, argv: list[str] | None = None,
                prog: str | None = None) -> int:
    """``stats.py`` / ``scrape-fleet status``: a table fitted to the terminal (every line whole
    in a pipe or a file), ``--json`` (the same numbers; its keys: common/ops/status_view.py)
    or ``--watch``."""
    parser = argparse.ArgumentParser(prog=prog, description="Show the fleet's status.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true",
                      help="print the same numbers as JSON, for scripts (keys: "
                           "common/ops/status_view.py)")
    mode.add_argument("--watch", action="store_true", help="live view on the terminal")
    parser.add_argument("--interval", type=float, default=2.0, help="--watch refresh seconds")
    args = parser.parse_args(argv)
    client = connect_redis(settings)  # a cluster: every part read (common/ops/status_counts.py)
    connection = connect_rabbitmq(settings)
    try:
        if args.watch:
            try:
                stats.watch(settings, connection, client, args.interval)
            except KeyboardInterrupt:
                return cli.EXIT_OK
        snapshot = stats.collect(settings, connection, client)
    finally:
        if connection.is_open:
            connection.close()
    print(json.dumps(snapshot, indent=2) if args.json
          else stats.render(snapshot, *fitted_size()))
    return cli.EXIT_OK


def dlq_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="Dead-letter queue tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="show dead letters without removing them")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true", help="JSON lines, one per message")
    listing.add_argument("--job", metavar="NAME", help="only the dead letters of this job")
    listing.add_argument("--run", type=cli.positive_int, metavar="N",
                         help="with --job: only those of its run N")
    again = sub.add_parser("replay", help="send dead letters back through routing (a job's "
                           "back into its run, while that run is running)")
    again.add_argument("--reason", help="only messages with this reason (e.g. max_retries)")
    again.add_argument("--limit", type=int, default=None)
    again.add_argument("--job", metavar="NAME", help="only the dead letters of this job")
    purge = sub.add_parser("purge", help="delete every dead letter")
    purge.add_argument("--yes", action="store_true", help="really purge")
    args = parser.parse_args(argv)
    if getattr(args, "run", None) and not args.job:
        parser.error("--run needs --job NAME")
    return args


def dlq_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``dlq.py`` / ``scrape-fleet dlq``."""
    args = dlq_args(argv, prog)
    connection = connect_rabbitmq(settings)
    try:
        if args.command == "list":
            letters = dlq.browse(connection, args.limit, job=args.job, run=args.run)
            if args.json:
                if letters:
                    print(dlq.to_json_lines(letters))
                return cli.EXIT_OK
            for letter in letters:
                h = letter.as_dict()
                job = f"job={letter.job.name}/{letter.job.run} " if letter.job else ""
                line = (f"{letter.reason:<20} {job}attempts={h.get('attempts', 0)} "
                        f"status={h.get('last_status', '-')} {letter.url}  "
                        f"{h.get('last_error', '')}")
                print(cli.escape_controls(line))  # URLs and errors came from outside
            print(f"{len(letters)} shown; by reason: {dlq.count_by_reason(letters)}")
            return cli.EXIT_OK
        if args.command == "replay":
            summary = dlq.replay(settings, connection, connect_redis(settings),
                                 reason=args.reason, limit=args.limit, job=args.job)
            print(f"replayed={summary.matched} unreplayable={summary.skipped_unreplayable} "
                  f"kept={sum(summary.refused.values())} {summary.produced.line()}")
            for why, n in summary.refused.items():
                print(f"refused {n}: {why}; they stay in the queue", file=sys.stderr)
            return (cli.EXIT_PARTIAL if summary.produced.failed or summary.refused
                    else cli.EXIT_OK)
        if not args.yes:
            print("purge deletes every dead letter: add --yes")
            return cli.EXIT_CONFIG
        print(f"purged {dlq.purge(connection)} dead letters")
        return cli.EXIT_OK
    finally:
        if connection.is_open:
            connection.close()
