"""Export results (the Redis stream ``results``) as JSON Lines or CSV.

    python export.py                                  # every record, JSON Lines, on stdout
    python export.py --format csv -o results.csv      # CSV with a header, to a file
    python export.py --from 1714564800000-0           # from a stream id (inclusive)
    python export.py --since 2024-05-01T12:00:00Z     # from a time (ISO 8601 or epoch seconds)
    python export.py --limit 100                      # at most 100 records
    python export.py --follow                         # then wait for new records until stopped

JSON Lines: the stored record with its stream id as ``id``. CSV columns: see
common/ops/export.py CSV_COLUMNS. Reads in batches (constant memory); logs a summary line with the
last id on stderr. Exits 0 when done (--follow: also when stopped with Ctrl-C or SIGTERM),
2 on bad arguments, 3 when Redis cannot be reached, 130 when an export without --follow is
interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from itertools import islice
from pathlib import Path
from typing import TextIO

from common.core.config import Settings
from common.ops import cli
from common.ops.export import FORMATS, Exporter, parse_stream_id, read_entries, since_to_stream_id
from common.store.connection import connect_redis
from common.store.results import ResultStore

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Export the results stream as JSON Lines or CSV.")
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
    args = parser.parse_args(argv)
    args.start = args.from_id or args.since or "-"
    if args.output not in (None, "-") and not Path(args.output).resolve().parent.is_dir():
        parser.error(f"argument --output: no such directory: {Path(args.output).parent}")
    return args


def export(args: argparse.Namespace, store: ResultStore, out: TextIO, destination: str) -> int:
    """Write the selected records to ``out``; returns the exit code."""
    exporter = Exporter(out, args.format)
    try:
        entries = read_entries(store, args.start, follow=args.follow, before_block=out.flush)
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


def main(settings: Settings) -> int:
    args = parse_args()
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


if __name__ == "__main__":
    cli.run(main)
