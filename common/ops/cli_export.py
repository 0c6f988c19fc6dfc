"""``export`` (export.py / ``scrape-fleet export``): the results as JSON Lines or CSV, read from
where they are complete, and a line on stderr saying where that was.

- **The files sink's parts**, through Redis: ``--sink-dir DIR``, else ``SINK_DIR`` when it is
  set and holds parts (local mode's fleet.env and compose's ``tools`` set it). A files sink
  trims the ``results`` stream to what it has not written yet, so the parts are where every
  result is: :func:`~common.ops.export_files.read_through_files` waits until the sink has
  written everything recorded so far, then reads them. When no sink of that name
  (``--sink-name``) reads the stream, the stream is read instead, and the line says so.
- **The parts alone**, without Redis (``--files-only``): what the sink has written. What
  ``scrape-fleet export`` does when the local fleet is down (its ``down`` waits until the
  sink has written every result).
- **The stream**, otherwise, and always with ``--follow``.

Whichever the source, the records are one job's: ``--job NAME`` (every run, or ``--run N``),
else the default job's (the records without a job). A job's parts are in
``SINK_DIR/jobs/NAME/run-N/``, the default job's in SINK_DIR itself.

Each ``*_main`` is a command of common/ops/console.py and the body of its root script.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import TextIO

from common.core.config import Settings
from common.ops import cli
from common.ops.export import (
    FORMATS,
    Entry,
    Exporter,
    of_job,
    parse_job,
    parse_stream_id,
    read_entries,
    since_to_stream_id,
)
from common.ops.export_files import (
    file_entries,
    holds_parts,
    parse_id,
    read_through_files,
    sink_reads,
)
from common.store.connection import connect_redis
from common.store.keys import RESULTS_STREAM
from common.store.results import ResultStore

logger = logging.getLogger(__name__)


def export_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog, description="Export the results as JSON Lines or CSV: from the files "
                               "sink's parts when SINK_DIR (or --sink-dir) holds them, else "
                               "from the Redis stream; stderr says which.")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="default: jsonl")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write to FILE (replaced) instead of stdout")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from", dest="from_id", type=cli.argument(parse_stream_id),
                       metavar="STREAM_ID", help="first stream id, inclusive (MS-SEQ or MS)")
    start.add_argument("--since", type=cli.argument(since_to_stream_id), metavar="TIME",
                       help="first time: ISO 8601 (no offset = UTC) or Unix epoch seconds")
    parser.add_argument("--limit", type=cli.positive_int, metavar="N", help="stop after N records")
    parser.add_argument("--job", type=cli.argument(parse_job), metavar="NAME",
                        help="export that job's records (default: the default job's, the "
                             "records without a job)")
    parser.add_argument("--run", type=cli.positive_int, metavar="N",
                        help="only run N of --job (default: every run, in order)")
    parser.add_argument("--follow", action="store_true",
                        help="after the backlog, keep exporting new records until stopped "
                             "(reads the stream)")
    parser.add_argument("--sink-dir", metavar="DIR", type=Path,
                        help="read the results from the files sink writing to DIR (once it has "
                             "written everything recorded so far) instead of the stream, which "
                             "it trims (default: SINK_DIR, when set and holding parts)")
    parser.add_argument("--sink-name", default="files", metavar="NAME",
                        help="that sink's registered name (default files)")
    parser.add_argument("--files-only", action="store_true",
                        help="read the parts alone, without Redis: what the sink has written "
                             "(scrape-fleet export does so when the local fleet is down)")
    args = parser.parse_args(argv)
    if args.sink_dir is not None and not args.sink_dir.is_dir():
        parser.error(f"argument --sink-dir: no such directory: {args.sink_dir}")
    if args.follow and (args.sink_dir is not None or args.files_only):
        parser.error("argument --follow: reads the stream, not the sink's parts (the files "
                     "sink trims the stream: read its files with zcat instead)")
    if args.run is not None and args.job is None:
        parser.error("argument --run: needs --job NAME (the default job has no runs)")
    args.start = args.from_id or args.since or "-"
    if args.output not in (None, "-") and not Path(args.output).resolve().parent.is_dir():
        parser.error(f"argument --output: no such directory: {Path(args.output).parent}")
    return args


def parts_dir(args: argparse.Namespace, settings: Settings,
              environ: Mapping[str, str]) -> Path | None:
    """The files sink's directory to read: ``--sink-dir``, else ``SINK_DIR`` when it is set
    (not the default ``results`` of whatever directory this runs in) and holds parts (of any
    job)."""
    if args.sink_dir is not None:
        return Path(args.sink_dir)
    if environ.get("SINK_DIR") and holds_parts(Path(settings.sink_dir)):
        return Path(settings.sink_dir)
    return None


def export_main(settings: Settings, argv: list[str] | None = None,
                prog: str | None = None) -> int:
    """``export.py`` / ``scrape-fleet export``."""
    args = export_args(argv, prog)
    directory = parts_dir(args, settings, os.environ)
    if args.files_only:
        if directory is None:
            print("error: --files-only needs the files sink's parts: --sink-dir DIR, or "
                  "SINK_DIR set to a directory holding them", file=sys.stderr)
            return cli.EXIT_CONFIG
        _say(f"from the files sink's parts in {directory} alone, without Redis: every result "
             f"the sink has written{_which(args)}")
        begin = (0, 0) if args.start == "-" else parse_id(args.start)
        return _to_output(args, lambda _out: file_entries(directory, begin, args.job, args.run))
    store = ResultStore(connect_redis(settings), settings.results_maxlen)
    if args.follow:
        # docker stop / kill end a follower the way Ctrl-C does: output flushed, summary logged.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        _say(f"from the Redis stream `{RESULTS_STREAM}` (--follow reads the stream"
             + (f"; {directory} is not read)" if directory else ")") + _which(args))
    elif directory is not None and sink_reads(store.client, args.sink_name):
        _say(f"from the files sink's parts in {directory}, once the sink ({args.sink_name}) "
             f"has written every result recorded so far{_which(args)}")
        return _to_output(args, lambda _out: read_through_files(
            store, directory, args.start, sink_name=args.sink_name, job=args.job, run=args.run))
    elif directory is not None:
        _say(f"from the Redis stream `{RESULTS_STREAM}`: no sink named {args.sink_name!r} "
             f"reads it, so {directory} is not read{_which(args)}")
    else:
        _say(f"from the Redis stream `{RESULTS_STREAM}`{_which(args)}")
    return _to_output(args, lambda out: read_entries(store, args.start, follow=args.follow,
                                                     before_block=out.flush))


def _say(text: str) -> None:
    print(f"export: {text}", file=sys.stderr, flush=True)


def _which(args: argparse.Namespace) -> str:
    if args.job is None:
        return "; the default job's records (--job NAME for a job's)"
    return f"; job {args.job}, " + (f"run {args.run}" if args.run else "every run")


#: The records to write, given the stream they go to (a follower flushes it before waiting).
Source = Callable[[TextIO], Iterable[Entry]]


def _to_output(args: argparse.Namespace, source: Source) -> int:
    """Export the selected job's records of ``source`` (a job's folders hold only its records;
    the stream holds every job's) to ``--output`` or stdout."""
    if args.output in (None, "-"):
        return export(args, of_job(source(sys.stdout), args.job, args.run), sys.stdout,
                      "stdout")
    try:
        handle = open(args.output, "w", encoding="utf-8", newline="")  # noqa: SIM115
    except OSError as exc:
        print(f"error: cannot open --output {args.output}: {exc}", file=sys.stderr)
        return cli.EXIT_CONFIG
    with handle:
        return export(args, of_job(source(handle), args.job, args.run), handle, args.output)


def export(args: argparse.Namespace, entries: Iterable[Entry], out: TextIO,
           destination: str) -> int:
    """Write the selected records to ``out``; returns the exit code."""
    exporter = Exporter(out, args.format)
    try:
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
