"""The long-running commands: ``work`` (worker.py) and ``sink`` (sink.py).

Each ``*_main`` is a command of common/ops/console.py and the body of its root script.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from common.core.config import Settings
from common.ops import cli
from common.sink.files import FileSink
from common.sink.reader import Sink, SinkReader, retire, run_sink
from common.store.connection import connect_redis
from common.work.loop_redis import worker_client
from common.work.processor import Processor
from common.work.worker import Worker

logger = logging.getLogger(__name__)


def work_args(settings: Settings, argv: list[str] | None = None,
              prog: str | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog=prog, description="Run one scraper worker.")
    parser.add_argument("--concurrency", type=int, default=settings.concurrency,
                        help=f"parallel fetches (default {settings.concurrency})")
    parser.add_argument("--idle-exit", type=float, default=settings.idle_exit_s, metavar="SECONDS",
                        help="exit 0 after this long without a message (0 = never)")
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error("--concurrency must be >= 1")
    if args.idle_exit < 0:
        parser.error("--idle-exit must be >= 0")
    return settings.with_overrides(concurrency=args.concurrency, idle_exit_s=args.idle_exit)


def work_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``worker.py`` / ``scrape-fleet work``."""
    settings = work_args(settings, argv, prog)
    redis_client = worker_client(settings)  # replies read through the fetch loop
    processor = Processor(settings, redis_client)
    worker = Worker(settings, processor)
    worker.install_signal_handlers()
    return worker.run()


def sink_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="Run a result sink, or retire one.")
    commands = parser.add_subparsers(dest="command", required=True)
    files = commands.add_parser("files", help="rotating gzip JSON Lines files")
    files.add_argument("--dir", metavar="DIR", help="directory of the parts (default SINK_DIR)")
    postgres = commands.add_parser("postgres", help="upsert into PostgreSQL (POSTGRES_URL)")
    for sub in (files, postgres):
        sub.add_argument("--name", help=f"registered name (default {sub.prog.split()[-1]})")
        sub.add_argument("--idle-exit", type=cli.argument(_non_negative), default=0.0,
                         metavar="SECONDS", help="exit 0 after SECONDS with nothing new")
    gone = commands.add_parser("retire", help="unregister a sink (stop its process first)")
    gone.add_argument("name", help="the sink's registered name")
    return parser.parse_args(argv)


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"expected seconds >= 0, got {text!r}")
    return value


def make_sink(args: argparse.Namespace, settings: Settings) -> Sink:
    if args.command == "files":
        return FileSink(args.dir or settings.sink_dir, settings.sink_rotate_bytes,
                        settings.sink_rotate_s, name=args.name or "files")
    if not settings.postgres_url:
        raise ValueError("POSTGRES_URL is not set")
    from common.sink.postgres import PostgresSink  # psycopg only where it is used

    return PostgresSink(settings.postgres_url, settings.postgres_table,
                        name=args.name or "postgres")


def sink_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``sink.py`` / ``scrape-fleet sink``."""
    args = sink_args(argv, prog)
    client = connect_redis(settings)
    if args.command == "retire":
        if not retire(client, args.name):
            print(f"no sink named {args.name!r}", file=sys.stderr)
            return cli.EXIT_PARTIAL
        print(f"retired sink {args.name!r}: unregistered, consumer groups destroyed")
        return cli.EXIT_OK
    try:
        sink = make_sink(args, settings)
    except ValueError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return cli.EXIT_CONFIG
    except OSError as exc:
        print(f"error: the files sink cannot use its directory: {exc}", file=sys.stderr)
        return cli.EXIT_CONFIG
    except Exception as exc:  # noqa: BLE001 - the store's own error (psycopg), password-free
        print(f"error: the {args.command} sink cannot start: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return cli.EXIT_UNAVAILABLE
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    reader = SinkReader(client, sink.name, consumer=sink.name, batch=settings.sink_batch)
    return run_sink(reader, sink, stop, idle_exit_s=args.idle_exit)
