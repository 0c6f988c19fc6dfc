"""The commands that look at the fleet and what came out: ``status`` (stats.py), ``export``
(export.py) and ``dlq`` (dlq.py).

Each ``*_main`` is a command of common/ops/console.py and the body of its root script.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from itertools import islice
from pathlib import Path
from typing import TextIO

from common.broker.connection import connect_rabbitmq
from common.core.config import Settings
from common.ops import cli, dlq, stats
from common.ops.export import FORMATS, Exporter, parse_stream_id, read_entries, since_to_stream_id
from common.ops.export_files import read_through_files
from common.store.connection import connect_redis
from common.store.results import ResultStore

logger = logging.getLogger(__name__)


def status_main(settings: Settings, argv: list[str] | None = None,
                prog: str | None = None) -> int:
    """``stats.py`` / ``scrape-fleet status``."""
    parser = argparse.ArgumentParser(prog=prog, description="Show the fleet's status.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="print JSON instead of a table")
    mode.add_argument("--watch", action="store_true", help="live view on the terminal")
    parser.add_argument("--interval", type=float, default=2.0, help="--watch refresh seconds")
    args = parser.parse_args(argv)
    client = connect_redis(settings)
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
    print(json.dumps(snapshot, indent=2) if args.json else stats.render(snapshot))
    return cli.EXIT_OK


def export_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog, description="Export the results stream as JSON Lines or CSV.")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="default: jsonl")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write to FILE (replaced) instead of stdout")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from", dest="from_id", type=cli.argument(parse_stream_id),
                       metavar="STREAM_ID", help="first stream id, inclusive (MS-SEQ or MS)")
    start.add_argument("--since", type=cli.argument(since_to_stream_id), metavar="TIME",
                       help="first time: ISO 8601 (no offset = UTC) or Unix epoch seconds")
    parser.add_argument("--limit", type=cli.positive_int, metavar="N", help="stop after N records")
    parser.add_argument("--follow", action="store_true",
                        help="after the backlog, keep exporting new records until stopped")
    parser.add_argument("--sink-dir", metavar="DIR", type=Path,
                        help="read the results from the files sink writing to DIR (once it has "
                             "written everything recorded so far) instead of the stream, which "
                             "it trims; local mode sets it")
    parser.add_argument("--sink-name", default="files", metavar="NAME",
                        help="that sink's registered name (default files)")
    args = parser.parse_args(argv)
    if args.sink_dir is not None and not args.sink_dir.is_dir():
        parser.error(f"argument --sink-dir: no such directory: {args.sink_dir}")
    if args.sink_dir is not None and args.follow:
        parser.error("argument --follow: reads the stream, not --sink-dir (the files sink "
                     "trims the stream: read its files with zcat instead)")
    args.start = args.from_id or args.since or "-"
    if args.output not in (None, "-") and not Path(args.output).resolve().parent.is_dir():
        parser.error(f"argument --output: no such directory: {Path(args.output).parent}")
    return args


def export(args: argparse.Namespace, store: ResultStore, out: TextIO, destination: str) -> int:
    """Write the selected records to ``out``; returns the exit code."""
    exporter = Exporter(out, args.format)
    try:
        if args.sink_dir is not None:
            entries = read_through_files(store, args.sink_dir, args.start,
                                         sink_name=args.sink_name)
        else:
            entries = read_entries(store, args.start, follow=args.follow,
                                   before_block=out.flush)
        exporter.write_all(islice(entries, args.limit) if args.limit else entries)
        out.flush()
    except BrokenPipeError:
        # The reader went away (`export.py | head`): stop quietly, as cat does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return cli.EXIT_OK
    except OSError as exc:
        print(f"error: writing {destination} failed: {exc}", file=sys.stderr)
        return cli.EXIT_PARTIAL
    except KeyboardInterrupt:
        if not args.follow:
            raise
        logger.info("follow stopped")
    finally:
        logger.info("exported %d records (%s) to %s; last id %s", exporter.count, args.format,
                    destination, exporter.last_id or "-")
    return cli.EXIT_OK


def export_main(settings: Settings, argv: list[str] | None = None,
                prog: str | None = None) -> int:
    """``export.py`` / ``scrape-fleet export``."""
    args = export_args(argv, prog)
    store = ResultStore(connect_redis(settings), settings.results_maxlen)
    if args.follow:
        # docker stop / kill end a follower the way Ctrl-C does: output flushed, summary logged.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.output in (None, "-"):
        return export(args, store, sys.stdout, "stdout")
    try:
        handle = open(args.output, "w", encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as exc:
        print(f"error: cannot open --output {args.output}: {exc}", file=sys.stderr)
        return cli.EXIT_CONFIG
    with handle:
        return export(args, store, handle, args.output)


def dlq_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="Dead-letter queue tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="show dead letters without removing them")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true", help="JSON lines, one per message")
    again = sub.add_parser("replay", help="send dead letters back through routing")
    again.add_argument("--reason", help="only messages with this reason (e.g. max_retries)")
    again.add_argument("--limit", type=int, default=None)
    purge = sub.add_parser("purge", help="delete every dead letter")
    purge.add_argument("--yes", action="store_true", help="really purge")
    return parser.parse_args(argv)


def dlq_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``dlq.py`` / ``scrape-fleet dlq``."""
    args = dlq_args(argv, prog)
    connection = connect_rabbitmq(settings)
    try:
        if args.command == "list":
            letters = dlq.browse(connection, args.limit)
            if args.json:
                if letters:
                    print(dlq.to_json_lines(letters))
                return cli.EXIT_OK
            for letter in letters:
                h = letter.as_dict()
                line = (f"{letter.reason:<20} attempts={h.get('attempts', 0)} "
                        f"status={h.get('last_status', '-')} {letter.url}  "
                        f"{h.get('last_error', '')}")
                print(cli.escape_controls(line))  # URLs and errors came from outside
            print(f"{len(letters)} shown; by reason: {dlq.count_by_reason(letters)}")
            return cli.EXIT_OK
        if args.command == "replay":
            summary = dlq.replay(settings, connection, connect_redis(settings),
                                 reason=args.reason, limit=args.limit)
            print(f"replayed={summary.matched} unreplayable={summary.skipped_unreplayable} "
                  f"{summary.produced.line()}")
            return cli.EXIT_PARTIAL if summary.produced.failed else cli.EXIT_OK
        if not args.yes:
            print("purge deletes every dead letter: add --yes")
            return cli.EXIT_CONFIG
        print(f"purged {dlq.purge(connection)} dead letters")
        return cli.EXIT_OK
    finally:
        if connection.is_open:
            connection.close()
